# The checks of this task; test.sh turns their outcome into the reward.
from pathlib import Path
got = Path("/app/sorted.txt").read_text().split()
assert got == [str(x) for x in sorted([42, -7, 100, 3, 17, 0, 256, 9, -31, 64, 5, 11])], got
