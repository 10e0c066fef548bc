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

Reuse (`SandboxConfig.reuse`, unset = on for Docker): a fresh container per episode costs far more CPU (create,
start, exec, remove) than a reset (benchmarks/sandbox.py measures both, fresh vs reused episodes/s). In reuse mode
each container runs a keeper (sandbox/guest/keeper.py) that forks every episode's interpreter. Closing an episode
hands the container to a pool thread, which: has the keeper kill and reap the interpreter; freezes the container's
cgroup from the host, SIGKILLs every process but PID 1 and the keeper, thaws it and waits until only those two are
left; has the keeper fork a fresh interpreter, whose process first runs the reset check (sandbox/guest/reset.py, the
same check that took the fresh container's state): it empties /tmp, /workspace and /dev/shm and reports processes,
folder entries, modes, owners and extended attributes, /dev/mqueue, System V IPC objects, the writable mounts and
the kernel keys; then the host requires that report to equal the container's fresh one, sees exactly PID 1, the
keeper and the interpreter in the cgroup, and the same cgroup limits (memory, swap, pids, CPU). Any failure
(including a keeper the episode killed and a new one that does not come up, or no cgroup reachable: a remote
engine, not root) removes the container and counts it in `stats["reset_failed"]`. A closed handle stays closed.
What a reset does not renew: pid and inode numbers continue and the container's uptime and cgroup counters (CPU
used, OOM kills seen) carry over; Docker's seccomp profile refuses kernel keyrings, so there are none to clear.
The parts every backend shares are not here: the verdict ladders (sandbox/verdicts.py), the capture rule
(sandbox/capture.py), the file writer (sandbox/files.py), the warm pool (sandbox/pool.py), the in-sandbox programs
(sandbox/guest/) and the interpreter-protocol client (sandbox/interpreter.py). Nor are the Docker parts that are
nouns of their own: the container's cgroup (sandbox/cgroup.py), the exec channel (sandbox/dockerexec.py) and the
interpreter and keeper started through it (sandbox/dockerinterp.py).
This module does not build images (sandbox/image.py) nor choose a backend (sandbox/backend.py).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import re
import signal
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any

from sandbox import programs
from sandbox.capture import Capture, with_notes
from sandbox.cgroup import Cgroup, Counters
from sandbox.dockerexec import ExecStream, is_infra, start_exec
from sandbox.dockerinterp import (
    GRACE_S,
    RESET_WAIT_S,
    Interp,
    host_pid,
    keeper_call,
    spawn,
    start_interpreter,
    start_keeper,
    warm,
)
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
from sandbox.interpreter import GONE_NOTE
from sandbox.pool import PoolDriver, PoolSettings, WarmPool
from sandbox.reaper import reap
from sandbox.result import ExecResult, SandboxConfig, SandboxError, SandboxUnavailable
from sandbox.verdicts import exec_fields, exec_verdict, infra_result

log = logging.getLogger(__name__)

CREATE_TRIES = 3
FILL_THREADS = 3  # containers the pool creates at once
HOST_CANNOT_RESET = ("the host cannot reset this container (it needs root and the container's cgroup on this "
                     "host); fix: run as root next to the engine, or set sandbox.reuse=false")
REUSE_SPARE = 2  # with reuse, containers the pool starts beyond those in use (a reset takes a few ms)



@dataclass
class _Container:
    id: str
    watch: Any  # attach socket holding PID 1's stdin open (closing it ends the container)
    cgroup: Cgroup
    interp: Interp | None = None  # started ahead by the pool, so an episode's first call is fast too
    created: float = field(default_factory=time.monotonic)
    pid1: int = 0  # host pid of PID 1 (reuse: every other process but the keeper is the episode's)
    keeper: int = 0  # host pid of the keeper (reuse), 0 when none runs
    baseline: dict | None = None  # the reset check's state when fresh (reuse)
    limits: list[str] = field(default_factory=list)  # cgroup limits when fresh (reuse)
    episodes: int = 0  # episodes this container has served


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
        self._interp: Interp | None = box.interp
        box.interp = None
        self._call_before: Counters | None = None  # the cgroup counters when the running call started
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

    def _counters(self) -> Counters | None:
        return self._box.cgroup.read() if self._box.cgroup.available else None

    def _oom_since(self, before: Counters | None) -> bool:
        if before is not None:
            return self._box.cgroup.read().oom_kill > before.oom_kill
        try:  # engine not local: State.OOMKilled is sticky, so only its first flip counts
            flag = bool(self._api.inspect_container(self._box.id)["State"].get("OOMKilled"))
        except Exception:  # noqa: BLE001 - an unreadable flag means no OOM seen
            return False
        new = flag and not self._oom_seen
        self._oom_seen = self._oom_seen or flag
        return new

    def _pids_hit(self, before: Counters | None) -> bool:
        return before is not None and self._box.cgroup.read().pids_max > before.pids_max

    def _infra(self, what: str, e: BaseException, t0: float) -> ExecResult:
        return infra_result(self.backend, what, e, t0)

    def _start_exec(self, argv: list[str], *, stdin: bool, user: str | None = None) -> tuple[str, ExecStream]:
        return start_exec(self._api, self._box.id, argv, stdin=stdin, user=user or self._owner.exec_user,
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
            if not is_infra(e):
                raise
            log.warning("cleanup in container %s failed: %s", self._box.id[:12], e)
        return self._replace_container("leftover processes could not be killed inside the sandbox")

    def _replace_container(self, reason: str) -> str:
        """Swap in a fresh container for the rest of the episode (files and state are gone); returns the note."""
        self._drop_interpreter()
        old = self._box
        new = self._owner._pool.get()
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
        isolated runner (tasks/judge/unittests.py) uses it so the solution, as nobody, cannot reach it. The container's
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
            if not is_infra(e):
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
            if not is_infra(e):
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
                self._interp = start_interpreter(self._api, self._box.id, self._owner.exec_user,
                                                  self._owner.exec_workdir)
        except Exception as e:
            if not is_infra(e) and not isinstance(e, SandboxError):
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
            if not is_infra(e):
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
                 acquire_timeout_s: float = 120.0, reset_threads: int = 0, client=None):
        self.config = config
        self.reuse = config.reuse is not False  # None: the default, on for Docker
        self.pool_size = max(0, pool_size)
        # containers are created in parallel: most of a create is waiting on the engine (mounts, runc)
        self._pool: WarmPool[_Container] = WarmPool(
            PoolDriver(start=lambda ahead: self._create(prestart=ahead or self.reuse), reset=self._reset,
                       alive=self._alive, discard=self._discard, reused=lambda box: box.episodes > 0,
                       name=lambda box: box.id[:12]),
            PoolSettings(label="docker sandbox", size=self.pool_size, fillers=min(self.pool_size, FILL_THREADS),
                         reset_threads=reset_threads,
                         reuse=self.reuse, spare=REUSE_SPARE, max_in_use=max_sandboxes,
                         acquire_timeout_s=acquire_timeout_s))
        self.stats = self._pool.stats
        self.client = client or docker_client()
        img = image_id(config.image, self.client)
        if img is None:
            raise SandboxUnavailable(
                f"sandbox image {config.image!r} is not in the Docker engine; fix: flywheel sandbox build-image "
                f"(or docker build -t {config.image} sandbox/)")
        self.image: str | None = img
        self.owner = owner_tag()
        self.instance = uuid.uuid4().hex
        self._active: dict[str, DockerSandbox] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.last_create_error: str | None = None
        try:
            removed = reap(self.client)
            if removed:
                log.info("reaper removed %d stray sandbox container(s)", removed)
        except Exception as e:  # noqa: BLE001 - reaping is housekeeping; never block the backend on it
            log.warning("reaper failed: %s", e)
        self._trash: queue.Queue[str | None] = queue.Queue()
        self._remover = threading.Thread(target=self._remove_loop, name="flywheel-docker-remove", daemon=True)
        self._remover.start()
        self._pool.start_fillers()
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
        box = _Container(cid, attach_and_start(api, cid), Cgroup(cid))
        if self.reuse and box.cgroup.resettable:
            procs = box.cgroup.processes()  # PID 1 alone, before any exec
            box.pid1 = procs[0] if len(procs) == 1 else 0
            box.limits = box.cgroup.limit_values()
        if prestart:
            try:
                if self.reuse:
                    box.interp, box.baseline = start_keeper(api, cid, empty=False)
                    box.baseline.pop("problems")
                    if box.pid1:
                        box.keeper = host_pid(box.cgroup.processes(), box.interp.keeper)
                else:
                    box.interp = start_interpreter(api, cid)
                    warm(box.interp)
            except Exception:
                self._discard(box)
                raise
        self._pool.count_started()
        return box

    def _create(self, prestart: bool = False) -> _Container:
        delay = 0.2
        last: BaseException | None = None
        for attempt in range(CREATE_TRIES):
            if self._pool.closed:
                raise SandboxError("the Docker backend is shut down")
            try:
                box = self._create_once(prestart)
                self.last_create_error = None
                return box
            except Exception as e:
                if not is_infra(e) and not isinstance(e, SandboxError):
                    raise
                last = e
                self.last_create_error = f"{type(e).__name__}: {e}"
                log.warning("creating a sandbox container failed (try %d/%d): %s", attempt + 1, CREATE_TRIES, e)
                time.sleep(delay)
                delay *= 2
        raise SandboxError(f"creating a sandbox container failed {CREATE_TRIES} times: {type(last).__name__}: {last}")

    # -- reuse ---------------------------------------------------------------------------------------------------
    def _reset(self, box: _Container) -> str | None:
        """Make a used container as good as new: the host kills every process but PID 1 (cgroup frozen, so none
        can fork meanwhile), the keeper's next child empties the writable folders and reports what is left before it
        becomes the interpreter, and the host compares that with the container's fresh state. None when it passed,
        else why not."""
        cg = box.cgroup
        if os.geteuid() != 0 or not box.pid1 or box.baseline is None or not cg.resettable:
            return HOST_CANNOT_RESET
        it, box.interp = box.interp, None
        try:
            if it is not None and it.keeper and box.keeper and it.client.alive and not it.client.gone():
                try:
                    keeper_call(it.transport, "reset")  # the interpreter is killed and reaped, its pipes closed
                except (SandboxError, OSError, TimeoutError, ValueError) as e:
                    return f"the keeper did not reset: {e}"
                why = self._kill_all_but(box, {box.pid1, box.keeper})
                if why is not None:
                    return why
                # the old client goes with its interpreter: a new one, forked after the reset check
                (box.interp, state), it = spawn(it.exec_id, it.stream, it.transport, it.keeper, empty=True), None
            else:  # the keeper is gone (user code killed it, or the interpreter died): a new one, by exec
                if it is not None:
                    it.stream.close()
                it = None
                why = self._kill_all_but(box, {box.pid1})
                if why is not None:
                    return why
                box.interp, state = start_keeper(self.client.api, box.id, empty=True)
                box.keeper = host_pid(cg.processes(), box.interp.keeper)
        except Exception as e:
            if not is_infra(e) and not isinstance(e, (ValueError, TimeoutError)):
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

    # -- Backend protocol ----------------------------------------------------------------------------------------
    def acquire(self) -> DockerSandbox:
        """A clean container for one episode (raises SandboxError when none can be had: infra, retried by callers)."""
        if self._closed:
            raise SandboxError("the Docker backend is shut down")
        box = self._pool.take()
        try:
            sb = DockerSandbox(self, box)
        except BaseException:
            self._pool.release()
            raise
        with self._lock:
            box.episodes += 1
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
            self._pool.put_back(sb._box)
        else:
            self._discard(sb._box)
        if present:
            self._pool.release()

    def shutdown(self) -> None:
        """Stop the refill threads and remove every container of this backend (pooled and in use); returns when
        they are deleted."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown()
        with self._lock:
            active = list(self._active.values())
        for sb in active:
            sb.close()
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
