"""The guard of `flywheel serve`'s flow runs: they run in sessions of their own, so a killed `serve` would leave
them running; a guard process kills them once `serve` is gone, however it died.

`guard_children` marks the calling process's future children (FLYWHEEL_DIE_WITH=PID-STARTTIME in their
environment) and starts the guard, `python -m flows.child_guard PID-STARTTIME`, which waits until that process is
gone and then SIGKILLs every process carrying the mark (and the process groups they lead). It kills nothing else
and knows nothing of Prefect.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from flows.prefect_home import alive, pythonpath_with_repo, self_id
from sandbox.procfs import pids

_spawned_guard: list[subprocess.Popen] = []  # detached: never waited for; kept so that Popen's destructor is quiet


def guard_children() -> str:
    """Mark this process's future children (FLYWHEEL_DIE_WITH=PID-STARTTIME in the environment) and start a guard
    that, once this process is gone however it died, SIGKILLs every process carrying the mark: the flow runs that
    `flywheel serve` starts in sessions of their own do not outlive it. Returns the mark."""
    ident = self_id()
    os.environ["FLYWHEEL_DIE_WITH"] = ident
    env = {k: v for k, v in os.environ.items() if k != "FLYWHEEL_DIE_WITH"}
    env["PYTHONPATH"] = pythonpath_with_repo(os.environ.get("PYTHONPATH"))
    _spawned_guard.append(subprocess.Popen([sys.executable, "-m", "flows.child_guard", ident], env=env,
                                           stdin=subprocess.DEVNULL, start_new_session=True))
    return ident


def _marked(ident: str) -> list[int]:
    mark = f"FLYWHEEL_DIE_WITH={ident}".encode()
    out = []
    for pid in pids():
        if pid != os.getpid():
            try:
                if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    out.append(pid)
            except OSError:
                continue
    return out


def guard(ident: str) -> None:
    """The guard process of `guard_children`: wait until PID-STARTTIME is gone, then kill the marked processes (and
    the process groups they lead) until none is left."""
    while alive(ident):
        time.sleep(0.5)
    for _ in range(20):
        marked = _marked(ident)
        if not marked:
            return
        for pid in marked:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGKILL)
        time.sleep(0.25)


if __name__ == "__main__":  # python -m flows.child_guard PID-STARTTIME
    guard(sys.argv[1])
