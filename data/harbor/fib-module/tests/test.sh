#!/bin/bash
# Partial credit: the fraction of checks passed goes to reward.json; a crash before that leaves no file (reward 0).
mkdir -p /logs/verifier
python3 - <<'EOF'
import json, sys
sys.path.insert(0, "/app")
cases = [(0, 0), (1, 1), (2, 1), (10, 55), (30, 832040), (90, 2880067194370816120),
         (300, 222232244629420445529739893461909967206666939096499764990979600)]
ok = 0
try:
    from fib import fib
    for n, want in cases:
        try:
            ok += fib(n) == want
        except Exception:
            pass
except Exception as e:
    print("import failed:", e)
json.dump({"reward": ok / len(cases), "passed": ok, "total": len(cases)}, open("/logs/verifier/reward.json", "w"))
print(f"{ok}/{len(cases)} checks passed")
EOF
