"""The persistent Python interpreter (the kernel) that runs a sandbox's cells: one globals dict across calls, like a
notebook kernel. It runs inside the sandbox; the host talks to it with `InterpreterClient` (sandbox/interpreter.py).

Started as `python3 -u -c BOOT sandbox.guest.kernel ...` (sandbox/guest/boot.py), by a zygote's fork
(sandbox/guest/zygote.py, local backend) or by a keeper's fork (sandbox/guest/keeper.py, Docker with reuse).
Standard library only, plus sandbox/procfs.py; it must work without a file (no `__file__`, no package on disk).

Protocol, one JSON object per line:
  host -> interpreter (stdin):  {"id": n, "code": str, "timeout_s": float, "output_limit": int}
  interpreter -> host (stdout): first {"ready": true, "pid": int, "python": str}, then per request
      {"id": n, "stdout": str, "stderr": str, "truncated": bool, "exit_code": int|null, "timed_out": bool,
       "error": str|null, "memory_error": bool, "duration_ms": float}
  `exit_code` reads like a process's: 0 when the cell finished, the code of a SystemExit (the interpreter survives
  it), 1 after an uncaught exception, null on timeout. `error` is the traceback of an uncaught exception (also
  appended to stderr, as a notebook shows it); `memory_error` says that exception was a MemoryError (the backend's
  memory limit). When the cell's last statement is an expression, its repr is printed (notebook style).

At start the program moves the protocol to private descriptors (dups of the original stdin/stdout, not inherited by
children) and points fd 0 at /dev/null and fds 1/2 at pipes drained by two threads into per-call buffers capped at
`output_limit` bytes each (the rest is counted and dropped: an infinite print costs CPU, never memory or disk).
So prints, `os.system` and subprocess output are captured and user code cannot write into the protocol channel
by accident. A call's timeout is an ITIMER_REAL alarm that raises `CallTimeout` (a BaseException) in the main
thread, re-raised every 0.1 s if the code swallows it; a watchdog thread kills the call's child processes shortly
after the deadline so a call blocked in C (`os.system`) returns. Code that blocks signals is the host's job:
`InterpreterClient` keeps a hard deadline (timeout + grace) and then kills the process through a callback.

This module does not start sandboxes, map results to `ExecResult` verdicts (sandbox/verdicts.py does), or enforce
limits other than time and output size (memory, pids, disk, network belong to the backend).
"""

from __future__ import annotations

import builtins
import json
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from sandbox import procfs

WATCHDOG_GRACE_S = 0.5  # after the deadline, child processes of the call are killed
RERAISE_INTERVAL_S = 0.1
THREAD_RETRY_S = 0.2  # how long a cell waits for the process limit to free a slot for its watchdog thread


class CallTimeout(BaseException):
    """Raised in user code when its call ran past timeout_s (a BaseException, so `except Exception` misses it)."""


class _Capture:
    """Drain one pipe (the target of fd 1 or 2) into a per-call buffer capped at `limit` bytes."""

    def __init__(self, read_fd: int) -> None:
        self.fd = read_fd
        self.lock = threading.Lock()
        self.buf = bytearray()
        self.limit = 1_000_000
        self.dropped = 0
        os.set_blocking(read_fd, False)
        _start_thread(self._loop, f"capture-{read_fd}")

    def _take(self, data: bytes) -> None:
        room = self.limit - len(self.buf)
        if room > 0:
            self.buf += data[:room]
        self.dropped += max(0, len(data) - max(room, 0))

    def _read_available(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            if not data:
                return
            self._take(data)

    def _loop(self) -> None:
        while True:
            select.select([self.fd], [], [])
            with self.lock:
                self._read_available()

    def reset(self, limit: int) -> None:
        with self.lock:
            self._read_available()  # output written between calls (a daemon) is dropped
            self.buf = bytearray()
            self.dropped = 0
            self.limit = limit

    def collect(self) -> tuple[bytes, bool]:
        with self.lock:
            self._read_available()
            data, truncated = bytes(self.buf), self.dropped > 0
            self.buf = bytearray()
            self.dropped = 0
        return data, truncated


def _start_thread(target: Callable[..., None], name: str, *args: Any) -> None:
    """A daemon thread with a small stack (stacks count against the sandbox's address-space limit)."""
    old = threading.stack_size(256 * 1024)
    try:
        threading.Thread(target=target, args=args, name=name, daemon=True).start()
    finally:
        threading.stack_size(old)


def _start_thread_retrying(target: Callable[..., None], name: str, *args: Any) -> bool:
    """`_start_thread`, retried for a moment when the process limit refuses a thread (processes a call left behind
    may have just been killed and not be gone yet); whether it started."""
    deadline = time.monotonic() + THREAD_RETRY_S
    while True:
        try:
            _start_thread(target, name, *args)
            return True
        except RuntimeError:  # "can't start new thread" (EAGAIN)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)


class _Kernel:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.proto_in = os.fdopen(os.dup(0), "rb")
        self.proto_out = os.dup(1)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        self.captures: list[_Capture] = []
        self.write_ends: list[int] = []
        for fd in (1, 2):
            r, w = os.pipe()
            os.dup2(w, fd)  # inheritable: os.system and subprocess children write into the capture
            self.write_ends.append(w)  # kept (not inherited) to re-point fd 1/2 if user code closes them
            self.captures.append(_Capture(r))
        self.stdout, self.stderr = sys.stdout, sys.stderr
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        self.cell = 0
        self.in_user_code = False
        self.alarm_fired = False
        self.timeout_s = 0.0
        signal.signal(signal.SIGALRM, self._on_alarm)

    def _on_alarm(self, signum: int, frame: Any) -> None:
        if self.in_user_code:
            self.alarm_fired = True
            raise CallTimeout(f"call ran past its timeout of {self.timeout_s:g} s")

    def _watchdog(self, done: threading.Event, deadline: float) -> None:
        while not done.wait(0.05):
            if time.monotonic() > deadline + WATCHDOG_GRACE_S:
                for pid in procfs.descendants(self.pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass

    def send(self, obj: dict[str, Any]) -> None:
        data = (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8", "replace")
        view = memoryview(data)
        while view:
            view = view[os.write(self.proto_out, view) :]

    def run_cell(self, code: str, timeout_s: float) -> dict[str, Any]:
        import ast
        import linecache
        import traceback

        self.cell += 1
        filename = f"<cell-{self.cell}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        error: str | None = None
        memory_error = timed_out = False
        exit_code: int | None = 0
        extra_stderr = ""
        self.timeout_s = timeout_s
        self.alarm_fired = False
        done = threading.Event()
        # With the sandbox's process limit full (threads count), the cell runs without its watchdog: the backend
        # still kills what a call leaves behind past its timeout, and the cell may be the one that frees the slots.
        _start_thread_retrying(self._watchdog, "watchdog", done, time.monotonic() + timeout_s)
        for fd, w in zip((1, 2), self.write_ends):
            os.dup2(w, fd)  # a cell that closed or redirected fd 1/2 does not break the next one
        try:
            try:
                tree = ast.parse(code, filename, "exec")
                last = None
                if tree.body and isinstance(tree.body[-1], ast.Expr):
                    last = ast.Expression(tree.body.pop().value)
                body = compile(tree, filename, "exec")
                tail = compile(last, filename, "eval") if last is not None else None
                sys.stdout, sys.stderr = self.stdout, self.stderr
                self.in_user_code = True
                signal.setitimer(signal.ITIMER_REAL, timeout_s, RERAISE_INTERVAL_S)
                exec(body, self.namespace)  # noqa: S102 - running the model's code is the point
                if tail is not None:
                    value = eval(tail, self.namespace)
                    if value is not None:
                        print(repr(value))
            finally:
                self.in_user_code = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        except CallTimeout as e:
            timed_out, exit_code = True, None
            extra_stderr = f"TimeoutError: {e}\n"
        except SystemExit as e:
            if e.code is None:
                exit_code = 0
            elif isinstance(e.code, int):
                exit_code = e.code
            else:
                extra_stderr = f"{e.code}\n"
                exit_code = 1
        except BaseException as e:  # noqa: BLE001 - every user error is reported, never raised
            tb = e.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != filename:
                tb = tb.tb_next  # drop the interpreter's own frames
            error = "".join(traceback.format_exception(type(e), e, tb if tb is not None else e.__traceback__))
            memory_error = isinstance(e, MemoryError)
            extra_stderr, exit_code = error, 1
        finally:
            done.set()
            if os.getpid() != self.pid:  # user code forked and this is the child returning: never touch the protocol
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(exit_code or 0)
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - a broken user stream must not break the protocol
                pass
        if self.alarm_fired and not timed_out:  # the code swallowed CallTimeout but still ran past its time
            timed_out, exit_code = True, None
        return {"exit_code": exit_code, "error": error, "memory_error": memory_error, "timed_out": timed_out,
                "extra_stderr": extra_stderr}

    def serve(self) -> None:
        self.send({"ready": True, "pid": self.pid, "python": sys.version.split()[0]})
        while True:
            line = self.proto_in.readline()
            if not line:
                return
            try:
                req = json.loads(line)
                rid, code = req["id"], req["code"]
                timeout_s, limit = float(req["timeout_s"]), int(req["output_limit"])
            except (ValueError, KeyError, TypeError) as e:
                self.send({"id": None, "protocol_error": f"bad request: {e}"})
                continue
            for cap in self.captures:
                cap.reset(limit)
            start = time.monotonic()
            out = self.run_cell(code, timeout_s)
            duration_ms = (time.monotonic() - start) * 1000
            (stdout, t_out), (stderr, t_err) = (cap.collect() for cap in self.captures)
            truncated = t_out or t_err
            if out["extra_stderr"]:
                tail = out["extra_stderr"].encode("utf-8", "replace")[-limit:]
                stderr = stderr[: max(0, limit - len(tail))] + tail
            self.send({
                "id": rid,
                "stdout": stdout.decode("utf-8", "replace"),
                "stderr": stderr.decode("utf-8", "replace"),
                "truncated": truncated,
                "exit_code": out["exit_code"],
                "timed_out": out["timed_out"],
                "error": out["error"],
                "memory_error": out["memory_error"],
                "duration_ms": duration_ms,
            })



def main(args: list[str]) -> None:
    """Serve requests on stdin until it closes."""
    _Kernel().serve()
