# The checks of this task; test.sh turns their outcome into the reward.
from pathlib import Path
assert Path("/app/unique.txt").read_text().split() == ["a@x.org", "b@x.org", "c@y.org", "d@z.org"]
