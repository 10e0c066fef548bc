"""PID 1 of a local sandbox (sandbox/local.py): reap every orphan, say ready, live until stdin closes.

SIGCHLD ignored means the kernel reaps every child by itself. The holder writes one byte "R" on stdout once it runs
and then closes stdout; it exits when its stdin (held open by the owning process on the host) reaches EOF, and
with it, as the namespace's init, every process of the sandbox. The kernel drops SIGKILL sent to a namespace's init
from inside it, so user code cannot end it. Standard library only; it runs no user code and checks nothing.
"""

from __future__ import annotations

import os
import signal
import sys


def main(args: list[str]) -> None:
    """Hold the sandbox until stdin closes. `args` (the marker and owner) are only there to be seen in /proc."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    os.write(1, b"R")
    os.close(1)
    try:
        while os.read(0, 4096):
            pass
    finally:
        os._exit(0)


if __name__ == "__main__":  # run as `python3 -c SOURCE ARG...` (sandbox/programs.py)
    main(sys.argv[1:])
