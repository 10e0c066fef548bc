#!/bin/bash
set -euo pipefail
printf '#!/bin/sh\necho ok\n' > /app/run.sh
chmod +x /app/run.sh
