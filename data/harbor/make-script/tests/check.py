# The checks of this task; test.sh turns their outcome into the reward.
import os, subprocess
assert os.access("/app/run.sh", os.X_OK), "run.sh is not executable"
r = subprocess.run(["/app/run.sh"], capture_output=True, text=True, timeout=10)
assert r.returncode == 0 and r.stdout.strip() == "ok", r
