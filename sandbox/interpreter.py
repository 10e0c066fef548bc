"""The persistent Python interpreter that runs inside a sandbox, and the host-side client that talks to it.

The program (`main`) is started once per episode as `python3 -u -c SOURCE` (SOURCE = `interpreter_source()`, the
text of this file) inside the sandbox, and keeps one globals dict across calls, like a notebook kernel. It only
needs the standard library of Python 3.11 and must work without a file (no `__file__`, no package imports).

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

import json
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO, Protocol

PROTOCOL_LINE_LIMIT_FACTOR = 14  # a JSON line may hold 2 streams of output_limit bytes, each escaped up to 6x
WATCHDOG_GRACE_S = 0.5  # after the deadline, child processes of the call are killed
RERAISE_INTERVAL_S = 0.1
WATCH_INTERVAL_S = 0.1  # while a cell runs, InterpreterClient calls its `watch` this often
THREAD_RETRY_S = 0.2  # how long a cell waits for the process limit to free a slot for its watchdog thread


# ----------------------------------------------------------------------------------------------------------------
# The program (runs inside the sandbox)
# ----------------------------------------------------------------------------------------------------------------


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


def _descendants(root_pid: int) -> list[int]:
    """Pids of all live descendants of root_pid, read from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root_pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


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
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
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
                for pid in _descendants(self.pid):
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


def main() -> None:
    """Serve requests on stdin until it closes. Run as `python3 -u -c SOURCE` inside a sandbox; with the argument
    `zygote` (`python3 -u -c SOURCE zygote`), run the zygote instead (see below)."""
    if sys.argv[1:] == [ZYGOTE_ARG]:
        _Zygote().serve()
    else:
        _Kernel().serve()


# ----------------------------------------------------------------------------------------------------------------
# The zygote (runs inside a local sandbox, one per sandbox)
# ----------------------------------------------------------------------------------------------------------------
#
# A pristine process that never runs user code. It forks each episode's interpreter (a copy of itself, so an
# interpreter costs a fork instead of a Python start-up) and, between two episodes of a reused sandbox, resets the
# sandbox and checks that nothing of the last episode is left. It trusts no state that user code can touch:
# - it is non-dumpable, so processes of the same uid (every process of the sandbox) cannot ptrace it or read or
#   write its memory through /proc; a signal can kill or stop it, and the host then sees it gone or silent and
#   destroys the sandbox;
# - it imports everything it needs before the first interpreter exists, and never imports from /workspace;
# - its control channel is a unix socket (fd 0 at start) that no interpreter inherits.
# Requests, one datagram each (SOCK_SEQPACKET), JSON:
#   {"op": "spawn"} + 3 fds (stdin, stdout, stderr of the new interpreter) -> {"pid": pid in the sandbox}
#   {"op": "kill", "pid": n} -> {"status": exit status as in subprocess, null when not our child}
#   {"op": "reset"} -> {"ok": bool, "why": str}: SIGKILL every other process of the sandbox (PID 1 excepted), wait
#       until /proc shows only PID 1 and the zygote, empty RESET_DIRS, then check: RESET_DIRS empty with the mode,
#       owner and extended attributes they had at start, no System V IPC object, and /proc/keys as at start.
# POSIX message queues are refused by the backend's RLIMIT_MSGQUEUE of 0, so they need no check here.

ZYGOTE_ARG = "zygote"
RESET_DIRS = ("/tmp", "/workspace", "/dev/shm")
RESET_WAIT_S = 2.0


def _remove(path: str) -> None:
    """Remove a file, link or directory tree without following links; makes unreadable directories readable."""
    import stat as stat_mod

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat_mod.S_ISDIR(st.st_mode):
        os.chmod(path, 0o700)
        for name in os.listdir(path):
            _remove(os.path.join(path, name))
        os.rmdir(path)
    else:
        os.unlink(path)


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
        self.baseline = self._state()

    @staticmethod
    def _state() -> dict[str, Any]:
        """What a reset must restore and an episode could change outside its files: the reset folders' mode,
        owner and extended attributes, and the kernel keys this sandbox can see."""
        state: dict[str, Any] = {}
        for d in RESET_DIRS:
            st = os.stat(d)
            try:
                xattrs = sorted(os.listxattr(d))
            except OSError:
                xattrs = []
            state[d] = [st.st_mode, st.st_uid, st.st_gid, xattrs]
        try:
            with open("/proc/keys") as f:
                state["keys"] = sorted(line.split()[0] for line in f)
        except OSError:
            state["keys"] = None
        return state

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
                _Kernel().serve()
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
            others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, self.pid)]
            if not others:
                break
            if time.monotonic() > deadline:
                return {"ok": False, "why": f"processes survived the reset: {others[:8]}"}
            time.sleep(0.001)
        problems = []
        for d in RESET_DIRS:
            try:
                for name in os.listdir(d):
                    _remove(os.path.join(d, name))
                mode, _, _, _ = self.baseline[d]
                os.chmod(d, mode & 0o7777)
                for attr in set(os.listxattr(d)) - set(self.baseline[d][3]):
                    os.removexattr(d, attr)
            except (OSError, RecursionError) as e:
                problems.append(f"cannot empty {d}: {e}")
            try:
                if os.listdir(d):
                    problems.append(f"{d} is not empty")
            except OSError as e:
                problems.append(f"cannot list {d}: {e}")
        for kind in ("shm", "sem", "msg"):
            try:
                with open(f"/proc/sysvipc/{kind}") as f:
                    if len(f.read().splitlines()) > 1:
                        problems.append(f"System V {kind} objects are left")
            except OSError as e:
                problems.append(f"cannot read /proc/sysvipc/{kind}: {e}")
        state = self._state()
        if state != self.baseline:
            changed = sorted(k for k in state if state[k] != self.baseline.get(k))
            problems.append(f"changed since the sandbox started: {', '.join(changed)}")
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


# ----------------------------------------------------------------------------------------------------------------
# The host side
# ----------------------------------------------------------------------------------------------------------------


class InterpreterError(Exception):
    """The interpreter did not answer as the protocol says (it died, hung past the backstop, or wrote garbage)."""


def interpreter_source() -> str:
    """The text of this file: the program a backend runs as `python3 -u -c SOURCE` inside a sandbox."""
    from pathlib import Path

    return Path(__file__).read_text(encoding="utf-8")


def interpreter_argv(python: str = "python3") -> list[str]:
    """The command line that starts the interpreter with the given python executable."""
    return [python, "-u", "-c", interpreter_source()]


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
        from sandbox.verdicts import exec_fields  # host side only: the program above imports nothing of ours

        return exec_fields(self.call_raw(code, timeout_s, output_limit))

    def close(self, *, kill: bool = True) -> None:
        """Close the channel (the interpreter exits on EOF) and, with `kill`, kill it."""
        self.transport.close()
        if kill:
            self._die()
        self.alive = False


if __name__ == "__main__":
    main()
