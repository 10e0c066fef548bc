#!/bin/bash
# Fail-closed: the reward is 1 only when ledger_check.py exits 0; any other outcome writes 0.
mkdir -p /logs/verifier
if python3 /tests/ledger_check.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
