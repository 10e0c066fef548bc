#!/bin/bash
set -euo pipefail
awk '!seen[$0]++' /app/emails.txt > /app/unique.txt
