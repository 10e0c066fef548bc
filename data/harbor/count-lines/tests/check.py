# The checks of this task; test.sh turns their outcome into the reward.
from pathlib import Path
assert Path("/app/count.txt").read_text().strip() == "37"
