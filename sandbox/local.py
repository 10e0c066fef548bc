"""Local sandbox backend on bubblewrap: the same contract and result fields as the Docker backend, no engine needed.

`LocalBackend(config).acquire()` hands out one bubblewrap sandbox per episode (a small pool is started ahead by a
background thread, so acquiring is immediate; by default a sandbox is never reused, see Reuse): new user, pid, mount, network, ipc and
uts namespaces (no network: only a loopback), a read-only root made of read-only binds of /usr (and the /lib, /bin
links), a generated /etc/passwd and /etc/group, private /proc and /dev, size-limited tmpfs at /tmp, /workspace and
/dev/shm (fresh per episode: nothing of one episode is visible to the next), user nobody (65534) with no
capabilities, no-new-privileges, no nested user namespaces, and an environment of our own (never the host's).

PID 1 of the sandbox is a tiny holder (sandbox/guest/holder.py) that reaps orphans, cannot be killed from inside (the kernel drops SIGKILL
sent to a namespace's init from inside it) and exits when its stdin closes, that is when the owning process dies,
even by SIGKILL: the kernel then kills every process of the sandbox. Every command (`exec`, `write_files`, the
persistent interpreter of `run_python`) enters the running sandbox through a small helper (sandbox/guest/enter.py, run
by the host's /usr/bin/python3) that joins its namespaces, drops to nobody, applies the rlimits and execs the command;
so calls share the sandbox's files like `docker exec` does. `run_python`'s interpreter is not started that way:
each sandbox has a zygote (sandbox/guest/zygote.py), a pristine Python process entered once, that forks a fresh
interpreter per episode (and after an interpreter dies) in about a millisecond.

Reuse (`SandboxConfig.reuse`): closing an episode hands its sandbox to the pool thread instead of killing it. The
zygote kills every other process of the sandbox, empties /tmp, /workspace and /dev/shm and checks that nothing is
left (no process, no file, folder modes and extended attributes as at start, no System V IPC object, the same
kernel keys; POSIX message queues are refused by RLIMIT_MSGQUEUE=0); the host checks again that only PID 1 and the
zygote run, and a new handle with a freshly forked interpreter goes back to the pool. Any check failing, a zygote
that does not answer, or a zygote that user code killed during the episode (it runs as the same user) means the
sandbox is destroyed instead. The old handle stays closed. What a reset does not renew: the namespaces themselves
(pid and inode numbers continue, which tells a later episode roughly how many processes and files earlier ones
made), the loopback interface's counters, and the sandbox's CPU placement. A fresh sandbox per episode costs ~60 ms
of machine CPU; a reset one ~3 ms (benchmarks/rollout.py --backend local --reuse).

Limits: RLIMIT_AS (memory_mb, per process: a sandbox with n processes may use up to n x memory_mb; there is no
cgroup here), RLIMIT_NPROC (pids_limit; counted per sandbox because each sandbox has its own user namespace and,
when we are root, runs as host user nobody: RLIMIT_NPROC is not enforced for host root), RLIMIT_FSIZE (tmpfs_mb),
RLIMIT_CPU for `exec` calls (a backstop past the wall-clock limit), CPU affinity to ceil(cpus) cores, wall-clock
timeouts that kill the call's process group (and, on timeout, every process of the sandbox except PID 1 and the
interpreter), stdout/stderr caps with a truncated flag, and an output flood far past the cap kills an `exec` call.
There is no seccomp filter (Docker adds one).

The parts every backend shares are not here: the verdict ladders (sandbox/verdicts.py), the capture rule
(sandbox/capture.py), the file writer (sandbox/files.py), the warm pool (sandbox/pool.py), the in-sandbox programs
(sandbox/guest/: holder, enter helper, zygote, kernel, reset) and the interpreter-protocol client, which this module
plugs into pipes (`PipeTransport`, sandbox/interpreter.py).
This module does not choose a backend (sandbox/backend.py) and does not talk to Docker.
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
import weakref
from typing import Self

from sandbox import bwrap, procfs, programs
from sandbox.capture import STDERR, STDOUT, Capture, with_notes
from sandbox.files import write_files
from sandbox.interpreter import GONE_NOTE, InterpreterClient, InterpreterError, PipeTransport
from sandbox.pool import PoolDriver, PoolSettings, WarmPool
from sandbox.reaper import MARKER, owner_arg
from sandbox.result import ExecResult, SandboxConfig, SandboxError, SandboxUnavailable
from sandbox.verdicts import exec_fields, exec_verdict, infra_result

log = logging.getLogger(__name__)

WORKDIR = "/workspace"
SANDBOX_UID = 65534
GRACE_S = 2.0  # how long past its timeout a call may run before the host kills it
START_TIMEOUT_S = 10.0
STRAY_WAIT_S = 2.0  # how long killing a call's leftover processes waits for them to exit
ZYGOTE_TIMEOUT_S = 5.0  # a zygote that does not answer a request in this time is broken: the sandbox is destroyed
class LocalSandbox:
    """One episode's bubblewrap sandbox. Thread-safe: calls are serialised."""

    backend = "local"
    image: str | None = None

    def __init__(self, owner: LocalBackend, index: int):
        self.config = owner.config
        self._owner = owner
        self._lock = threading.RLock()
        self._interp: InterpreterClient | None = None
        self._zygote: socket.socket | None = None
        self._zygote_proc: subprocess.Popen | None = None  # the enter helper that waits on the zygote
        self._zygote_pid = 0  # the zygote's host pid
        self._zygote_ns_pid = 0  # and its pid inside the sandbox
        self.episodes = 1  # how many episodes this sandbox has served, this one included
        self.reusable = True  # False once its zygote had to be restarted (see _start_interpreter)
        self._note: str | None = None
        self.closed = False
        self._slot: weakref.finalize | None = None  # set by acquire(): frees the backend's slot once
        cores = sorted(os.sched_getaffinity(0))
        n = min(len(cores), max(1, math.ceil(self.config.cpus)))
        self._cpus = [cores[(index * n + i) % len(cores)] for i in range(n)]
        self._start()
        if owner.prestart_interpreter:
            try:
                self._start_interpreter()
            except (OSError, SandboxError) as e:  # run_python retries the start and reports infra_error then
                log.warning("local sandbox: prestarting the interpreter failed: %s", e)

    # -- lifecycle -----------------------------------------------------------------------------------------------
    def _start(self) -> None:
        cfg, o = self.config, self._owner
        size = str(cfg.tmpfs_mb * 1024 * 1024)
        passwd, group = bwrap.memfd("passwd", bwrap.PASSWD), bwrap.memfd("group", bwrap.GROUP)
        # bwrap's --info-fd is a memfd, not a pipe: bwrap's parent writes the info and only then lets its child (the
        # sandbox) go on, and a write into a pipe whose reader is gone (this process SIGKILLed during the start)
        # would end bwrap's parent with SIGPIPE before that. A write into a memfd cannot fail that way.
        info = bwrap.memfd("bwrap-info", "")
        args = [
            o.bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--as-pid-1", "--new-session",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox",
            *bwrap.root_binds(),
            "--ro-bind-data", str(passwd), "/etc/passwd", "--ro-bind-data", str(group), "/etc/group",
            "--proc", "/proc", "--dev", "/dev",
            "--size", size, "--tmpfs", "/dev/shm", "--size", size, "--tmpfs", "/tmp",
            "--size", size, "--tmpfs", WORKDIR,
            "--remount-ro", "/dev", "--remount-ro", "/",
            "--chdir", WORKDIR, "--clearenv", *[x for k, v in bwrap.SANDBOX_ENV.items() for x in ("--setenv", k, v)],
            "--info-fd", str(info),
            "--", *programs.command(o.python, "holder", MARKER, owner_arg()),
        ]
        args = [*o.host_prefix, *args]
        try:
            self._holder = subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(passwd, group, info), start_new_session=True)
        except OSError as e:
            os.close(info)
            raise SandboxUnavailable(f"cannot run {o.bwrap}: {e}; fix: apt-get install bubblewrap") from e
        finally:
            for fd in (passwd, group):
                os.close(fd)
        try:
            self._await_holder(info)
        except BaseException:
            if self._holder.poll() is None:
                bwrap.killpg(self._holder)  # with bwrap's child: killed alone before its go-ahead, it would wait forever
                self._holder.wait()
            raise
        self._holder.stdout.close()
        self._holder.stderr.close()

    def _await_holder(self, info_fd: int) -> None:
        """Wait for PID 1's ready byte and read bwrap's info (the holder's host pid; bwrap wrote it into the memfd
        info_fd before its child could start PID 1, so it is whole once the ready byte came)."""
        assert self._holder.stdout is not None and self._holder.stderr is not None
        try:
            poller = select.poll()  # not select(): it fails on descriptors past 1024, which a busy host reaches
            poller.register(self._holder.stdout.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
            ready = poller.poll(START_TIMEOUT_S * 1000)
            got = os.read(self._holder.stdout.fileno(), 1) if ready else b""
            if got != b"R":
                # bwrap's whole group (its parent, and its child while that still waits for the go-ahead: killed
                # alone, the parent leaves it waiting forever), and our end of PID 1's stdin (PID 1, when it came up
                # after the timeout, then exits). stderr is read only as far as it is there: PID 1 holds it open
                # until it exits, and reading it to the end here hung a start that a loaded host made slow.
                bwrap.killpg(self._holder)
                self._holder.stdin.close()
                err = bwrap.read_available(self._holder.stderr.fileno()).decode(errors="replace").strip()
                self._holder.wait()
                raise SandboxUnavailable(
                    f"bubblewrap did not start a sandbox (exit {self._holder.returncode}): {err or 'no output'}; "
                    "fix: allow unprivileged user namespaces (sysctl user.max_user_namespaces=15000 and, on "
                    "Debian/Ubuntu, kernel.unprivileged_userns_clone=1 or the AppArmor userns restriction off)")
            info = os.pread(info_fd, 65536, 0)
        finally:
            os.close(info_fd)
        try:
            self.holder_pid = int(json.loads(info)["child-pid"])
            self._holder_fd = os.pidfd_open(self.holder_pid)  # signals reach this process, never a reused pid
            self._pidns = os.readlink(f"/proc/{self.holder_pid}/ns/pid")
        except (ValueError, KeyError, OSError) as e:
            raise SandboxError(f"bubblewrap gave no usable sandbox pid ({e}): {info[:200]!r}") from e

    def _spec(self, exec_call: bool, timeout_s: float) -> str:
        mb = 1024 * 1024
        cfg = self.config
        rlimits: dict[str, tuple[int, int]] = {
            "RLIMIT_AS": (cfg.memory_mb * mb, cfg.memory_mb * mb),
            "RLIMIT_NPROC": (cfg.pids_limit, cfg.pids_limit),
            # above the tmpfs size, so a full disk reads ENOSPC as on Docker; it still caps any file
            "RLIMIT_FSIZE": ((cfg.tmpfs_mb + 1) * mb, (cfg.tmpfs_mb + 1) * mb),
            "RLIMIT_CORE": (0, 0),
            "RLIMIT_NOFILE": (1024, 1024),
            "RLIMIT_MSGQUEUE": (0, 0),  # no POSIX message queues: they would outlive an episode in a reused sandbox
        }
        if exec_call:
            cpu = math.ceil(timeout_s * max(1.0, cfg.cpus)) + 1
            rlimits["RLIMIT_CPU"] = (cpu, cpu + 1)
        return json.dumps({"rlimits": rlimits, "cpus": self._cpus, "uid": SANDBOX_UID, "gid": SANDBOX_UID,
                           "env": bwrap.SANDBOX_ENV, "cwd": WORKDIR, "pidns": self._pidns})

    def _enter(self, argv: list[str], *, exec_call: bool, timeout_s: float,
               stdin: bool | int) -> tuple[subprocess.Popen, int]:
        """Start argv inside the sandbox; returns the helper process and the read end of its status pipe. `stdin`:
        True for a pipe, False for /dev/null, or a file descriptor to hand over."""
        if self._holder.poll() is not None:
            raise SandboxError(f"the sandbox's PID 1 is gone (bwrap exit {self._holder.returncode})")
        status_r, status_w = os.pipe()
        try:
            proc = subprocess.Popen(
                programs.command(self._owner.python, "enter", str(self.holder_pid), str(status_w),
                                 self._spec(exec_call, timeout_s), *argv),
                stdin=(subprocess.PIPE if stdin else subprocess.DEVNULL) if isinstance(stdin, bool) else stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, pass_fds=(status_w,), start_new_session=True, env={})
        except OSError:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        return proc, status_r

    def _kill_strays(self, keep: set[int]) -> int:
        """SIGKILL every process of this sandbox except PID 1 and the host pids in `keep`; returns how many.

        Returns once they have exited (at most STRAY_WAIT_S): until then they still hold the sandbox's pids limit,
        and the next call would find it full (a fork bomb's members take a few ms to die)."""
        killed: set[int] = set()
        for _ in range(3):  # a fork racing the scan is caught by the next pass
            for pid in self.processes():
                if pid in keep or pid == self.holder_pid:
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except OSError:
                    continue
        left, end = set(killed), time.monotonic() + STRAY_WAIT_S
        while left and time.monotonic() < end:
            left = {pid for pid in left if procfs.running(pid)}
            if left:
                time.sleep(0.005)
        return len(killed)

    def _children_of(self, helper_pid: int) -> list[int]:
        """Host pids of the sandbox processes whose parent is the given enter helper."""
        stats = (procfs.stat(pid) for pid in self.processes())
        return [st.pid for st in stats if st is not None and st.ppid == helper_pid]

    def _interp_keep(self) -> set[int]:
        """Host pids of the zygote, its enter helper and the interpreter (spared by _kill_strays)."""
        p = self._zygote_proc
        if p is None or p.poll() is not None:
            return set()
        return {p.pid, self._zygote_pid, *self._children_of(self._zygote_pid)}

    def processes(self) -> list[int]:
        """Host pids of every process in this sandbox (PID 1 included); empty once closed."""
        if self.closed:
            return []
        return [pid for pid in procfs.pids() if procfs.namespace(pid, "pid") == self._pidns]

    def alive(self) -> bool:
        """Whether the sandbox's PID 1 is still running (and close() was not called)."""
        return not self.closed and self._holder.poll() is None

    def _tasks(self) -> int:
        """Threads of all processes in the sandbox (what RLIMIT_NPROC counts), read from the sandbox's own /proc."""
        proc = f"/proc/{self.holder_pid}/root/proc"
        n = 0
        try:
            names = os.listdir(proc)
        except OSError:
            return 0
        for d in names:
            if d.isdigit():
                try:
                    n += len(os.listdir(f"{proc}/{d}/task"))
                except OSError:
                    continue
        return n

    def _pids_hit(self, stderr: bytes | bytearray | str = b"", peak: int = 0) -> bool:
        """Whether the call hit the sandbox's pids limit: its stderr ends with a failed fork (EAGAIN, which
        RLIMIT_NPROC gives), or it came near the limit (`peak`: the most tasks seen while it ran, if sampled) or
        left the sandbox near it (a fork bomb holding its processes). The local backend has no cgroup counting
        failed forks: a bomb whose members exit silently when their fork fails is only seen by these counts.

        A normal call leaves a handful of tasks and costs one small /proc listing. When more than half the limit
        is in use, forks may still be in flight: wait (at most 0.3 s) for the count to settle before judging.
        """
        if bwrap.fork_failed(stderr):
            return True
        limit = self.config.pids_limit
        near = limit - max(2, limit // 10)  # processes that failed their fork exit and free a few pids
        if peak >= near:
            return True
        n = self._tasks()
        end = time.monotonic() + 0.3
        while limit // 2 < n < near and time.monotonic() < end:
            time.sleep(0.02)
            m = self._tasks()
            if m == n:
                break
            n = m
        return n >= near

    def _infra(self, what: str, e: BaseException, t0: float) -> ExecResult:
        return infra_result(self.backend, what, e, t0)

    # -- exec ----------------------------------------------------------------------------------------------------
    def exec(self, argv: list[str], *, timeout_s: float | None = None, stdin: bytes | None = None) -> ExecResult:
        """Run argv (no shell) in the sandbox as user nobody in /workspace, with the call's limits."""
        if not argv:
            raise ValueError("exec needs a non-empty argv")
        with self._lock:
            return self._exec([str(a) for a in argv], timeout_s or self.config.timeout_s, stdin)

    def _exec(self, argv: list[str], timeout_s: float, stdin: bytes | None) -> ExecResult:
        t0 = time.perf_counter()
        if self.closed:
            return self._infra("exec", SandboxError("sandbox already closed"), t0)
        # Under `timeout -s KILL`, as on Docker: a second clock inside, and the same exit codes (a command killed
        # from inside the sandbox, e.g. by `kill -9 -1`, reads as its parent killed: an error).
        wrapped = ["timeout", "-s", "KILL", f"{timeout_s + GRACE_S:.3f}", *argv]
        try:
            proc, status_r = self._enter(wrapped, exec_call=True, timeout_s=timeout_s, stdin=stdin is not None)
        except (OSError, SandboxError) as e:
            return self._infra("starting the command failed", e, t0)
        cap = Capture(self.config.output_limit_bytes)
        assert proc.stdout is not None and proc.stderr is not None
        streams = {proc.stdout.fileno(): STDOUT, proc.stderr.fileno(): STDERR}
        open_fds = set(streams)
        for fd in streams:
            os.set_blocking(fd, False)
        pending = memoryview(stdin or b"")
        if proc.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            if not pending:
                proc.stdin.close()

        def drain(fd: int) -> None:
            while True:
                try:
                    data = os.read(fd, 1 << 16)
                except BlockingIOError:
                    return
                if not data:
                    open_fds.discard(fd)
                    return
                cap.add(streams[fd], data)

        pidfd = os.pidfd_open(proc.pid)
        deadline = time.monotonic() + timeout_s
        timed_out = flooded = False
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                writing = proc.stdin is not None and not proc.stdin.closed
                poller = select.poll()  # not select(): it fails on descriptors past 1024
                for fd in (*open_fds, pidfd):
                    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
                if writing:
                    poller.register(proc.stdin.fileno(), select.POLLOUT | select.POLLERR)
                events = poller.poll(left * 1000)
                r = [fd for fd, ev in events if ev & (select.POLLIN | select.POLLHUP | select.POLLERR)
                     and (not writing or fd != proc.stdin.fileno())]
                w = writing and any(fd == proc.stdin.fileno() for fd, _ in events)
                for fd in r:
                    if fd != pidfd:
                        drain(fd)
                if w and proc.stdin is not None:
                    try:
                        n = os.write(proc.stdin.fileno(), pending[: 1 << 16])
                        pending = pending[n:]
                    except BlockingIOError:
                        pass
                    except BrokenPipeError:
                        pending = memoryview(b"")
                    if not pending:
                        proc.stdin.close()
                if cap.flooded:
                    flooded = True
                    break
                if pidfd in r:
                    break
        finally:
            os.close(pidfd)
        notes = []
        pids = self._pids_hit(cap.err)
        if timed_out or flooded or pids:
            n = self._kill_strays(keep=self._interp_keep())
            if n:
                notes.append(f"[sandbox] killed {n} process(es) the call left behind")
        bwrap.reap_helper(proc)
        for fd in list(open_fds):
            drain(fd)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None and not f.closed:
                try:
                    f.close()
                except OSError:
                    pass
        entry_error = bwrap.entered(status_r)
        if entry_error is not None:
            return self._infra("entering the sandbox failed", SandboxError(entry_error), t0)
        elapsed = time.perf_counter() - t0
        code = None if (timed_out or flooded) else proc.returncode
        verdict, note = exec_verdict(
            exit_code=code, killed_by=-code if code is not None and code < 0 else None, timed_out=timed_out,
            flooded=flooded, flood_bytes=cap.flood, oom=False, pids=pids, stderr=cap.err,
            memory_mb=self.config.memory_mb, pids_limit=self.config.pids_limit)
        return ExecResult(exit_code=code, stdout=cap.stdout(), stderr=cap.stderr([*notes, note]), timed_out=timed_out,
                          truncated=cap.truncated or flooded, duration_ms=elapsed * 1000, verdict=verdict)

    # -- the zygote and run_python -------------------------------------------------------------------------------
    def _start_zygote(self) -> None:
        """Start the sandbox's zygote (sandbox/guest/zygote.py): the pristine process that forks every interpreter of
        this sandbox and resets it between episodes. Raises SandboxError when it does not come up."""
        host_end, box_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc, status_r = self._enter(programs.command(self._owner.python, "zygote"),
                                         exec_call=False, timeout_s=0, stdin=box_end.fileno())
        except OSError as e:
            host_end.close()
            raise SandboxError(f"cannot start the sandbox's zygote: {e}") from e
        finally:
            box_end.close()
        assert proc.stdout is not None
        proc.stdout.close()
        self._zygote, self._zygote_proc = host_end, proc
        entry_error = bwrap.entered(status_r)
        try:
            if entry_error is not None:
                raise SandboxError(f"entering the sandbox for its zygote failed: {entry_error}")
            host_end.settimeout(START_TIMEOUT_S)
            ready = json.loads(host_end.recv(4096) or b"{}")
            if not ready.get("ready"):
                raise SandboxError("the zygote died at start")
            self._zygote_ns_pid = int(ready["pid"])
            zygotes = self._children_of(proc.pid)
            if len(zygotes) != 1:
                raise SandboxError(f"expected one zygote process under its enter helper, found {len(zygotes)}")
            self._zygote_pid = zygotes[0]
        except (OSError, ValueError, SandboxError) as e:
            detail = bwrap.read_now(proc.stderr.fileno()) if proc.stderr is not None and not proc.stderr.closed else ""
            self._drop_zygote()
            raise SandboxError(f"{e} {detail}".strip()) from e

    def _zygote_call(self, request: dict, fds: tuple[int, ...] = (), timeout_s: float = ZYGOTE_TIMEOUT_S) -> dict:
        """One request to the zygote; SandboxError when it is gone, silent past timeout_s, or answers an error."""
        z = self._zygote
        if z is None:
            raise SandboxError("the sandbox has no zygote")
        try:
            z.settimeout(timeout_s)
            socket.send_fds(z, [json.dumps(request).encode()], list(fds))
            reply = json.loads(z.recv(65536) or b"null")
        except (OSError, ValueError) as e:  # socket.timeout is an OSError
            raise SandboxError(f"the sandbox's zygote did not answer {request['op']!r}: {e}") from e
        if not isinstance(reply, dict):
            raise SandboxError(f"the sandbox's zygote is gone (during {request['op']!r})")
        if "error" in reply:
            raise SandboxError(f"the sandbox's zygote refused {request['op']!r}: {reply['error']}")
        return reply

    def _drop_zygote(self) -> None:
        if self._zygote is not None:
            self._zygote.close()  # the zygote exits when its socket closes
            self._zygote = None
        p = self._zygote_proc
        if p is not None:
            bwrap.reap_helper(p)
            if p.stderr is not None:
                p.stderr.close()
            self._zygote_proc = None

    def _start_interpreter(self) -> None:
        """Fork this episode's interpreter from the zygote (the zygote is started first if need be).

        User code runs as the same user as the zygote, so it can kill it (`kill -9 -1` does). Then a new zygote is
        started for the rest of the episode, and the sandbox is no longer reused: the new zygote's view of "as at
        start" would be taken after user code ran."""
        if self._zygote is None:
            self._start_zygote()
        (in_r, in_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
        try:
            try:
                reply = self._zygote_call({"op": "spawn"}, (in_r, out_w, err_w))
            except SandboxError:
                self._drop_zygote()
                self.reusable = False
                self._start_zygote()
                reply = self._zygote_call({"op": "spawn"}, (in_r, out_w, err_w))
        except SandboxError:
            for fd in (in_w, out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        pid = int(reply["pid"])

        def kill() -> int | None:
            try:
                return self._zygote_call({"op": "kill", "pid": pid})["status"]
            except SandboxError:  # the zygote is broken: kill from the host (the sandbox is destroyed at close)
                self._kill_strays(keep=set())
                return None

        self._interp = InterpreterClient(PipeTransport(os.fdopen(in_w, "wb"), out_r, err_r), kill, grace_s=GRACE_S)

    def _drop_interpreter(self) -> None:
        if self._interp is not None:
            self._interp.close()
        self._interp = None

    def run_python(self, code: str, *, timeout_s: float | None = None) -> ExecResult:
        """Run code in this episode's persistent interpreter (globals kept across calls, like a notebook)."""
        with self._lock:
            return self._run_python(code, timeout_s or self.config.timeout_s)

    def _run_python(self, code: str, timeout_s: float) -> ExecResult:
        t0 = time.perf_counter()
        if self.closed:
            return self._infra("run_python", SandboxError("sandbox already closed"), t0)
        notes = [self._note] if self._note else []
        self._note = None
        if self._interp is not None and self._interp.gone():  # killed between calls (e.g. by an exec's kill -9 -1)
            self._drop_interpreter()
            notes.append(GONE_NOTE)
        try:
            if self._interp is None:
                self._start_interpreter()
            assert self._interp is not None
            self._interp.wait_ready()
        except (OSError, SandboxError, InterpreterError) as e:
            self._drop_interpreter()
            return self._infra("starting the interpreter failed", e, t0)
        peak = [0]  # the most tasks the sandbox held while the cell ran (sampled only past WATCH_INTERVAL_S)

        def watch() -> None:
            peak[0] = max(peak[0], self._tasks())

        raw = self._interp.call_raw(code, timeout_s, self.config.output_limit_bytes, watch)
        if raw["died"] and not self.alive():
            self._drop_interpreter()
            return self._infra("run_python", SandboxError("the sandbox's PID 1 died during the call"), t0)
        pids = self._pids_hit(raw["error"] or "", peak[0])
        if raw["timed_out"] or raw["died"] or pids:
            n = self._kill_strays(keep=self._interp_keep())
            if n:
                notes.append(f"[sandbox] killed {n} process(es) the call left behind")
        fields = exec_fields(raw, pids=pids, memory_mb=self.config.memory_mb, pids_limit=self.config.pids_limit)
        if raw["died"]:
            self._drop_interpreter()
            self._note = "[sandbox] a fresh interpreter started: variables from earlier calls are gone, files are kept"
        fields["stderr"] = with_notes(fields["stderr"], notes)
        fields["duration_ms"] = (time.perf_counter() - t0) * 1000
        return ExecResult(**fields)

    # -- files and close -----------------------------------------------------------------------------------------
    def write_files(self, files: dict[str, str]) -> None:
        """Write text files under /workspace (relative paths; parents created; symlinks replaced, never followed)."""
        write_files(lambda argv, timeout_s, stdin: self.exec(argv, timeout_s=timeout_s, stdin=stdin),
                    self._owner.python, files, self.config.timeout_s)

    def close(self) -> None:
        """End the episode: with `reuse`, hand the sandbox back to be reset for another episode (a new handle; this
        one stays closed); else, or when a call is still running, kill every process of the sandbox and free its
        tmpfs. Idempotent."""
        if self.closed:
            return
        if self._owner.reuse and self._lock.acquire(blocking=False):  # not acquired: a call is in flight
            try:
                if not self.closed and self.reusable and self.alive() and self._zygote_proc is not None \
                        and self._zygote_proc.poll() is None:
                    self.closed = True
                    self._drop_interpreter()
                    self._owner._pool.put_back(self._handover())
                    self._owner._release(self)
                    return
            finally:
                self._lock.release()
        self._destroy()

    def _handover(self) -> LocalSandbox:
        """A new handle on this sandbox's processes (PID 1, the zygote); this handle is closed and keeps none."""
        box = object.__new__(LocalSandbox)
        box.__dict__.update(self.__dict__)
        box._lock = threading.RLock()
        box.closed = False
        box._note = None
        box.episodes = self.episodes + 1
        self._zygote = self._zygote_proc = None
        self._holder_fd = -1
        return box

    def _reset(self) -> str | None:
        """Make a used sandbox as good as new for the next episode (see sandbox/guest/zygote.py and the one reset check, sandbox/guest/reset.py) and
        check it from the host too; None when it is, else why not (then the caller destroys it)."""
        with self._lock:
            try:
                reply = self._zygote_call({"op": "reset"})
            except SandboxError as e:
                return str(e)
            if not reply.get("ok"):
                return str(reply.get("why") or "the zygote's checks failed")
            # the host's own look, in the sandbox's /proc (through PID 1's root): PID 1 and the zygote, nothing else
            try:
                seen = sorted(int(d) for d in os.listdir(f"/proc/{self.holder_pid}/root/proc") if d.isdigit())
            except OSError as e:
                return f"cannot list the sandbox's processes: {e}"
            if self._holder.poll() is not None or seen != sorted({1, self._zygote_ns_pid}):
                return f"the host sees processes {seen} in the sandbox, expected PID 1 and the zygote"
            if self._owner.prestart_interpreter:
                try:
                    self._start_interpreter()
                except (OSError, SandboxError) as e:
                    return f"starting the next interpreter failed: {e}"
        return None

    def _destroy(self) -> None:
        """Kill every process of the sandbox and free its tmpfs; idempotent."""
        if self._holder_fd < 0:
            self.closed = True
            return
        self.closed = True
        try:  # first kill PID 1 (the kernel then kills the whole sandbox), so that a call in flight returns now
            signal.pidfd_send_signal(self._holder_fd, signal.SIGKILL)
        except OSError:
            pass
        with self._lock:
            if self._holder_fd < 0:
                return
            os.close(self._holder_fd)
            self._holder_fd = -1
            try:
                self._holder.stdin.close()
            except OSError:
                pass
            # Wait for PID 1 before the helpers: killed first, a helper would orphan its command inside the dying
            # namespace, and the namespace's teardown then takes seconds instead of milliseconds.
            try:
                self._holder.wait(timeout=5)
            except subprocess.TimeoutExpired:
                bwrap.killpg(self._holder)
                self._holder.wait()
            self._drop_interpreter()
            self._drop_zygote()
            self._owner._release(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalBackend:
    """Sandboxes from bubblewrap on this host, `pool_size` of them started ahead by a background thread so that
    `acquire()` hands out a fresh one at once. Without `config.reuse` each episode gets a sandbox nobody touched
    before; with it, closed sandboxes are reset and checked by the same thread and handed out again (see the module
    docstring); `stats` counts sandboxes started, episodes that got a reset one, and resets that failed."""

    name = "local"

    def __init__(self, config: SandboxConfig | None = None, *, pool_size: int = 2, prestart_interpreter: bool = True,
                 host_uid: int = SANDBOX_UID, max_sandboxes: int = 64, acquire_timeout_s: float = 120.0):
        self.config = config or SandboxConfig(backend="local")
        exe = shutil.which("bwrap")
        if exe is None:
            raise SandboxUnavailable("bubblewrap (bwrap) is not installed; fix: apt-get install bubblewrap "
                                     "(or use --backend docker)")
        self.bwrap = exe
        self.python = bwrap.host_python()
        if not any(os.access(f"{d}/timeout", os.X_OK) for d in ("/usr/bin", "/bin")):
            raise SandboxUnavailable("coreutils `timeout` is missing from /usr/bin; fix: apt-get install coreutils")
        self.prestart_interpreter = prestart_interpreter
        self.reuse = self.config.reuse
        # As root, sandboxes run as an unprivileged host user: RLIMIT_NPROC is not enforced for host root, and a
        # sandbox mapped to host root would own root's files. Entering stays root (then drops to nobody inside).
        # The switch goes through setpriv (and sandbox/guest/enter.py drops root's groups itself), not Popen(user=, group=,
        # extra_groups=): those make CPython fork instead of vfork, and forking a flow process that holds torch and a
        # model (~700 MB) cost ~45 ms per spawn, measured: the flywheel's 4,000-episode teacher stage took 250 s
        # that way, 107-116 s now.
        self.host_prefix: list[str] = []
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                raise SandboxUnavailable("setpriv is missing (it runs sandboxes as an unprivileged user when we are "
                                         "root); fix: apt-get install util-linux")
            self.host_prefix = [setpriv, f"--reuid={host_uid}", f"--regid={host_uid}", "--clear-groups", "--"]
        self._live: weakref.WeakSet[LocalSandbox] = weakref.WeakSet()  # handed out and not closed yet
        self._lock = threading.Lock()
        self._count = 0
        self.pool_size = max(0, pool_size)
        self._pool: WarmPool[LocalSandbox] = WarmPool(
            PoolDriver(start=lambda ahead: self._new(), reset=lambda sb: sb._reset(), alive=lambda sb: sb.alive(),
                       discard=lambda sb: sb._destroy(), reused=lambda sb: sb.episodes > 1,
                       name=lambda sb: str(sb.holder_pid)),
            PoolSettings(label="local sandbox", size=self.pool_size, reuse=self.reuse, max_in_use=max_sandboxes,
                         acquire_timeout_s=acquire_timeout_s))
        self.stats = self._pool.stats  # sandboxes started; episodes on a reset one; resets that failed
        self._new()._destroy()  # fail now, naming the fix, when bubblewrap cannot make a sandbox on this host
        self._pool.start_fillers()

    def _new(self) -> LocalSandbox:
        with self._lock:
            self._count += 1
            index = self._count
        sb = LocalSandbox(self, index)
        self._pool.count_started()
        return sb

    def acquire(self) -> LocalSandbox:
        """A sandbox for one episode with nothing of an earlier episode: fresh (new namespaces and tmpfs), or with
        `reuse` one that was reset and checked. Caller closes.

        Raises SandboxError when the backend is shut down or a sandbox cannot start (infrastructure, not the
        program)."""
        if self._pool.closed:
            raise SandboxError("the local backend is shut down; create a new LocalBackend")
        sb = self._pool.take()  # none ready: a used one is reset here (a few ms) rather than one started (~60 ms)
        # The slot is freed once: by close() (_release), or when a handle dropped without close() is collected.
        sb._slot = weakref.finalize(sb, self._pool.release)
        with self._lock:
            self._live.add(sb)
        return sb

    def ready(self) -> int:
        """How many sandboxes wait ready for acquire() (fresh, or reset for reuse)."""
        return self._pool.ready()

    def _release(self, sb: LocalSandbox) -> None:
        """sb, handed out by acquire(), is closed (reset for reuse or destroyed): its slot frees up."""
        with self._lock:
            self._live.discard(sb)
        if sb._slot is not None and sb._slot.detach() is not None:  # detach() answers once: the slot is freed once
            self._pool.release()

    def shutdown(self) -> None:
        """Close every sandbox this backend handed out or holds ready; later acquire() raises SandboxError."""
        self._pool.shutdown()
        with self._lock:
            boxes = list(self._live)
        for sb in boxes:
            sb._destroy()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
