"""PID 1 of a Docker sandbox (sandbox/docker.py, sandbox/taskenv.py): ignore every catchable signal, reap orphans, and
exit as soon as stdin reaches EOF (the owning process is gone, its attach socket closed).

The kernel drops SIGKILL and SIGSTOP sent to a namespace's init from inside it, so with every other signal ignored
user code cannot end it; it is not dumpable (processes of the same uid cannot ptrace it or read its /proc files).
Killed fork bombs and double-forked daemons are reaped at once, so they leave no zombies. Standard library only;
it runs no user code and checks nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time


def ignore_signals() -> None:
    """Ignore every signal that can be caught (SIGCHLD excepted: its default is already to ignore it, and a reaper
    may wait for it)."""
    for s in range(1, signal.NSIG):
        if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            try:
                signal.signal(s, signal.SIG_IGN)
            except (OSError, ValueError):
                pass


def _watch() -> None:
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    os._exit(0)


def main(args: list[str]) -> None:
    """Reap children until stdin closes."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except Exception:  # noqa: BLE001, S110 - an image without ctypes still gets a working PID 1
        pass
    ignore_signals()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # waited for below (the watcher inherits the mask)
    threading.Thread(target=_watch, daemon=True).start()
    while True:
        try:
            os.wait()
        except ChildProcessError:
            signal.sigtimedwait({signal.SIGCHLD}, 0.2)  # an orphan arrives: reap it at once
        except OSError:
            time.sleep(0.2)


if __name__ == "__main__":  # run as `python3 -c SOURCE ARG...` (sandbox/programs.py)
    main(sys.argv[1:])
