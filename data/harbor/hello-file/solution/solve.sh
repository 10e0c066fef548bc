#!/bin/bash
set -euo pipefail
printf "Hello, world!\n" > /app/hello.txt
