# The checks of this task; test.sh turns their outcome into the reward.
import subprocess
for name in ("Ann", "Bo", "Zoë"):
    out = subprocess.run(["python3", "/app/greet.py", name], capture_output=True, text=True, timeout=10).stdout
    assert out == f"Hello, {name}!\n", (name, out)
