# The checks of this task; test.sh turns their outcome into the reward.
from pathlib import Path
assert Path("/app/top.txt").read_text().strip() == "the"
