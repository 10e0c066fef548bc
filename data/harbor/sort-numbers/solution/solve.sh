#!/bin/bash
set -euo pipefail
sort -n /app/numbers.txt > /app/sorted.txt
