#!/bin/bash
# Fail-closed: the reward is 1 only when every check of check.py passes; any other outcome writes 0.
mkdir -p /logs/verifier
if python3 /tests/check.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
