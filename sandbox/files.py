"""Writing files into a sandbox's /workspace: the one program every backend runs inside the sandbox to do it.

`write_files(run, python, files, timeout_s)` sends {relative path: text} as JSON on the stdin of WRITE_SOURCE,
run by the backend's own `exec` (so as the sandbox user, with the call's limits). The program refuses a path
outside the workspace and a path whose parent folder goes through a symlink (the sandbox's code may have planted
one), creates parents, and replaces a file or symlink at the path itself instead of writing through it
(O_NOFOLLOW | O_EXCL after an unlink). Any refusal or failure raises SandboxError with the program's stderr.
This module starts no sandbox.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from sandbox.result import ExecResult, SandboxError

# argv[1] is the payload's length: stdin is read exactly that far (a Docker exec's stdin may stay open).
WRITE_SOURCE = r"""
import json, os, sys
files = json.loads(sys.stdin.buffer.read(int(sys.argv[1])))
root = os.path.realpath(os.getcwd())
for rel, text in files.items():
    path = os.path.normpath(os.path.join(root, rel))
    if not path.startswith(root + os.sep):
        print(f"refusing path outside the workspace: {rel!r}", file=sys.stderr); sys.exit(2)
    parent = os.path.dirname(path)
    if os.path.realpath(parent) != parent:
        print(f"refusing path through a symlink: {rel!r}", file=sys.stderr); sys.exit(2)
    os.makedirs(parent, exist_ok=True)
    try: os.unlink(path)
    except FileNotFoundError: pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f: f.write(text)
"""


def write_files(run: Callable[[list[str], float, bytes], ExecResult], python: str, files: dict[str, str],
                timeout_s: float) -> None:
    """Write `files` under /workspace through `run(argv, timeout_s, stdin)` (the backend's exec) with the sandbox's
    `python`; raises SandboxError when the program refuses a path or fails."""
    if not files:
        return
    payload = json.dumps(files).encode()
    res = run([python, "-S", "-c", WRITE_SOURCE, str(len(payload))], max(timeout_s, 10.0), payload)
    if res.verdict != "ok":
        raise SandboxError(f"writing {len(files)} file(s) into the sandbox failed ({res.verdict}): "
                           f"{(res.error or res.stderr)[-500:]}")
