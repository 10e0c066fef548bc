"""The keeper of a reused Docker sandbox: one per container, it forks every episode's interpreter
(sandbox/guest/kernel.py) and relays the host's requests to it.

Started by sandbox/docker.py with `docker exec -i ... python3 -u -c BOOT sandbox.guest.keeper ... WORKDIR OOM_ADJ`
(the only exec of the container's life, while resets succeed). An interpreter costs a fork of the keeper instead of
a `docker exec` and a Python start-up. The interpreter writes to the exec's stdout itself (so a cell that kills the
keeper, `os.kill(-1, SIGKILL)`, still answers, as on a fresh container); the keeper relays the exec's stdin to it,
so the host talks to the interpreter exactly as to one started by its own exec. Lines on stdin starting with
{"keeper" are requests to the keeper itself, answered on stdout (after a newline, while no interpreter runs) with
the request's nonce, which user code never sees: "reset" kills and reaps the interpreter (the host then kills every
other process), "spawn" forks the next interpreter (its ready line follows the answer); a spawn with "check" (the
arguments of sandbox/guest/reset.py) has the child run the reset check first, its one JSON line before the ready line,
so a reset compiles nothing. The keeper never runs user code, imports nothing after start (what the interpreters
import lazily is imported up front), ignores signals and is not dumpable (no ptrace, no /proc memory or fds for the
sandbox user); the sandbox user can still kill or stop it, and the host then starts a new keeper with an exec, or
removes the container when the reset does not answer. When its interpreter dies during an episode the keeper exits
with the interpreter's status (seen through a pidfd), so the host sees the end of the stream as before.

Standard library only, plus the kernel, PID 1's signal rule and the reset check, which it never runs itself: only
a child does, before it becomes the interpreter.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import sys
import traceback

from sandbox.guest import kernel, pid1, reset

BUFFER_LIMIT = 1 << 24  # stdin the interpreter has not read yet: past this the keeper stops reading


class _Keeper:
    def __init__(self, workdir: str, adj: str) -> None:
        import ast  # noqa: F401 - the kernel's lazy imports, paid once here instead of by every forked interpreter
        import linecache  # noqa: F401

        self.libc = ctypes.CDLL(None)
        self.workdir, self.adj = workdir, adj
        self.child, self.to_child, self.child_fd = 0, -1, -1
        self.inbuf, self.childbuf = bytearray(), bytearray()

    def interpreter(self, r: int, check: list[str] | None) -> None:
        """In the forked child: (run the reset check with the arguments `check`, then) become the episode's
        interpreter, reading the pipe `r` as stdin."""
        code = 1
        try:
            os.dup2(r, 0)
            os.closerange(3, 1 << 16)
            for s in range(1, signal.NSIG):
                try:
                    signal.signal(s, signal.SIG_DFL)
                except (OSError, ValueError):
                    pass
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            self.libc.prctl(4, 1, 0, 0, 0)
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(self.adj)
            os.chdir(self.workdir)
            if check is not None:
                reset.main(check)  # its JSON line comes before the kernel's ready line
            kernel.main([])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - whatever broke the interpreter is printed, then the child exits
            traceback.print_exc()
        finally:
            for f in (sys.stdout, sys.stderr):
                try:
                    f.flush()
                except Exception:  # noqa: BLE001, S110 - exiting anyway
                    pass
            os._exit(code)

    @staticmethod
    def say(obj: dict, lead: bytes = b"\n") -> None:
        data = lead + json.dumps(obj).encode() + b"\n"
        while data:
            data = data[os.write(1, data) :]

    def spawn(self, check: list[str] | None) -> None:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            self.interpreter(r, check)
        os.close(r)
        os.set_blocking(w, False)
        self.child, self.to_child, self.child_fd = pid, w, os.pidfd_open(pid)

    def drop(self) -> None:
        if self.child:
            try:
                os.kill(self.child, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.waitpid(self.child, 0)
            except ChildProcessError:
                pass
        for fd in (self.to_child, self.child_fd):
            if fd >= 0:
                os.close(fd)
        self.child, self.to_child, self.child_fd = 0, -1, -1
        self.childbuf.clear()

    def control(self, line: bytes) -> None:
        req = json.loads(line)
        reply = {"keeper": req["nonce"]}
        if req["keeper"] == "reset":
            self.drop()
            self.say(reply)
        elif req["keeper"] == "spawn":
            self.drop()
            self.say(reply)  # before the interpreter exists: its lines follow on the same stdout
            check = req.get("check")
            self.spawn([str(a) for a in check] if isinstance(check, list) else None)
        else:
            self.say({**reply, "error": "unknown request"})

    def _stdin(self, ev: int) -> None:
        data = os.read(0, 1 << 20) if ev & (select.POLLIN | select.POLLHUP) else b""
        if not data:
            os._exit(0)
        self.inbuf.extend(data)
        while True:
            nl = self.inbuf.find(b"\n")
            if nl < 0:
                break
            line = bytes(self.inbuf[: nl + 1])
            del self.inbuf[: nl + 1]
            if line.startswith(b'{"keeper"'):
                self.control(line)
            elif self.to_child >= 0:
                self.childbuf.extend(line)

    def serve(self) -> None:
        os.set_blocking(0, False)
        self.say({"keeper": "hello", "pid": os.getpid()}, b"")
        while True:
            want = {0: select.POLLIN} if len(self.childbuf) < BUFFER_LIMIT else {}
            if self.child_fd >= 0:
                want[self.child_fd] = select.POLLIN
            if self.childbuf and self.to_child >= 0:
                want[self.to_child] = select.POLLOUT
            poller = select.poll()
            for fd, ev in want.items():
                poller.register(fd, ev)
            for fd, ev in poller.poll():
                if fd == 0:
                    self._stdin(ev)
                elif fd == self.child_fd:
                    _, status = os.waitpid(self.child, 0)
                    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
                elif fd == self.to_child:
                    try:
                        del self.childbuf[: os.write(self.to_child, self.childbuf)]
                    except BlockingIOError:
                        pass
                    except BrokenPipeError:
                        self.childbuf.clear()


def main(args: list[str]) -> None:
    """`WORKDIR OOM_ADJ`: where each interpreter runs and the oom_score_adj it takes. Serves stdin until it closes."""
    keeper = _Keeper(args[0], args[1])
    keeper.libc.prctl(4, 0, 0, 0, 0)  # not dumpable
    pid1.ignore_signals()
    keeper.serve()
