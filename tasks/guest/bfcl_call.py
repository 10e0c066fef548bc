"""One call of a BFCL task's API, INSIDE the episode's sandbox, in a fresh process: the API instances from the state
file (first call: BFCL makes them from initial_config), BFCL's own execute_multi_turn_func_call on the call string
read from stdin, the instances written back to the state file (through a temporary name). Prints one line
`MARKER "result"` (BFCL's string).

Sent by tasks.bfcl.run_call as `python3 -I -c SOURCE MARKER STATE_FILE ENTRY_FILE`. Nothing here is imported on
the host; it imports the standard library and the wheel's modules written into the working folder.
"""

import json
import os
import pickle
import sys

sys.path.insert(0, os.getcwd())
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils as u

with open(sys.argv[3]) as f:
    e = json.load(f)
g = vars(u)
if os.path.exists(sys.argv[2]):
    with open(sys.argv[2], "rb") as f:
        g.update(pickle.load(f))
res, _ = u.execute_multi_turn_func_call([sys.stdin.read()], e["initial_config"], e["involved_classes"], "flywheel",
                                        e["id"])
with open(sys.argv[2] + ".tmp", "wb") as f:
    pickle.dump({k: v for k, v in g.items() if k.startswith("flywheel_") and k.endswith("_instance")}, f)
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
print(sys.argv[1], json.dumps(res[0]))
