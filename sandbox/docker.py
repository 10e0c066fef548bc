"""Docker sandbox backend: a fresh locked-down container per episode from a warm pool, a persistent interpreter.

`DockerBackend(config)` keeps `pool_size` started containers ahead; `acquire()` hands one out and background threads
refill the pool: with fresh containers, or with `config.reuse` (the default on Docker; see Reuse) with containers
whose episode ended, reset and checked. Each container has no network, memory limited including swap,
a pids limit, a CPU quota, a read-only root filesystem with size-limited tmpfs at /tmp, /workspace and /dev/shm,
every capability dropped, no-new-privileges, user nobody (65534), our labels, and an environment made only of the
image's defaults (no host variables, no proxy settings, no Docker socket).

PID 1 of each container is a tiny init (sandbox/guest/pid1.py) that ignores signals, is not dumpable (no ptrace from the sandbox user),
reaps orphans (so killed fork bombs and double-forked daemons leave no zombies) and exits when its stdin closes.
The backend holds that stdin open through an attach socket: when the owning process dies, even by SIGKILL, the
socket closes, PID 1 exits and Docker removes the container (auto-remove). sandbox/reaper.py removes strays left
otherwise (e.g. created but never started). Every exec'd process raises its own oom_score_adj first, so the OOM
killer takes the sandbox's commands, then its interpreter, never PID 1.

`DockerSandbox.exec` runs argv under `timeout -s KILL` (exec has no timeout of its own) with our own wall-clock
backstop; output is read from the raw exec socket, capped per stream (the truncated flag), and a flood far beyond
the cap kills the call. `run_python` talks to the episode's persistent interpreter (sandbox/guest/kernel.py, run
with `docker exec -i`; the pool starts and warms it ahead, otherwise it starts on the first call), which keeps
state across calls like a notebook kernel; one that hangs past timeout + grace, or dies, is killed and replaced on
the next call, and the result's stderr says so. After a call that hit the pids limit, flooded or hung, leftover
processes are killed (or, when nothing can start any more, the container is swapped for a fresh one, said in
stderr). OOM kills and pids-limit hits are read from the container's cgroup counters (falling back to
State.OOMKilled). Engine failures become verdict infra_error with the engine's message, never the program's
failure; container creation is retried with backoff, then acquire() raises SandboxError.

Reuse (`SandboxConfig.reuse`, unset = on for Docker): a fresh container per episode costs ~260 ms of CPU (create,
start, exec, remove: 7 clean episodes/s on 2 cores), a reset ~25 ms (benchmarks/sandbox.py, fresh vs reused). In
reuse mode each container runs a keeper (sandbox/guest/keeper.py) that forks every episode's interpreter. Closing an episode
hands the container to a pool thread, which: has the keeper kill and reap the interpreter; freezes the container's
cgroup from the host, SIGKILLs every process but PID 1 and the keeper, thaws it and waits until only those two are
left; has the keeper fork a fresh interpreter, whose first cell (sandbox/guest/reset.py, the same warm-up cell a fresh
container runs) empties /tmp, /workspace and /dev/shm and reports processes, folder entries, modes, owners and
extended attributes, /dev/mqueue, System V IPC objects, the writable mounts and the kernel keys; then the host
requires that report
to equal the container's fresh one, sees exactly PID 1, the keeper and the interpreter in the cgroup, and the same
cgroup limits (memory, swap, pids, CPU). Any failure (including a keeper the episode killed and a new one that
does not come up, or no cgroup reachable: a remote engine, not root) removes the container and counts it in
`stats["reset_failed"]`. A closed handle stays closed. What a reset does not renew: pid and inode numbers continue
and the container's uptime and cgroup counters (CPU used, OOM kills seen) carry over; Docker's seccomp profile
refuses kernel keyrings, so there are none to clear.
The parts every backend shares are not here: the verdict ladders (sandbox/verdicts.py), the capture rule
(sandbox/capture.py), the file writer (sandbox/files.py) and the interpreter-protocol client, which this module
plugs into the exec socket (`_ExecTransport`, sandbox/interpreter.py).
This module does not build images (sandbox/image.py) nor choose a backend (sandbox/backend.py).
"""

from __future__ import annotations

import atexit
import io
import json
import logging
import os
import queue
import re
import select
import signal
import socket
import struct
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox import procfs, programs
from sandbox.capture import Capture, text, with_notes
from sandbox.engine import (
    BACKEND_LABEL,
    LABEL,
    OWNER_LABEL,
    SANDBOX_USER,
    WORKDIR,
    docker_client,
    image_id,
    owner_tag,
)
from sandbox.files import write_files
from sandbox.interpreter import GONE_NOTE, InterpreterClient, InterpreterError, interpreter_argv
from sandbox.reaper import reap
from sandbox.result import ExecResult, SandboxConfig, SandboxError, SandboxUnavailable
from sandbox.verdicts import exec_fields, exec_verdict, infra_result

log = logging.getLogger(__name__)

GRACE_S = 2.0  # how long past its timeout a call may take before our own backstop kills it
CREATE_TRIES = 3
FILL_THREADS = 3  # containers the pool creates at once
STARTUP_TIMEOUT_S = 30.0
REUSE_SPARE = 2  # with reuse, containers the pool starts beyond those in use (a reset takes a few ms)
RESET_WAIT_S = 2.0  # a reset whose processes are not all gone (or frozen) by then fails: the container is removed

KEEPER_OOM_ADJ = 200  # the OOM killer takes commands (500), then the interpreter (300), then the keeper
RESET_DIRS = ("/tmp", WORKDIR, "/dev/shm")


# ---------------------------------------------------------------------------------------------------------------
# cgroup counters: OOM kills and pids-limit hits of one container


@dataclass
class _Counters:
    oom_kill: int = 0
    pids_max: int = 0


class _Cgroup:
    """Reads the container's cgroup event counters from /sys/fs/cgroup when the engine is local (v1 or v2)."""

    def __init__(self, cid: str):
        base = Path("/sys/fs/cgroup")
        candidates = [
            (base / "memory/docker" / cid / "memory.oom_control", base / "pids/docker" / cid / "pids.events"),
            (base / f"system.slice/docker-{cid}.scope/memory.events", base / f"system.slice/docker-{cid}.scope/pids.events"),
            (base / "docker" / cid / "memory.events", base / "docker" / cid / "pids.events"),
        ]
        self.mem: Path | None = None
        self.pids: Path | None = None
        for mem, pids in candidates:
            if mem.exists():
                self.mem, self.pids = mem, (pids if pids.exists() else None)
                break
        # what a reset needs (reuse): the container's processes, a freezer, and the limits it was started with
        self.procs: Path | None = None
        self.freeze: tuple[Path, str, str] | None = None  # (file, value that freezes, value that thaws)
        self.limits: list[Path] = []
        if self.mem is not None and self.mem.name == "memory.oom_control":  # v1: one hierarchy per controller
            self.procs = self.pids.parent / "cgroup.procs" if self.pids is not None else None
            self.freeze = (base / "freezer/docker" / cid / "freezer.state", "FROZEN", "THAWED")
            self.limits = [self.mem.parent / "memory.limit_in_bytes", self.mem.parent / "memory.memsw.limit_in_bytes",
                           base / "pids/docker" / cid / "pids.max", base / "cpu/docker" / cid / "cpu.cfs_quota_us"]
        elif self.mem is not None:  # v2: one directory
            d = self.mem.parent
            self.procs = d / "cgroup.procs"
            self.freeze = (d / "cgroup.freeze", "1", "0")
            self.limits = [d / "memory.max", d / "memory.swap.max", d / "pids.max", d / "cpu.max"]
        self.limits = [x for x in self.limits if x.exists()]

    @property
    def available(self) -> bool:
        return self.mem is not None

    @staticmethod
    def _field(path: Path | None, name: str) -> int:
        if path is None:
            return 0
        try:
            for line in path.read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == name:
                    return int(v)
        except (OSError, ValueError):
            pass
        return 0

    def read(self) -> _Counters:
        return _Counters(self._field(self.mem, "oom_kill"), self._field(self.pids, "max"))

    @property
    def resettable(self) -> bool:
        """The host can kill this container's processes itself: the process list and the freezer are there."""
        return self.procs is not None and self.procs.exists() and self.freeze is not None and self.freeze[0].exists()

    def processes(self) -> list[int]:
        """Host pids of every process in the container (PID 1, exec'd commands, their children)."""
        assert self.procs is not None
        return [int(x) for x in self.procs.read_text().split()]

    def limit_values(self) -> list[str]:
        """The memory, swap, pids and CPU limits as the kernel holds them (a reused container must keep them)."""
        return [x.read_text().strip() for x in self.limits]


# ---------------------------------------------------------------------------------------------------------------
# raw exec streams


def _wait(sock: socket.socket, event: int, timeout_s: float) -> bool:
    """poll() one socket (select() breaks on descriptors past 1024, which a busy process reaches)."""
    p = select.poll()
    p.register(sock, event | select.POLLHUP | select.POLLERR)
    return bool(p.poll(max(0, int(timeout_s * 1000) + 1)))


def _read_ahead(sock_io: Any, sock: Any) -> bytes:
    """The bytes of the exec's stream that http.client already read into the response's buffer with the headers.

    docker-py hands over the raw socket under the response's BufferedReader; when the command writes quickly (a
    short exec, a busy host that parses the headers late) its first frames sit in that buffer, and reading only the
    socket loses them: `echo 636` came back empty, and an interpreter's ready line never came."""
    try:
        fp = sock_io._response.raw._fp.fp
    except AttributeError:
        return b""
    if not isinstance(fp, io.BufferedReader) or not isinstance(sock, socket.socket):
        return b""
    blocking = sock.getblocking()
    try:
        sock.setblocking(False)
        data = fp.read1(1 << 20)  # buffered bytes only, or one non-blocking read
    except (OSError, ValueError):
        data = b""
    finally:
        try:
            sock.setblocking(blocking)
        except OSError:
            pass
    return bytes(data or b"")


class _Stream:
    """Demultiplexes Docker's framed stdout/stderr stream from a hijacked socket, with deadlines."""

    def __init__(self, sock_io: Any):
        self.io = sock_io  # keep the SocketIO (and its response) alive
        self.sock: socket.socket = getattr(sock_io, "_sock", sock_io)
        self.buf = _read_ahead(sock_io, self.sock)
        self.eof = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("stdin not consumed before the deadline")
            if _wait(self.sock, select.POLLOUT, left):
                n = self.sock.send(view[:65536])
                view = view[n:]

    def close_stdin(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def read_frames(self, deadline: float) -> list[tuple[int, bytes]] | None:
        """Frames available now (waiting until the deadline for at least one byte); [] at EOF; None on timeout."""
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if not _wait(self.sock, select.POLLIN, left):
            return None
        try:
            data = self.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            data = None
        except OSError:
            data = b""
        if data == b"":
            self.eof = True
        elif data:
            self.buf += data
        frames = []
        while len(self.buf) >= 8:
            kind, size = struct.unpack(">BxxxL", self.buf[:8])
            if len(self.buf) < 8 + size:
                break
            frames.append((kind, self.buf[8 : 8 + size]))
            self.buf = self.buf[8 + size :]
        return frames

    def close(self) -> None:
        for obj in (self.sock, self.io):
            try:
                obj.close()
            except Exception:  # noqa: BLE001, S110 - closing a dead socket is best effort
                pass


def _is_infra(e: BaseException) -> bool:
    import docker.errors
    import requests

    return isinstance(e, (SandboxError, docker.errors.DockerException, requests.RequestException, ConnectionError,
                          OSError))


# ---------------------------------------------------------------------------------------------------------------
# containers


class _ExecTransport:
    """The interpreter's `docker exec -i` socket as an InterpreterClient transport: stdin out, Docker's framed
    stdout/stderr in (stdout is the protocol; the process's own stderr is kept, up to 64 KiB, for error text).
    With reuse the exec is the keeper's, which relays to the interpreter it forked: `read_line` reads the keeper's
    own lines outside the client, and what arrived after such a line is handed to the next `recv`."""

    def __init__(self, stream: _Stream):
        self.stream = stream
        self.err = bytearray()
        self.pending = bytearray()  # stdout read past a keeper line: the next recv returns it first

    def send(self, data: bytes, deadline: float) -> None:
        self.stream.send(data, deadline)

    def recv(self, deadline: float) -> bytes | None:
        if self.pending:
            data = bytes(self.pending)
            self.pending.clear()
            return data
        return self._read(deadline)

    def _read(self, deadline: float) -> bytes | None:
        """Stdout from the socket (stderr frames kept aside), as `recv` without what is pending."""
        while True:
            if self.stream.eof:
                return b""
            frames = self.stream.read_frames(max(deadline, time.monotonic() + 0.001))
            if frames is None:
                return None
            out = b""
            for kind, data in frames:
                if kind == 2:
                    self.err += data[: max(0, 65536 - len(self.err))]
                else:
                    out += data
            if out:
                return out
            if self.stream.eof:
                return b""
            if time.monotonic() >= deadline:
                return None

    def read_line(self, deadline: float, limit: int) -> bytes | None:
        """One raw stdout line (the keeper's hello and answers); None at EOF or past the deadline. Raises
        ValueError on a line over `limit` bytes."""
        while True:
            nl = self.pending.find(b"\n")
            if nl >= 0:
                line = bytes(self.pending[:nl])
                del self.pending[: nl + 1]
                return line
            if len(self.pending) > limit:
                raise ValueError(f"the keeper wrote a line over {limit} bytes")
            data = self._read(deadline)
            if not data:
                return None
            self.pending += data

    def stderr_tail(self) -> str:
        return text(self.err)[-2000:]

    def close(self) -> None:
        self.stream.close()


@dataclass
class _Interp:
    """The episode's running interpreter: its exec, socket, pid inside the container, and the protocol client."""

    exec_id: str
    stream: _Stream
    client: InterpreterClient
    pid: int = 0
    keeper: int = 0  # pid of its keeper inside the container (reuse), whose exec this stream is; 0: its own exec

    @property
    def transport(self) -> _ExecTransport:
        assert isinstance(self.client.transport, _ExecTransport)
        return self.client.transport


@dataclass
class _Container:
    id: str
    watch: Any  # attach socket holding PID 1's stdin open (closing it ends the container)
    cgroup: _Cgroup
    interp: _Interp | None = None  # started ahead by the pool, so an episode's first call is fast too
    created: float = field(default_factory=time.monotonic)
    pid1: int = 0  # host pid of PID 1 (reuse: every other process but the keeper is the episode's)
    keeper: int = 0  # host pid of the keeper (reuse), 0 when none runs
    baseline: dict | None = None  # the reset check's state when fresh (reuse)
    limits: list[str] = field(default_factory=list)  # cgroup limits when fresh (reuse)
    episodes: int = 0  # episodes this container has served


# Every exec'd process first makes itself a preferred victim of the OOM killer (raising oom_score_adj needs no
# privilege, lowering it below 0 does), so a memory bomb never takes PID 1 and the container down with it; commands
# (500) go before the episode's interpreter (300), whose variables are worth more.
EXEC_OOM_ADJ, INTERP_OOM_ADJ = 500, 300


def _oom_prefix(adj: int) -> list[str]:
    return ["sh", "-c", f'echo {adj} > /proc/self/oom_score_adj; exec "$@"', "sh"]


def _start_exec(api, cid: str, argv: list[str], *, stdin: bool, adj: int = EXEC_OOM_ADJ, user: str = SANDBOX_USER,
                workdir: str = WORKDIR) -> tuple[str, _Stream]:
    ex = api.exec_create(cid, _oom_prefix(adj) + argv, stdin=stdin, stdout=True, stderr=True, user=user,
                         workdir=workdir)
    sock = api.exec_start(ex["Id"], socket=True)
    return ex["Id"], _Stream(sock)


def _warm(it: _Interp) -> None:
    """Run an empty cell so the interpreter's lazy imports are paid before an episode starts."""
    raw = it.client.call_raw("pass", 10, 1000)
    if raw["died"] or raw["exit_code"] != 0:
        it.stream.close()
        raise SandboxError(f"the interpreter did not answer its warm-up call: {raw['stderr'][-200:]!r}")


def _reset_check(it: _Interp, empty: bool) -> dict:
    """Run the reset check (sandbox/guest/reset.py) as the interpreter's warm-up cell; returns the state it printed."""
    code = programs.cell("reset", *(["--empty"] if empty else []), *RESET_DIRS)
    raw = it.client.call_raw(code, 10, 1 << 16)
    state = None
    if not raw["died"] and raw["exit_code"] == 0 and not raw["truncated"]:
        try:
            state = json.loads(raw["stdout"])
        except ValueError:
            state = None
    if not isinstance(state, dict) or not isinstance(state.get("problems"), list):
        raise SandboxError(f"the reset check did not answer (exit {raw['exit_code']}, died {raw['died']}): "
                           f"{(raw['stderr'] or raw['stdout'])[-300:]!r}")
    return state


def _await_ready(exec_id: str, st: _Stream, transport: _ExecTransport, keeper: int = 0) -> _Interp:
    """A protocol client for the interpreter starting behind `transport`, once its ready line came; closes the
    stream and raises SandboxError when none comes."""
    client = InterpreterClient(transport, grace_s=GRACE_S, startup_timeout_s=STARTUP_TIMEOUT_S)
    try:
        ready = client.wait_ready()
    except InterpreterError as e:
        st.close()
        raise SandboxError(str(e)) from e
    transport.err.clear()
    return _Interp(exec_id, st, client, int(ready.get("pid") or 0), keeper)


def _start_interpreter(api, cid: str, user: str = SANDBOX_USER, workdir: str = WORKDIR) -> _Interp:
    """Start the interpreter (sandbox/guest/kernel.py) in the container with `docker exec -i` and wait for its ready line."""
    exec_id, st = _start_exec(api, cid, interpreter_argv("python3"), stdin=True, adj=INTERP_OOM_ADJ, user=user,
                              workdir=workdir)
    return _await_ready(exec_id, st, _ExecTransport(st))


def _keeper_call(transport: _ExecTransport, op: str, timeout_s: float = RESET_WAIT_S) -> dict:
    """Send a request to the keeper (a raw line on the transport) and return its answer (lines before it, left by
    the last episode, are dropped; what follows it, a spawned interpreter's ready line, stays for its client)."""
    nonce = uuid.uuid4().hex
    deadline = time.monotonic() + timeout_s
    transport.send(json.dumps({"keeper": op, "nonce": nonce}).encode() + b"\n", deadline)
    while True:
        line = transport.read_line(deadline, 1 << 26)
        if line is None:
            raise SandboxError(f"the keeper did not answer {op!r} (stderr {transport.stderr_tail()[-300:]!r})")
        if line.startswith(b"{") and nonce.encode() in line:
            msg = json.loads(line)
            if isinstance(msg, dict) and msg.get("keeper") == nonce:
                return msg


def _start_keeper(api, cid: str) -> _Interp:
    """Start the keeper (sandbox/guest/keeper.py) with `docker exec -i`, have it fork an interpreter, wait for its
    ready line."""
    argv = programs.command("python3", "keeper", WORKDIR, str(INTERP_OOM_ADJ))
    exec_id, st = _start_exec(api, cid, argv, stdin=True, adj=KEEPER_OOM_ADJ)
    transport = _ExecTransport(st)
    try:
        line = transport.read_line(time.monotonic() + STARTUP_TIMEOUT_S, 1 << 16)
        hello = json.loads(line) if line is not None else None
        if not isinstance(hello, dict) or hello.get("keeper") != "hello":
            raise SandboxError(f"the keeper did not start (first line {line!r:.200}; stderr "
                               f"{transport.stderr_tail()[-300:]!r})")
        _keeper_call(transport, "spawn", STARTUP_TIMEOUT_S)
        return _await_ready(exec_id, st, transport, keeper=int(hello["pid"]))
    except BaseException:
        st.close()
        raise


def _host_pid(procs: list[int], ns_pid: int) -> int:
    """The host pid of the container process whose pid inside the container is ns_pid (0 when none is)."""
    return next((p for p in procs if procfs.ns_pid(p) == ns_pid), 0)


def attach_and_start(api, cid: str) -> Any:
    """Attach to PID 1's stdin (the socket whose closing ends the container), then start it; on failure the
    container is removed and the error raised. Returns the socket."""
    try:
        watch = api.attach_socket(cid, params={"stdin": 1, "stream": 1})
        api.start(cid)
    except Exception:
        try:
            api.remove_container(cid, force=True)
        except Exception:  # noqa: BLE001, S110 - the create error is what matters
            pass
        raise
    return watch


class DockerSandbox:
    """One episode's container. Calls are serialised; close() removes the container."""

    backend = "docker"

    def __init__(self, owner: DockerBackend, box: _Container):
        self._owner = owner
        self._box = box
        self.image: str | None = owner.image
        self.config = owner.config
        self._lock = threading.Lock()
        self._interp: _Interp | None = box.interp
        box.interp = None
        self._call_before: _Counters | None = None  # the cgroup counters when the running call started
        self._death: tuple[bool, bool, str | None] | None = None  # (oom, pids, reset note) when its interpreter died
        self._probe = False  # whether the next run_python first checks that the interpreter still answers
        self._note: str | None = None  # said once in the next run_python's stderr (interpreter or sandbox reset)
        self._oom_seen = False
        self.closed = False

    @property
    def container_id(self) -> str:
        return self._box.id

    @property
    def episodes(self) -> int:
        """Episodes the container has served, this one included (above 1 only with reuse)."""
        return self._box.episodes

    # -- helpers ---------------------------------------------------------------------------------------------
    @property
    def _api(self):
        return self._owner.client.api

    def _counters(self) -> _Counters | None:
        return self._box.cgroup.read() if self._box.cgroup.available else None

    def _oom_since(self, before: _Counters | None) -> bool:
        if before is not None:
            return self._box.cgroup.read().oom_kill > before.oom_kill
        try:  # engine not local: State.OOMKilled is sticky, so only its first flip counts
            flag = bool(self._api.inspect_container(self._box.id)["State"].get("OOMKilled"))
        except Exception:  # noqa: BLE001 - an unreadable flag means no OOM seen
            return False
        new = flag and not self._oom_seen
        self._oom_seen = self._oom_seen or flag
        return new

    def _pids_hit(self, before: _Counters | None) -> bool:
        return before is not None and self._box.cgroup.read().pids_max > before.pids_max

    def _infra(self, what: str, e: BaseException, t0: float) -> ExecResult:
        return infra_result(self.backend, what, e, t0)

    def _start_exec(self, argv: list[str], *, stdin: bool, user: str | None = None) -> tuple[str, _Stream]:
        return _start_exec(self._api, self._box.id, argv, stdin=stdin, user=user or self._owner.exec_user,
                           workdir=self._owner.exec_workdir)

    def _exit_code(self, exec_id: str, wait_s: float = 1.0) -> int | None:
        end = time.monotonic() + wait_s
        while True:
            info = self._api.exec_inspect(exec_id)
            if not info.get("Running"):
                return info.get("ExitCode")
            if time.monotonic() > end:
                return None
            time.sleep(0.01)

    def _cleanup(self, keep_pid: int) -> str | None:
        """Kill every sandbox process except PID 1 and `keep_pid` (0: none); when even that cannot run (pids
        exhausted), replace the container. Returns a note for stderr, or None."""
        try:
            keeper = self._interp.keeper if keep_pid and self._interp is not None else 0
            ex_id, st = self._start_exec(["timeout", "-s", "KILL", "5", *programs.command(
                "python3", "cleanup", str(keep_pid), str(keeper))], stdin=False)
            deadline = time.monotonic() + 6
            while not st.eof and st.read_frames(deadline) is not None:
                pass
            st.close()
            if self._exit_code(ex_id) == 0:
                return None
        except Exception as e:
            if not _is_infra(e):
                raise
            log.warning("cleanup in container %s failed: %s", self._box.id[:12], e)
        return self._replace_container("leftover processes could not be killed inside the sandbox")

    def _replace_container(self, reason: str) -> str:
        """Swap in a fresh container for the rest of the episode (files and state are gone); returns the note."""
        self._drop_interpreter()
        old = self._box
        new = self._owner._take()
        self._owner._rekey(old.id, new.id, self)
        self._box = new
        self._interp, new.interp = new.interp, None
        self._owner._discard(old)
        return f"[sandbox] the sandbox was reset ({reason}): files and interpreter state from earlier calls are gone"

    def _drop_interpreter(self) -> None:
        if self._interp is not None:
            self._interp.client.close(kill=False)  # the interpreter exits on EOF; a dead container takes it along
        self._interp = None

    # -- Sandbox protocol ------------------------------------------------------------------------------------
    def exec(self, argv: list[str], *, timeout_s: float | None = None, stdin: bytes | None = None,
             user: str | None = None) -> ExecResult:
        """Run argv (no shell) in the sandbox as the backend's exec user in its workdir (nobody in /workspace; a
        task environment's own, sandbox/taskenv.py), with the call's limits.

        `user` (Docker only, "UID:GID", both non-zero) runs it as another unprivileged user instead: the judge's
        isolated runner (tasks/unittests.py) uses it so the solution, as nobody, cannot reach it. The container's
        limits stay as they are: no capability, no-new-privileges, whatever the uid.
        """
        if not argv:
            raise ValueError("exec needs a non-empty argv")
        if user is not None and not re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", user):
            raise ValueError(f"exec user must be 'UID:GID', both non-zero, got {user!r}")
        with self._lock:
            self._probe = True
            return self._exec(list(argv), timeout_s or self.config.timeout_s, stdin, user)

    def _exec(self, argv: list[str], timeout_s: float, stdin: bytes | None,
              user: str | None = None) -> ExecResult:
        t0 = time.perf_counter()
        if self.closed:
            return self._infra("exec", SandboxError("sandbox already closed"), t0)
        before = self._counters()
        cap = Capture(self.config.output_limit_bytes)
        cmd = ["timeout", "-s", "KILL", f"{timeout_s:.3f}", *argv]
        try:
            exec_id, st = self._start_exec(cmd, stdin=stdin is not None, user=user)
        except Exception as e:
            if not _is_infra(e):
                raise
            return self._infra("docker exec failed to start", e, t0)
        deadline = time.monotonic() + timeout_s + GRACE_S
        backstop = flooded = False
        try:
            if stdin is not None:
                try:
                    st.send(stdin, deadline)
                except (TimeoutError, OSError):
                    pass  # the program stopped reading stdin: what it printed still counts
                st.close_stdin()
            while not st.eof:
                frames = st.read_frames(deadline)
                if frames is None:
                    backstop = True
                    break
                for kind, data in frames:
                    cap.add(kind, data)
                if cap.flooded:
                    flooded = True
                    break
        finally:
            st.close()
        ran_s = time.perf_counter() - t0  # until the output ended: what the `timeout` wrapper's clock can have seen
        notes: list[str] = []
        exit_code: int | None = None
        try:
            if not (backstop or flooded):
                exit_code = self._exit_code(exec_id)
            # read the counters before any cleanup, which may swap the container
            oom = self._oom_since(before) if (before is not None or exit_code != 0 or backstop or flooded) else False
            pids = not oom and self._pids_hit(before)
            if backstop or flooded or pids:  # kill what the call left running (the forks that filled the table)
                n = self._cleanup(self._interp.pid if self._interp else 0)
                if n:
                    notes.append(n)
        except Exception as e:
            if not _is_infra(e):
                raise
            return self._infra("docker exec inspect failed", e, t0)
        elapsed = time.perf_counter() - t0
        # exit 137 is also a program killed by `kill -9` from inside: a timeout only when it ran that long (the
        # inspect calls above take time under load, so the clock stops where the output ended)
        timed_out = backstop or (exit_code in (124, 137) and ran_s >= timeout_s)
        if backstop:
            notes.append(f"[sandbox] no exit {GRACE_S:g}s past the {timeout_s:g}s timeout: killed by the backstop")
        # Docker reports a signal as exit 128 + n, which a program can also exit with: killed_by stays unknown
        verdict, note = exec_verdict(
            exit_code=exit_code, killed_by=None, timed_out=timed_out, flooded=flooded, flood_bytes=cap.flood,
            oom=oom, pids=pids, stderr=cap.err, memory_mb=self.config.memory_mb, pids_limit=self.config.pids_limit)
        return ExecResult(exit_code=None if (backstop or flooded) else exit_code, stdout=cap.stdout(),
                          stderr=cap.stderr([*notes, note]), timed_out=timed_out, oom_killed=oom,
                          truncated=cap.truncated or flooded, duration_ms=elapsed * 1000, verdict=verdict)

    def run_python(self, code: str, *, timeout_s: float | None = None) -> ExecResult:
        """Run code in this episode's persistent interpreter (globals kept across calls)."""
        with self._lock:
            return self._run_python(code, timeout_s or self.config.timeout_s)

    def _kill_interpreter(self) -> tuple[int | None, str | None]:
        """Kill the interpreter and everything else of the sandbox user; returns (exit status, reset note)."""
        it = self._interp
        self._drop_interpreter()
        note = self._cleanup(0)
        status = None
        if it is not None and note is None:
            code = self._exit_code(it.exec_id, wait_s=0.5)
            status = -(code - 128) if code is not None and code > 128 else code
        return status, note

    def _interpreter_died(self) -> int | None:
        """The client's kill callback (the interpreter hung, died or broke the protocol during a call): read the
        cgroup counters first (a reset may swap the container), then kill what is left; returns the exit status."""
        before = self._call_before
        oom = self._oom_since(before)
        pids = not oom and self._pids_hit(before)
        status, reset = self._kill_interpreter()
        self._death = (oom, pids, reset)
        return status

    def _run_python(self, code: str, timeout_s: float) -> ExecResult:
        t0 = time.perf_counter()
        if self.closed:
            return self._infra("run_python", SandboxError("sandbox already closed"), t0)
        before = self._counters()
        notes = [self._note] if self._note else []
        self._note = None
        probe, self._probe = self._probe, False  # a command ran since the last call: it may have killed the interpreter
        if self._interp is not None and (self._interp.client.gone() or (probe and not self._interp.client.answers())):
            gone_code = self._exit_code(self._interp.exec_id, wait_s=0.2) if self._interp.exec_id else None
            self._drop_interpreter()
            notes.append(f"{GONE_NOTE} (exit {gone_code})")
        try:
            if self._interp is None:
                self._interp = _start_interpreter(self._api, self._box.id, self._owner.exec_user,
                                                  self._owner.exec_workdir)
        except Exception as e:
            if not _is_infra(e) and not isinstance(e, SandboxError):
                raise
            return self._infra("starting the interpreter failed", e, t0)
        it = self._interp
        it.client.kill = self._interpreter_died
        self._call_before, self._death = before, None
        try:
            raw = it.client.call_raw(code, timeout_s, self.config.output_limit_bytes)
            if raw["died"]:
                oom, pids, reset = self._death or (False, False, None)
                if reset:
                    notes.append(reset)
            else:
                failed = raw["timed_out"] or raw["error"] is not None or raw["exit_code"] not in (None, 0)
                # cgroup counters are cheap (two small files): always; without them, inspect only on failure
                oom = self._oom_since(before) if (failed or before is not None) else False
                pids = not oom and self._pids_hit(before)
                if pids:
                    n = self._cleanup(it.pid)  # the forks that filled the pids table
                    if n:
                        notes.append(n)
        except Exception as e:
            self._drop_interpreter()
            if not _is_infra(e):
                raise
            return self._infra("the interpreter connection failed", e, t0)
        fields = exec_fields(raw, oom=oom, pids=pids, memory_mb=self.config.memory_mb,
                             pids_limit=self.config.pids_limit)
        fields["stderr"] = with_notes(fields["stderr"], notes)
        fields["duration_ms"] = (time.perf_counter() - t0) * 1000
        return ExecResult(**fields)

    def write_files(self, files: dict[str, str]) -> None:
        """Write text files under /workspace (relative paths; parents created; symlinks replaced, never followed)."""
        with self._lock:
            write_files(self._exec, "python3", files, self.config.timeout_s)

    def close(self) -> None:
        """End the episode: remove the container (force), or with reuse hand it back to be reset and checked for
        the next episode (when a call is still in flight in another thread, it is removed); this handle stays
        closed. Idempotent."""
        if self.closed:
            return
        reuse = self._owner.reuse and self._lock.acquire(blocking=False)
        try:
            self.closed = True
            if reuse:  # the reset talks to the keeper through this stream
                self._box.interp, self._interp = self._interp, None
            self._drop_interpreter()
            self._owner._release(self, reuse=reuse)
        finally:
            if reuse:
                self._lock.release()


class DockerBackend:
    """Docker engine with a warm pool of containers: fresh ones, and with `config.reuse` (the default on Docker)
    containers whose episode ended, reset and checked (see the module docstring); `stats` counts containers
    started, episodes that got a reset one, and resets that failed (the container was removed)."""

    name = "docker"
    exec_user = SANDBOX_USER  # who every exec and the interpreter run as, and where (sandbox/taskenv.py sets its own)
    exec_workdir = WORKDIR

    def __init__(self, config: SandboxConfig, *, pool_size: int = 2, max_sandboxes: int = 64,
                 acquire_timeout_s: float = 120.0, client=None):
        self.config = config
        self.reuse = config.reuse is not False  # None: the default, on for Docker
        self.stats = {"started": 0, "reused": 0, "reset_failed": 0}
        self._dirty: queue.Queue[_Container] = queue.Queue()  # closed by their episode, waiting for a reset
        self.pool_size = max(0, pool_size)
        self.client = client or docker_client()
        img = image_id(config.image, self.client)
        if img is None:
            raise SandboxUnavailable(
                f"sandbox image {config.image!r} is not in the Docker engine; fix: flywheel sandbox build-image "
                f"(or docker build -t {config.image} sandbox/)")
        self.image: str | None = img
        self.owner = owner_tag()
        self.instance = uuid.uuid4().hex
        self._acquire_timeout_s = acquire_timeout_s
        self._slots = threading.BoundedSemaphore(max_sandboxes)
        self._max = max_sandboxes
        self._pool: queue.Queue[_Container] = queue.Queue()
        self._active: dict[str, DockerSandbox] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._closed = False
        self.last_create_error: str | None = None
        try:
            removed = reap(self.client)
            if removed:
                log.info("reaper removed %d stray sandbox container(s)", removed)
        except Exception as e:  # noqa: BLE001 - reaping is housekeeping; never block the backend on it
            log.warning("reaper failed: %s", e)
        self._in_flight = 0
        self._trash: queue.Queue[str | None] = queue.Queue()
        self._remover = threading.Thread(target=self._remove_loop, name="flywheel-docker-remove", daemon=True)
        self._remover.start()
        # containers are created in parallel: most of a create is waiting on the engine (mounts, runc)
        self._fillers = [threading.Thread(target=self._fill_loop, name=f"flywheel-docker-pool-{i}", daemon=True)
                         for i in range(min(self.pool_size, FILL_THREADS))]
        for t in self._fillers:
            t.start()
        _live_backends.add(self)

    # -- containers --------------------------------------------------------------------------------------------
    def _create_once(self, prestart: bool = False) -> _Container:
        c = self.config
        api = self.client.api
        from docker.types import Ulimit

        mb = f"{c.memory_mb}m"
        tmpfs_opt = f"size={c.tmpfs_mb}m,mode=1777"
        host_config = api.create_host_config(
            network_mode="none", mem_limit=mb, memswap_limit=mb, pids_limit=c.pids_limit,
            nano_cpus=int(c.cpus * 1e9), read_only=True, tmpfs={"/tmp": tmpfs_opt, WORKDIR: tmpfs_opt},
            shm_size=f"{c.tmpfs_mb}m", cap_drop=["ALL"], security_opt=["no-new-privileges"], auto_remove=True,
            ipc_mode="private", ulimits=[Ulimit(name="core", soft=0, hard=0), Ulimit(name="nofile", soft=1024, hard=1024)],
        )
        cont = api.create_container(
            c.image, command=programs.command("python3", "pid1"), user=SANDBOX_USER, working_dir=WORKDIR,
            hostname="sandbox", stdin_open=True, network_disabled=True, environment=[], use_config_proxy=False,
            labels={LABEL: "1", OWNER_LABEL: self.owner, BACKEND_LABEL: self.instance}, host_config=host_config,
        )
        cid = cont["Id"]
        box = _Container(cid, attach_and_start(api, cid), _Cgroup(cid))
        if self.reuse and box.cgroup.resettable:
            procs = box.cgroup.processes()  # PID 1 alone, before any exec
            box.pid1 = procs[0] if len(procs) == 1 else 0
            box.limits = box.cgroup.limit_values()
        if prestart:
            try:
                if self.reuse:
                    box.interp = _start_keeper(api, cid)
                    if box.pid1:
                        box.keeper = _host_pid(box.cgroup.processes(), box.interp.keeper)
                    box.baseline = _reset_check(box.interp, empty=False)
                    box.baseline.pop("problems")
                else:
                    box.interp = _start_interpreter(api, cid)
                    _warm(box.interp)
            except Exception:
                self._discard(box)
                raise
        with self._lock:
            self.stats["started"] += 1
        return box

    def _create(self, prestart: bool = False) -> _Container:
        delay = 0.2
        last: BaseException | None = None
        for attempt in range(CREATE_TRIES):
            if self._stop.is_set():
                raise SandboxError("the Docker backend is shut down")
            try:
                box = self._create_once(prestart)
                self.last_create_error = None
                return box
            except Exception as e:
                if not _is_infra(e) and not isinstance(e, SandboxError):
                    raise
                last = e
                self.last_create_error = f"{type(e).__name__}: {e}"
                log.warning("creating a sandbox container failed (try %d/%d): %s", attempt + 1, CREATE_TRIES, e)
                time.sleep(delay)
                delay *= 2
        raise SandboxError(f"creating a sandbox container failed {CREATE_TRIES} times: {type(last).__name__}: {last}")

    def _take(self) -> _Container:
        """A started container: from the pool when one is ready (fresh, or reset and checked), else with reuse one
        whose episode ended, reset here (cheaper than a create), else created now."""
        while True:
            try:
                box = self._pool.get_nowait()
            except queue.Empty:
                box = None
            self._wake.set()
            if box is None:
                try:
                    box = self._dirty.get_nowait()
                except queue.Empty:
                    return self._create(prestart=self.reuse)  # reuse: the baseline comes from the prestart
                if self._reset_one(box, keep=True):
                    return box
                continue
            if self._alive(box):
                return box
            self._discard(box)

    # -- reuse ---------------------------------------------------------------------------------------------------
    def _recycle(self, box: _Container) -> None:
        """Queue a container whose episode ended for a reset by the pool threads (reset now when there are none)."""
        if not self._fillers:
            self._reset_one(box)
            return
        with self._lock:
            if not self._closed:
                self._dirty.put(box)
                self._wake.set()
                return
        self._discard(box)

    def _reset_one(self, box: _Container, *, keep: bool = False) -> bool:
        """Reset box; True when it passed every check. It goes to the pool, or with `keep` to the caller; a box
        that fails a check is removed and counted in stats["reset_failed"]."""
        why = self._reset(box)
        if why is None:
            with self._lock:
                if not self._closed:
                    if not keep:
                        self._pool.put(box)
                    return True
        else:
            with self._lock:
                self.stats["reset_failed"] += 1
                first = self.stats["reset_failed"] == 1
            # the first one is a warning: when every reset fails (no cgroup here), Docker runs at fresh-container speed
            log.log(logging.WARNING if first else logging.INFO, "docker sandbox %s: not reused, its reset failed: %s",
                    box.id[:12], why)
        self._discard(box)
        return False

    def _reset(self, box: _Container) -> str | None:
        """Make a used container as good as new: the host kills every process but PID 1 (cgroup frozen, so none
        can fork meanwhile), a fresh interpreter empties the writable folders and reports what is left, and the
        host compares that with the container's fresh state. None when it passed, else why not."""
        cg = box.cgroup
        if os.geteuid() != 0 or not box.pid1 or box.baseline is None or not cg.resettable:
            return ("the host cannot reset this container (it needs root and the container's cgroup on this host); "
                    "fix: run as root next to the engine, or set sandbox.reuse=false")
        it, box.interp = box.interp, None
        try:
            if it is not None and it.keeper and box.keeper and it.client.alive and not it.client.gone():
                try:
                    _keeper_call(it.transport, "reset")  # the interpreter is killed and reaped, its pipes closed
                except (SandboxError, OSError, TimeoutError, ValueError) as e:
                    return f"the keeper did not reset: {e}"
                why = self._kill_all_but(box, {box.pid1, box.keeper})
                if why is not None:
                    return why
                _keeper_call(it.transport, "spawn")  # the old client goes with its interpreter: a new one
                box.interp, it = _await_ready(it.exec_id, it.stream, it.transport, it.keeper), None
            else:  # the keeper is gone (user code killed it, or the interpreter died): a new one, by exec
                if it is not None:
                    it.stream.close()
                it = None
                why = self._kill_all_but(box, {box.pid1})
                if why is not None:
                    return why
                box.interp = _start_keeper(self.client.api, box.id)
                box.keeper = _host_pid(cg.processes(), box.interp.keeper)
            state = _reset_check(box.interp, empty=True)
        except Exception as e:
            if not _is_infra(e) and not isinstance(e, (ValueError, TimeoutError)):
                raise
            return f"starting the next interpreter failed: {type(e).__name__}: {e}"
        finally:
            if it is not None:
                it.stream.close()
        problems = state.pop("problems")
        if problems:
            return "; ".join(problems)[:500]
        if state != box.baseline:
            changed = sorted(k for k in state if state[k] != box.baseline.get(k))
            return f"changed since the container was fresh: {', '.join(changed)}"
        try:
            procs = cg.processes()
            limits = cg.limit_values()
        except OSError as e:
            return f"cannot read the container's cgroup: {e}"
        if len(procs) != 3 or box.pid1 not in procs or box.keeper not in procs:
            return (f"the host sees {len(procs)} processes in the container, expected PID 1, the keeper and the "
                    "interpreter")
        if limits != box.limits:
            return f"the container's cgroup limits changed: {box.limits} -> {limits}"
        return None

    def _kill_all_but(self, box: _Container, spare: set[int]) -> str | None:
        """SIGKILL every process of the container but `spare` (host pids: PID 1, the keeper) from the host, with the
        cgroup frozen so that none can fork meanwhile; wait until only those are left (PID 1 reaps the orphans).
        None when done, else why not."""
        cg = box.cgroup
        assert cg.freeze is not None
        path, frozen, thawed = cg.freeze
        deadline = time.monotonic() + RESET_WAIT_S
        try:
            path.write_text(frozen)
            state = path if path.name == "freezer.state" else path.parent / "cgroup.events"
            while not (state.read_text().strip() == "FROZEN" or "frozen 1" in state.read_text()):
                if time.monotonic() > deadline:
                    return "the container's processes could not be frozen"
                time.sleep(0.001)
            for pid in cg.processes():
                if pid not in spare:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        except OSError as e:
            return f"freezing or killing the container's processes failed: {e}"
        finally:
            try:
                path.write_text(thawed)
            except OSError as e:
                return f"thawing the container failed: {e}"
        while True:
            try:
                left = cg.processes()
            except OSError as e:
                return f"cannot read the container's processes: {e}"
            if sorted(left) == sorted(spare):
                return None
            if not spare <= set(left):
                return "PID 1 or the keeper of the container is gone"
            if time.monotonic() > deadline:
                return f"{len(left) - len(spare)} process(es) survived the reset"
            time.sleep(0.001)

    def _alive(self, box: _Container) -> bool:
        if box.cgroup.available:  # the cgroup directory goes away with the container
            return box.cgroup.mem is not None and box.cgroup.mem.exists()
        try:
            return self.client.api.inspect_container(box.id)["State"]["Running"]
        except Exception:  # noqa: BLE001 - gone or unreachable: not alive
            return False

    def _discard(self, box: _Container) -> None:
        """End a container now (closing PID 1's stdin makes it exit, which kills every process in it) and have the
        remover thread delete it (force) in the background; shutdown() waits for the deletions."""
        if box.interp is not None:
            box.interp.stream.close()
            box.interp = None
        try:
            box.watch.close()
        except Exception:  # noqa: BLE001, S110 - closing a dead socket is best effort
            pass
        if self._closed and not self._remover.is_alive():  # after shutdown: nobody left to empty the trash
            try:
                self.client.api.remove_container(box.id, force=True)
            except Exception as e:  # noqa: BLE001 - logged; the reaper is the backstop
                log.warning("removing container %s failed: %s", box.id[:12], e)
            return
        self._trash.put(box.id)

    def _remove_loop(self) -> None:
        while True:
            cid = self._trash.get()
            if cid is None:
                return
            try:
                self.client.api.remove_container(cid, force=True)
            except Exception as e:  # noqa: BLE001 - removal is best effort; logged, and the reaper is the backstop
                if "No such container" not in str(e) and "already in progress" not in str(e):
                    log.warning("removing container %s failed: %s", cid[:12], e)

    def _fill_loop(self) -> None:
        while not self._stop.is_set():
            try:
                dirty = self._dirty.get_nowait()
            except queue.Empty:
                dirty = None
            if dirty is not None:
                self._reset_one(dirty)
                continue
            with self._lock:
                coming = self._pool.qsize() + self._dirty.qsize() + self._in_flight
                need = coming < self.pool_size
                if self.reuse:  # containers in use come back after their episode: keep only REUSE_SPARE more
                    need = need and coming + len(self._active) < self.pool_size + REUSE_SPARE
                if need:
                    self._in_flight += 1
            if not need:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            try:
                box = self._create(prestart=True)
            except Exception as e:  # noqa: BLE001 - the loop retries; logged
                with self._lock:
                    self._in_flight -= 1
                log.warning("pool refill failed: %s", e)
                self._stop.wait(2.0)
                continue
            with self._lock:
                self._in_flight -= 1
                if not self._stop.is_set():
                    self._pool.put(box)
                    continue
            self._discard(box)

    # -- Backend protocol ----------------------------------------------------------------------------------------
    def acquire(self) -> DockerSandbox:
        """A clean container for one episode (raises SandboxError when none can be had: infra, retried by callers)."""
        if self._closed:
            raise SandboxError("the Docker backend is shut down")
        if not self._slots.acquire(timeout=self._acquire_timeout_s):
            raise SandboxError(f"sandbox pool exhausted: {self._max} sandboxes in use for "
                               f"{self._acquire_timeout_s:g}s; close finished episodes or raise max_sandboxes")
        try:
            box = self._take()
            sb = DockerSandbox(self, box)
        except BaseException:
            self._slots.release()
            raise
        with self._lock:
            box.episodes += 1
            if box.episodes > 1:
                self.stats["reused"] += 1
            self._active[sb.container_id] = sb
        return sb

    def _rekey(self, old_id: str, new_id: str, sb: DockerSandbox) -> None:
        with self._lock:
            self._active.pop(old_id, None)
            self._active[new_id] = sb

    def _release(self, sb: DockerSandbox, reuse: bool = False) -> None:
        with self._lock:
            present = self._active.pop(sb.container_id, None) is not None
        if reuse and present and not self._closed:
            self._recycle(sb._box)
        else:
            self._discard(sb._box)
        if present:
            self._slots.release()

    def shutdown(self) -> None:
        """Stop the refill threads and remove every container of this backend (pooled and in use); returns when
        they are deleted."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake.set()
        for t in self._fillers:
            t.join(timeout=60)
        with self._lock:
            active = list(self._active.values())
        for sb in active:
            sb.close()
        for q in (self._pool, self._dirty):
            while True:
                try:
                    self._discard(q.get_nowait())
                except queue.Empty:
                    break
        self._trash.put(None)
        self._remover.join(timeout=120)
        self._sweep()
        _live_backends.discard(self)

    def _sweep(self) -> None:
        """Remove whatever of this backend is still there (a refill that outlived its join, a swap during
        shutdown): the guarantee of no leftovers must not hang on thread timing."""
        try:
            for c in self.client.api.containers(all=True, filters={"label": f"{BACKEND_LABEL}={self.instance}"}):
                self.client.api.remove_container(c["Id"], force=True)
        except Exception as e:  # noqa: BLE001 - the reaper is the backstop; say so
            log.warning("final sweep of backend %s failed (the reaper will remove strays): %s", self.instance[:8], e)

    def __enter__(self) -> DockerBackend:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


_live_backends: weakref.WeakSet[DockerBackend] = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    for b in list(_live_backends):
        try:
            b.shutdown()
        except Exception:  # noqa: BLE001, S110 - exiting: nothing left to report to
            pass
