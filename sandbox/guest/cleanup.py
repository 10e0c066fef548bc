"""Kill the processes a call left behind in a Docker sandbox (forks, daemons): every process but PID 1, this one, its
parent (the `timeout` wrapper) and the pids given.

Run by sandbox/docker.py as `timeout -s KILL 5 python3 -S -c BOOT sandbox.guest.cleanup ... PID...` after a call
that hit the pids limit, flooded or hung; the pids are the interpreter's and its keeper's inside the container
("0": none). Three passes, so a fork racing the first scan is caught by the next. Standard library only, plus
sandbox/procfs.py; it does not wait for the killed processes (PID 1 reaps them).
"""

from __future__ import annotations

import os
import signal

from sandbox import procfs


def main(args: list[str]) -> None:
    """SIGKILL every process but PID 1, this one, its parent and the pids in `args`."""
    spare = {1, os.getpid(), os.getppid(), *map(int, args)}
    for _ in range(3):
        for pid in procfs.pids():
            if pid not in spare:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
