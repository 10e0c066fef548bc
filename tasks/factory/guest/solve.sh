#!/bin/bash
set -euo pipefail
python3 /solution/ledger_solve.py /solution/params.json
