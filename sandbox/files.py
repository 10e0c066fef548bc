"""Writing files into a sandbox's /workspace: the one program every backend runs inside the sandbox to do it.

`write_files(run, python, files, timeout_s)` sends {relative path: text} as JSON on the stdin of the in-sandbox
writer (sandbox/guest/write.py: what it refuses and how it writes), run by the backend's own `exec` (so as the
sandbox user, with the call's limits). Any refusal or failure raises SandboxError with the program's stderr.
This module starts no sandbox.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from sandbox import programs
from sandbox.result import ExecResult, SandboxError


def write_files(run: Callable[[list[str], float, bytes], ExecResult], python: str, files: dict[str, str],
                timeout_s: float) -> None:
    """Write `files` under /workspace through `run(argv, timeout_s, stdin)` (the backend's exec) with the sandbox's
    `python`; raises SandboxError when the program refuses a path or fails."""
    if not files:
        return
    payload = json.dumps(files).encode()
    res = run(programs.command(python, "write", str(len(payload))), max(timeout_s, 10.0), payload)
    if res.verdict != "ok":
        raise SandboxError(f"writing {len(files)} file(s) into the sandbox failed ({res.verdict}): "
                           f"{(res.error or res.stderr)[-500:]}")
