#!/bin/bash
set -euo pipefail
python3 -c "import re,collections; w=re.findall('[a-z]+', open('/app/text.txt').read().lower()); print(collections.Counter(w).most_common(1)[0][0])" > /app/top.txt
