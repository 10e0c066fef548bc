# The checks of this task; test.sh turns their outcome into the reward.
from pathlib import Path
assert Path("/app/active.txt").read_text().split() == ["ada", "chen", "emil", "fay"]
