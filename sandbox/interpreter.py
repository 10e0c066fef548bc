"""The host side of the persistent interpreter of a sandbox: the protocol client and its transports.

The program itself (the kernel) runs inside the sandbox and is sandbox/guest/kernel.py, started with the command line
`interpreter_argv` gives (sandbox/programs.py ships its module files with the command); its protocol, one JSON
object per line, is described there. `InterpreterClient` is the one client of that protocol, whatever the backend:
the local backend plugs in pipes (`PipeTransport`), the Docker backend a `docker exec` socket. It keeps a hard
deadline per call (timeout + grace) and then kills the interpreter through a callback, for code that blocks the
kernel's own alarm.

This module does not start sandboxes, map results to `ExecResult` verdicts (sandbox/verdicts.py does), or enforce
limits other than time and output size (memory, pids, disk, network belong to the backend).
"""

from __future__ import annotations

import json
import os
import select
import time
from collections.abc import Callable
from typing import Any, BinaryIO, Protocol

from sandbox import programs

PROTOCOL_LINE_LIMIT_FACTOR = 14  # a JSON line may hold 2 streams of output_limit bytes, each escaped up to 6x
WATCH_INTERVAL_S = 0.1  # while a cell runs, InterpreterClient calls its `watch` this often


class InterpreterError(Exception):
    """The interpreter did not answer as the protocol says (it died, hung past the backstop, or wrote garbage)."""


def interpreter_argv(python: str = "python3") -> list[str]:
    """The command line that starts the interpreter (sandbox/guest/kernel.py) with the given python executable."""
    return programs.command(python, "kernel")


PROBE_TIMEOUT_S = 5.0  # answers(): an idle interpreter answers `pass` in ~1 ms; a dead one's stream ends well before
GONE_NOTE = ("[sandbox] the interpreter had died since the last call (an out-of-memory kill or a kill signal during "
             "an earlier command): a fresh one runs this call, earlier variables are gone")


class Transport(Protocol):
    """How the host reaches one running interpreter: its stdin and its stdout (the protocol), wherever it runs.
    The local backend plugs in pipes (`PipeTransport`), the Docker backend a `docker exec` socket."""

    def send(self, data: bytes, deadline: float) -> None:
        """Write all of data to the interpreter's stdin by `deadline` (time.monotonic); raises OSError/TimeoutError."""
        ...

    def recv(self, deadline: float) -> bytes | None:
        """What the interpreter's stdout holds, waiting until `deadline` for at least one byte (one look when it has
        passed); b"" at EOF, None when nothing came."""
        ...

    def stderr_tail(self) -> str:
        """The last of what the interpreter process wrote on its own stderr (start-up errors; never a cell's)."""
        ...

    def close(self) -> None:
        """Close the channel (the interpreter exits when its stdin closes)."""
        ...


class PipeTransport:
    """An interpreter's stdin/stdout pipes (and, optionally, its stderr) on this host."""

    def __init__(self, stdin: BinaryIO, stdout: Any, stderr_fd: int = -1) -> None:
        self._stdin = stdin
        self._fd = stdout.fileno() if hasattr(stdout, "fileno") else int(stdout)
        self._owned = stdout if hasattr(stdout, "fileno") else None
        self._err = stderr_fd
        os.set_blocking(self._fd, False)
        self._poller = select.poll()  # not select(): it fails on descriptors past 1024, which a busy host reaches
        self._poller.register(self._fd, select.POLLIN | select.POLLHUP | select.POLLERR)

    def send(self, data: bytes, deadline: float) -> None:
        self._stdin.write(data)
        self._stdin.flush()

    def recv(self, deadline: float) -> bytes | None:
        if not self._poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
            return None
        try:
            return os.read(self._fd, 1 << 20)
        except BlockingIOError:
            return None

    def stderr_tail(self) -> str:
        if self._err < 0:
            return ""
        try:
            os.set_blocking(self._err, False)
            return os.read(self._err, 1 << 16).decode(errors="replace")[-2000:]
        except OSError:
            return ""

    def close(self) -> None:
        for f in (self._stdin, self._owned):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        for fd in ((self._fd,) if self._owned is None else ()) + ((self._err,) if self._err >= 0 else ()):
            try:
                os.close(fd)
            except OSError:
                pass
        self._err = -1


class InterpreterClient:
    """Talk to one running interpreter over a `Transport`, with a hard host-side deadline per call: the one client
    of the protocol, whatever the backend.

    `kill` (settable later: a backend may adopt a prestarted interpreter) must kill the interpreter process (and
    what it started, if the backend can) and return its exit status (negative signal number as in subprocess) or
    None when unknown; it is called when a call runs past timeout_s + grace_s, when the interpreter dies, or when
    it breaks the protocol. After that `alive` is False and the backend starts a new interpreter (the episode's
    variables are gone, its files are not).
    """

    def __init__(self, transport: Transport, kill: Callable[[], int | None] | None = None, *, grace_s: float = 2.0,
                 startup_timeout_s: float = 30.0) -> None:
        self.transport = transport
        self.kill = kill
        self._buf = bytearray()
        self._next_id = 0
        self.grace_s = grace_s
        self.startup_timeout_s = startup_timeout_s
        self.alive = True
        self.eof = False
        self.ready: dict[str, Any] | None = None
        self.exit_status: int | None = None

    def _die(self) -> None:
        if self.alive:
            self.alive = False
            self.exit_status = self.kill() if self.kill is not None else None

    def _read_line(self, deadline: float, limit: int, watch: Callable[[], None] | None = None) -> bytes | None:
        """One protocol line, or None at EOF (then `eof` is set) or when the deadline passes. Raises
        InterpreterError on an oversized line. `watch`, if given, is called every WATCH_INTERVAL_S while the line
        has not come."""
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                return line
            if len(self._buf) > limit:
                raise InterpreterError(f"interpreter wrote a protocol line over {limit} bytes")
            if self.eof:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            data = self.transport.recv(deadline if watch is None else min(deadline, time.monotonic()
                                                                          + WATCH_INTERVAL_S))
            if data is None:
                if watch is not None:
                    watch()
                continue
            if not data:
                self.eof = True
                return None
            self._buf += data

    def wait_ready(self) -> dict[str, Any]:
        """Block until the interpreter says it is ready (at most startup_timeout_s). Raises InterpreterError."""
        if self.ready is not None:
            return self.ready
        line = self._read_line(time.monotonic() + self.startup_timeout_s, 1 << 16)
        try:
            msg = json.loads(line) if line is not None else None
        except ValueError:
            msg = None
        if not isinstance(msg, dict) or msg.get("ready") is not True:
            self._die()
            raise InterpreterError(f"interpreter did not start (first line {line!r:.200}, exit {self.exit_status}; "
                                   f"stderr {self.transport.stderr_tail()[-300:]!r})")
        self.ready = msg
        return msg

    def gone(self) -> bool:
        """Whether the idle interpreter's channel has ended (it died between calls); one look, no wait."""
        if not self.eof:
            data = self.transport.recv(0.0)
            if data == b"":
                self.eof = True
            elif data:
                self._buf += data  # a stray line; the next call's id check refuses it
        return self.eof

    def answers(self, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
        """Whether the idle interpreter still answers a no-op cell. For a channel that may lag behind a death:
        a `docker exec` stream closes only when the daemon has noticed the exit, so just after a command killed
        the interpreter `gone()` can still say no. A dead one here is closed without the kill callback (it is
        dead already; the caller starts a fresh one, as after `gone()`)."""
        if self.gone() or not self.alive:
            return False
        kill, self.kill = self.kill, None
        try:
            raw = self.call_raw("pass", timeout_s, 4096)
        finally:
            self.kill = kill
        return not raw["died"]

    def call_raw(self, code: str, timeout_s: float, output_limit: int,
                 watch: Callable[[], None] | None = None) -> dict[str, Any]:
        """Send one cell and return the protocol response, plus `died` (bool) and `exit_status` when it died.
        `watch` is called every WATCH_INTERVAL_S while the cell runs (the local backend samples the sandbox's
        process count with it).

        Never raises for the program's behaviour: no answer by timeout_s + grace_s returns timed_out=True with
        died=True; a dead interpreter (EOF) or a broken protocol returns died=True (not a timeout, however long it
        took). Raises InterpreterError only when called after the interpreter is dead or when it never started.
        """
        if not self.alive:
            raise InterpreterError("interpreter is dead; start a new one")
        self.wait_ready()
        self._next_id += 1
        rid = self._next_id
        start = time.monotonic()
        deadline = start + timeout_s + self.grace_s
        req = json.dumps({"id": rid, "code": code, "timeout_s": timeout_s, "output_limit": output_limit}) + "\n"
        base = {"id": rid, "stdout": "", "stderr": "", "truncated": False, "exit_code": None, "timed_out": False,
                "error": None, "memory_error": False, "died": False, "exit_status": None}
        broke = None
        try:
            self.transport.send(req.encode("utf-8", "surrogatepass"), deadline)
            line = self._read_line(deadline, PROTOCOL_LINE_LIMIT_FACTOR * output_limit + 65536, watch)
        except (InterpreterError, OSError, TimeoutError) as e:
            line, broke = None, f"[interpreter channel broke: {e}]"
        resp = None
        if line is not None:
            try:
                resp = json.loads(line)
                if not isinstance(resp, dict) or resp.get("id") != rid:
                    raise ValueError(f"expected id {rid}, got {line[:200]!r}")
            except ValueError as e:
                resp, broke = None, f"[interpreter broke the protocol: {e}]"
        if resp is None:
            hung = broke is None and not self.eof
            self._die()
            stderr = "\n".join(x for x in (broke, self.transport.stderr_tail().strip()) if x)
            return {**base, "stderr": stderr, "timed_out": hung, "died": True, "exit_status": self.exit_status,
                    "duration_ms": (time.monotonic() - start) * 1000}
        return {**base, **{k: resp[k] for k in base if k in resp and k not in ("died", "exit_status")},
                "duration_ms": (time.monotonic() - start) * 1000}

    def call(self, code: str, timeout_s: float, output_limit: int) -> dict[str, Any]:
        """Run one cell; return the fields of an `ExecResult` (see sandbox/verdicts.py `exec_fields`)."""
        from sandbox.verdicts import exec_fields

        return exec_fields(self.call_raw(code, timeout_s, output_limit))

    def close(self, *, kill: bool = True) -> None:
        """Close the channel (the interpreter exits on EOF) and, with `kill`, kill it."""
        self.transport.close()
        if kill:
            self._die()
        self.alive = False

