# The checks of this task; test.sh turns their outcome into the reward.
from pathlib import Path
p = Path("/app/hello.txt")
assert p.is_file(), "hello.txt is missing"
assert p.read_text() == "Hello, world!\n", repr(p.read_text())
