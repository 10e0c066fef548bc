# The checks of this task; test.sh turns their outcome into the reward.
from pathlib import Path
expected = sum(i * 13 % 97 for i in range(1, 26))
assert Path("/app/total.txt").read_text().strip() == str(expected)
