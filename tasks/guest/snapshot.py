"""The workspace snapshot, INSIDE the episode's sandbox (standard library only): every file under the current
folder (symlinks not followed, at most 2,000 entries, __pycache__ skipped) as its SHA-256, size and, when small
enough and UTF-8, its text; a symlink as its target. Prints one line `__FLYWHEEL_SNAPSHOT__ {json}`.

Sent by tasks.tools.workspace_snapshot as `python3 -I -c SOURCE TEXT_LIMIT SOURCE_LIMIT` (the text limits for other
files and for Python sources). Nothing here is imported on the host.
"""

import hashlib
import json
import os
import sys

limit, source_limit = int(sys.argv[1]), int(sys.argv[2])
out = {}
n = 0
for root, dirs, files in os.walk(".", followlinks=False):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    for fn in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
        p = os.path.join(root, fn)
        rel = os.path.relpath(p, ".")
        n += 1
        if n > 2000:
            break
        if os.path.islink(p):
            out[rel] = {"symlink": os.readlink(p)}
            continue
        try:
            with open(p, "rb") as f:
                b = f.read(8 * 1024 * 1024)
        except OSError:
            out[rel] = {"sha256": None, "size": 0}
            continue
        st = {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)}
        if len(b) <= (source_limit if fn.endswith(".py") else limit):
            try:
                st["text"] = b.decode("utf-8")
            except UnicodeDecodeError:
                pass
        out[rel] = st
print("__FLYWHEEL_SNAPSHOT__ " + json.dumps(out))
