"""The zygote of a local sandbox: a pristine process that never runs user code, forks each episode's interpreter and
resets the sandbox between two episodes. It runs inside the sandbox (one per sandbox); the host side is
`LocalSandbox` (sandbox/local.py).

It forks each episode's interpreter (a copy of itself running sandbox/guest/kernel.py, so an interpreter costs a fork
instead of a Python start-up) and, between two episodes of a reused sandbox, kills every other process and runs the
one reset check (sandbox/guest/reset.py). It trusts no state that user code can touch:
- it is non-dumpable, so processes of the same uid (every process of the sandbox) cannot ptrace it or read or
  write its memory through /proc; a signal can kill or stop it, and the host then sees it gone or silent and
  destroys the sandbox;
- it imports everything it needs before the first interpreter exists, and never imports from /workspace;
- its control channel is a unix socket (fd 0 at start) that no interpreter inherits.
Requests, one datagram each (SOCK_SEQPACKET), JSON:
  {"op": "spawn"} + 3 fds (stdin, stdout, stderr of the new interpreter) -> {"pid": pid in the sandbox}
  {"op": "kill", "pid": n} -> {"status": exit status as in subprocess, null when not our child}
  {"op": "reset"} -> {"ok": bool, "why": str}: SIGKILL every other process of the sandbox (PID 1 excepted), wait
      until /proc shows only PID 1 and the zygote, then the reset check: RESET_DIRS emptied, with the mode, owner and
      extended attributes they had at start; no process, no System V IPC object; /dev/mqueue, the writable mounts
      and /proc/keys as at start. POSIX message queues are also refused by the backend's RLIMIT_MSGQUEUE of 0.
Standard library only, plus sandbox/procfs.py and the other guest modules. It starts no sandbox.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from sandbox import procfs
from sandbox.guest import kernel, reset
from sandbox.guest.reset import RESET_DIRS

RESET_WAIT_S = 2.0


class _Zygote:
    def __init__(self) -> None:
        import ast  # noqa: F401 - imported now, so that no interpreter (and no reset) imports after user code ran
        import ctypes
        import linecache  # noqa: F401
        import socket
        import stat  # noqa: F401
        import traceback  # noqa: F401

        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no ptrace, no /proc/<pid>/mem for same-uid processes
        self.ctl = socket.socket(fileno=os.dup(0))  # os.dup: not inherited by the interpreters
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.close(devnull)
        while "" in sys.path:  # the zygote imports nothing more, and never from the workspace
            sys.path.remove("")
        self.pid = os.getpid()
        self.recv_fds = socket.recv_fds
        self.baseline = reset.state(RESET_DIRS)

    def _reap(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def spawn(self, fds: list[int]) -> dict[str, Any]:
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            return {"error": f"spawn needs 3 file descriptors, got {len(fds)}"}
        pid = os.fork()
        if pid == 0:  # the episode's interpreter
            # No death signal tied to the zygote: user code can kill the zygote (`os.kill(-1, SIGKILL)`), and the
            # cell that did so must still finish and answer, as on Docker. The backend kills an orphaned
            # interpreter itself (the zygote's `kill` failing means: kill every process of the sandbox).
            try:
                self.libc.prctl(4, 1, 0, 0, 0)  # dumpable again: user code reads its own /proc/self as usual
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                os.closerange(3, 1 << 16)
                sys.path.insert(0, "")
                sys.argv[:] = ["-c"]
                kernel.main([])
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        return {"pid": pid}

    @staticmethod
    def kill(pid: int) -> dict[str, Any]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return {"status": None}
        return {"status": os.waitstatus_to_exitcode(status)}

    def reset(self) -> dict[str, Any]:
        deadline = time.monotonic() + RESET_WAIT_S
        while True:
            try:
                os.kill(-1, signal.SIGKILL)  # every process we may signal (all of the sandbox's), but PID 1 and us
            except ProcessLookupError:
                pass
            self._reap()
            others = [p for p in procfs.pids() if p not in (1, self.pid)]
            if not others:
                break
            if time.monotonic() > deadline:
                return {"ok": False, "why": f"processes survived the reset: {others[:8]}"}
            time.sleep(0.001)
        problems = reset.check(RESET_DIRS, self.baseline)
        return {"ok": not problems, "why": "; ".join(problems)}

    def serve(self) -> None:
        self.ctl.send(json.dumps({"ready": True, "pid": self.pid}).encode())
        while True:
            try:
                data, fds, _, _ = self.recv_fds(self.ctl, 65536, 8)
            except OSError:
                return
            if not data:
                return
            try:
                req = json.loads(data)
                op = req["op"]
                if op == "spawn":
                    reply = self.spawn(list(fds))
                elif op == "kill":
                    reply = self.kill(int(req["pid"]))
                elif op == "reset":
                    reply = self.reset()
                else:
                    reply = {"error": f"unknown op {op!r}"}
            except (ValueError, KeyError, TypeError) as e:
                reply = {"error": f"bad request: {e}"}
            self.ctl.send(json.dumps(reply).encode())


def main(args: list[str]) -> None:
    """Serve the host's requests on the socket at fd 0 until it closes."""
    _Zygote().serve()
