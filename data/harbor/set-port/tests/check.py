# The checks of this task; test.sh turns their outcome into the reward.
from pathlib import Path
assert Path("/app/server.ini").read_text() == "[http]\nhost = 0.0.0.0\nport = 8080\n\n[admin]\nport = 9000\n"
