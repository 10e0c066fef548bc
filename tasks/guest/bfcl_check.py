"""BFCL's own multi-turn checker on one episode, INSIDE a fresh sandbox: the checker's sources and the entry's API
classes (from the bfcl-eval wheel) and `bfcl_job.json` ({"entry", "model_turns"}) are in the working folder.
Prints one line `MARKER {valid, error_type, error_message}`.

Sent by tasks.bfcl.check_in_sandbox as `python3 -I -c SOURCE MARKER`. Nothing here is imported on the host; it
imports the standard library and the wheel's modules written beside it.
"""

import json
import os
import sys

sys.path.insert(0, os.getcwd())
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

with open("bfcl_job.json") as f:
    job = json.load(f)
e = job["entry"]
r = multi_turn_checker([[t] for t in job["model_turns"]], e["ground_truth"], e, e["id"].rsplit("_", 1)[0],
                       "flywheel")
print(sys.argv[1], json.dumps({k: r.get(k) for k in ("valid", "error_type", "error_message")}))
