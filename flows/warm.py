"""The warm starter of `flywheel generate` (issue 22: first episode within 3 s): a process that has imported what a
generate needs (Prefect, the flows, pyarrow and pandas, fastapi's encoders) and forks a copy of itself per command.

A command pays 2-3 s of imports and Prefect set-up before its first episode; a starter pays them once. It belongs
to the shared local server's arrangement (flows/localserver.py, flows/shared_server.py): only `generate`, only with
FLYWHEEL_LOCAL_SERVER=shared and no PREFECT_API_URL, and not with FLYWHEEL_WARM=0.
  - A starter serves one *fingerprint*: sha256 of the interpreter, sys.path, the environment (minus keys that change
    from shell to shell: PWD, OLDPWD, SHLVL, _, COLUMNS, LINES) and a stamp of flywheel's code (name, size, mtime of
    every .py of its packages). Prefect reads its settings at import, so another environment, or edited code, is
    another fingerprint and never reaches a starter that imported the old one.
  - It listens on the unix socket PREFECT_HOME/flywheel-warm/FP.sock (a folder only its user can enter; peers of
    another uid are refused), its state (pid, start time, the server it belongs to, log) in FP.json beside it
    (FP.PID.json while it starts).
    Per connection it receives argv, environment and cwd as JSON and the client's fds 0/1/2 (SCM_RIGHTS), and forks,
    only while it is single-threaded (otherwise it refuses and the client runs in-process).
  - The forked child takes the client's fds, cwd and environment (Prefect's settings and logging re-read from it),
    its own process group, default signal handlers, and runs `flows.cli.main()`; it sends {"pid"}, then {"exit"}.
    A thread watches the connection: EOF means the client is gone, however it died (SIGKILL included), and the child
    SIGKILLs itself; its sandboxes die as they do when an in-process command is killed.
  - The client (`run_warm`, called first in `flows.cli.main`) forwards SIGINT, SIGTERM and SIGHUP to the child and
    exits with its code. When no starter answers, the command runs in-process and, at its end (`spawn_starter`, so
    as not to compete for CPU with it), starts a starter detached (own session, log PREFECT_HOME/flywheel-warm.log)
    for the next command.
  - A starter exits when the shared server it belongs to is gone (state file removed, pid dead or replaced), after
    the server's idle timeout with no connection, or on SIGTERM (`flywheel server stop` stops every starter). Its
    state is written when it is spawned (ready: false) and again once it listens; at most MAX_STARTERS live per
    PREFECT_HOME (a new fingerprint stops the oldest: each holds a few hundred MB).
It does not make other commands warm, nor run on other platforms than Linux. Importing it does not import prefect.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from flows import localserver, shared_server
from flows.prefect_home import LocalServerError, prefect_home, pythonpath_with_repo
from sandbox.procfs import start_time

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agents", "curate", "flows", "sandbox", "tasks", "training", "warehouse")
VOLATILE = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES"})
PRELOAD = ("flows.generate", "flows.serve", "prefect", "prefect.flow_engine", "prefect.task_engine",
           "prefect.client.orchestration", "prefect.artifacts", "fastapi.encoders", "pyarrow", "pyarrow.parquet",
           "pandas", "duckdb", "agents.rollout", "agents.reference", "sandbox.backend", "warehouse.lake")
CONNECT_TIMEOUT_S = 15.0  # the starter forks and answers in milliseconds; past this the command runs in-process
MAX_STARTERS = 2  # per PREFECT_HOME; a new fingerprint stops the oldest starter
_HEADER = struct.Struct("!I")
_inside = False  # True in a forked child: its own `main()` runs in-process
_spawned: list[subprocess.Popen] = []  # detached starters, kept so that Popen's destructor does not warn


def warm_dir() -> Path:
    return prefect_home() / "flywheel-warm"


def code_stamp() -> list[tuple[str, int, int]]:
    """(path, size, mtime_ns) of every .py file of flywheel's packages."""
    out = []
    for pkg in PACKAGES:
        for dirpath, dirnames, files in os.walk(ROOT / pkg):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    st = os.stat(os.path.join(dirpath, name))
                    out.append((os.path.join(dirpath, name), st.st_size, st.st_mtime_ns))
    return out


def fingerprint(env: dict[str, str] | None = None, path: list[str] | None = None) -> str:
    """sha256 of what a starter's imports depend on: interpreter, sys.path (with the cwd when an entry is
    relative), the environment minus VOLATILE keys, and flywheel's code stamp."""
    env = dict(os.environ if env is None else env)
    path = list(sys.path if path is None else path)
    key = {"exe": sys.executable, "path": path, "env": sorted((k, v) for k, v in env.items() if k not in VOLATILE),
           "code": code_stamp()}
    if any(not p or not os.path.isabs(p) for p in path):
        key["cwd"] = os.getcwd()
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()


def eligible(argv: list[str]) -> bool:
    """Whether this command may go through a starter: `generate`, shared local server, FLYWHEEL_WARM not 0."""
    if _inside or len(argv) < 2 or argv[1] != "generate" or not sys.platform.startswith("linux"):
        return False
    if os.environ.get("FLYWHEEL_WARM", "1").strip() == "0" or os.environ.get("PREFECT_API_URL"):
        return False
    try:
        return localserver.mode() == "shared"
    except LocalServerError:
        return False  # the in-process path reports it


def _short(path: Path, dir_fd: int) -> str:
    """A socket address for path that fits AF_UNIX's 108 bytes however deep PREFECT_HOME is: through the open
    folder's /proc/self/fd link."""
    return f"/proc/self/fd/{dir_fd}/{path.name}"


@contextlib.contextmanager
def _dir_fd() -> object:
    d = warm_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def _send(conn: socket.socket, msg: dict) -> None:
    conn.sendall(json.dumps(msg).encode() + b"\n")


# --- the client --------------------------------------------------------------------------------------------------

class _Lines:
    """Newline-delimited JSON messages from a socket; None at EOF."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.buf = conn, b""

    def next(self) -> dict | None:
        while b"\n" not in self.buf:
            try:
                chunk = self.conn.recv(65536)
            except InterruptedError:
                continue
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)


def run_warm(argv: list[str], env: dict[str, str], fp: str) -> int | None:
    """Run the command in a forked child of the starter of fingerprint fp; its exit code, or None when no starter
    answered, it refused, or its child died before it started the command (the caller runs in-process)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(CONNECT_TIMEOUT_S)  # a stopped or wedged starter: in-process, never a silent hang
    try:
        with _dir_fd() as dfd:
            conn.connect(_short(warm_dir() / f"{fp}.sock", dfd))
        body = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}).encode()
        socket.send_fds(conn, [_HEADER.pack(len(body)) + body], [0, 1, 2])
        lines = _Lines(conn)
        first = lines.next()
    except OSError:
        conn.close()
        return None
    if not first or "pid" not in first:
        conn.close()
        return None  # refused (threads) or the starter went away: in-process
    pid = int(first["pid"])
    conn.settimeout(None)
    forwarded: list[int] = []

    def forward(sig: int, _frame: object) -> None:
        forwarded.append(sig)
        with contextlib.suppress(OSError):
            os.kill(pid, sig)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    msg = lines.next()
    if (msg is None or "exit" not in msg) and forwarded and forwarded[-1] != signal.SIGINT:
        sig = forwarded[-1]  # the child died of the SIGTERM/SIGHUP it was sent: so does this process, as in-process
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    if msg is None or "exit" not in msg:
        deadline = time.monotonic() + 2.0  # its socket closes as it dies, its /proc entry goes a moment later
        while start_time(pid) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        fate = "is gone" if start_time(pid) is None else "closed its connection"
        print(f"error: the warm flywheel process (pid {pid}) {fate} without an exit status (killed?); its output "
              "is above; run with FLYWHEEL_WARM=0 to run in this process", file=sys.stderr)
        return 1
    return int(msg["exit"])


def spawn_starter(env: dict[str, str], path: list[str], fp: str) -> subprocess.Popen | None:
    """Start the starter of fp, detached (own session, log PREFECT_HOME/flywheel-warm.log), when the shared server
    runs and no starter of fp does (a starter that lost a race finds out itself and exits); at most MAX_STARTERS
    live, the oldest stopped. None when none was started."""
    if shared_server.shared_status() is None:
        return None
    live = starters()
    if any(st["fp"] == fp for st in live):
        return None
    for st in sorted(live, key=lambda st: st["started"])[:max(0, len(live) + 1 - MAX_STARTERS)]:
        with contextlib.suppress(OSError):  # the oldest make room: each holds a few hundred MB
            os.kill(int(st["pid"]), signal.SIGTERM)
    warm_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    boot = {**env, "FLYWHEEL_WARM_BOOT": json.dumps({"fp": fp, "path": path, "pythonpath": env.get("PYTHONPATH")}),
            "PYTHONPATH": pythonpath_with_repo(env.get("PYTHONPATH"))}
    with open(prefect_home() / "flywheel-warm.log", "ab") as log:
        # detached on purpose: never waited for (it outlives this command)
        proc = subprocess.Popen([sys.executable, "-c", "from flows.cli import warm_starter; warm_starter()"], env=boot, cwd="/", start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    # recorded at once, before it is ready (FP.PID.json; FP.json once it listens): `server stop` and the next
    # command see it while it imports, and a starter that lost a race never overwrites the winner's record
    _write_state({"pid": proc.pid, "start": start_time(proc.pid), "fp": fp, "ready": False,
                  "started": time.time(), "log": str(prefect_home() / "flywheel-warm.log")},
                 f"{fp}.{proc.pid}")
    _spawned.append(proc)
    return proc


def _write_state(st: dict, name: str | None = None) -> None:
    path = warm_dir() / f"{name or st['fp']}.json"
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(st))
    tmp.replace(path)


# --- starters: list and stop ----------------------------------------------------------------------------------------

def starters() -> list[dict]:
    """The state of every live starter of this PREFECT_HOME (stale state files removed)."""
    out = []
    for f in sorted(warm_dir().glob("*.json")) if warm_dir().is_dir() else []:
        try:
            st = json.loads(f.read_text())
            alive = st["start"] is not None and start_time(int(st["pid"])) == st["start"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written
        if alive and not any(o["pid"] == st["pid"] for o in out):
            out.append(st)
        elif not alive:
            f.unlink(missing_ok=True)
            if f.name == f"{st.get('fp')}.json":
                f.with_suffix(".sock").unlink(missing_ok=True)
    return out


def stop_starters(timeout_s: float = 10.0) -> list[dict]:
    """SIGTERM every starter (SIGKILL after timeout_s) and wait until they are gone; returns their states. Commands
    that starters forked run on (they are in process groups of their own)."""
    sts = starters()
    for st in sts:
        with contextlib.suppress(OSError):
            os.kill(int(st["pid"]), signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for st in sts:
        pid = int(st["pid"])
        while start_time(pid) == st["start"] and time.monotonic() < deadline + 10.0:
            if time.monotonic() > deadline:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        for name in (f"{st['fp']}.json", f"{st['fp']}.sock", f"{st['fp']}.{pid}.json"):
            (warm_dir() / name).unlink(missing_ok=True)
    return sts


# --- the starter process ------------------------------------------------------------------------------------------

def _server_gone(server: dict) -> bool:
    st = shared_server.read_state()
    return not st or st.get("pid") != server["pid"] or start_time(int(server["pid"])) != server["start"]


def serve(fp: str, command: Callable[[], None]) -> None:
    """The starter: pre-import, listen on FP.sock, fork a child per connection that runs `command` (flows.cli's
    `main`) until the shared server is gone, it idles out (the server's idle timeout) or SIGTERM."""
    pending = warm_dir() / f"{fp}.{os.getpid()}.json"
    try:
        _serve(fp, command)
    finally:
        pending.unlink(missing_ok=True)


def _serve(fp: str, command: Callable[[], None]) -> None:
    server = shared_server.shared_status()
    if server is None:
        print("flywheel-warm: no shared server runs: not starting", flush=True)
        return
    if any(st["fp"] == fp and st["pid"] != os.getpid() for st in starters()):
        return
    t0 = time.monotonic()
    for mod in PRELOAD:
        __import__(mod)
    sock_path, state_path = warm_dir() / f"{fp}.sock", warm_dir() / f"{fp}.json"
    stopping = [False]
    signal.signal(signal.SIGTERM, lambda *_: stopping.__setitem__(0, True))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with _dir_fd() as dfd, open(warm_dir() / f"{fp}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if any(st["fp"] == fp and st["pid"] != os.getpid() for st in starters()):
            print(f"flywheel-warm: a starter of {fp[:12]} runs already", flush=True)
            return
        sock_path.unlink(missing_ok=True)
        listener.bind(_short(sock_path, dfd))
        listener.listen(16)
        _write_state({"pid": os.getpid(), "start": start_time(os.getpid()), "fp": fp, "ready": True,
                      "server_pid": server["pid"], "server_url": server["url"], "started": time.time(),
                      "log": str(prefect_home() / "flywheel-warm.log")})
        (warm_dir() / f"{fp}.{os.getpid()}.json").unlink(missing_ok=True)
    print(f"flywheel-warm: starter {os.getpid()} of {fp[:12]} ready after {time.monotonic() - t0:.1f} s", flush=True)
    idle_s = float(server.get("idle_s") or 0)
    last = time.monotonic()
    try:
        while not stopping[0]:
            try:
                ready, _, _ = select.select([listener], [], [], 1.0)
            except InterruptedError:
                continue
            if ready:
                conn, _ = listener.accept()
                last = time.monotonic()
                _accept(conn, listener, command)  # the forked child never returns from it
                continue
            if _server_gone(server) or (idle_s and time.monotonic() - last > idle_s):
                break
    finally:
        listener.close()
        with contextlib.suppress(OSError, ValueError):
            if json.loads(state_path.read_text())["pid"] == os.getpid():
                state_path.unlink(missing_ok=True)
                sock_path.unlink(missing_ok=True)
    print(f"flywheel-warm: starter {os.getpid()} exits", flush=True)


def _accept(conn: socket.socket, listener: socket.socket, command: Callable[[], None]) -> None:
    """Receive one request and fork its child (which runs the command and exits), or refuse it."""
    fds: list[int] = []
    try:
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
        if uid != os.getuid():
            return
        conn.settimeout(10.0)
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        if len(data) < _HEADER.size or len(fds) != 3:
            return
        need = _HEADER.unpack_from(data)[0] + _HEADER.size
        while len(data) < need:
            chunk = conn.recv(need - len(data))
            if not chunk:
                return
            data += chunk
        req = json.loads(data[_HEADER.size:need])
        if threading.active_count() != 1:  # a fork of a threaded process can deadlock: let the client run it
            _send(conn, {"refused": f"{threading.active_count()} threads"})
            return
        pid = os.fork()
        if pid == 0:
            listener.close()
            _child(conn, req, fds, command)  # does not return
        print(f"flywheel-warm: forked {pid} for: {' '.join(req['argv'][1:])}", flush=True)
        return
    except (OSError, ValueError) as e:
        print(f"flywheel-warm: a request failed: {e!r}", flush=True)
        return
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        conn.close()


def _child(conn: socket.socket, req: dict, fds: list[int], command: Callable[[], None]) -> None:
    """The forked command: the client's fds, cwd, environment and argv; `command()`; {"exit": code}."""
    global _inside
    code = 1
    try:
        _inside = True
        os.setpgid(0, 0)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = list(req["argv"])
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(line_buffering=stream is sys.stderr or stream.isatty(), write_through=unbuffered)
        conn.settimeout(None)

        def watch() -> None:  # any end of the client's connection: it is gone, however it died
            with contextlib.suppress(OSError):
                while conn.recv(1):
                    pass
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, name="flywheel-warm-client", daemon=True).start()
        import prefect.context
        import prefect.logging.configuration

        prefect.context.refresh_global_settings_context()  # the client's PREFECT_* environment
        prefect.logging.configuration.setup_logging(incremental=False)  # handlers on the client's stderr
        _send(conn, {"pid": os.getpid()})
        try:
            command()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        import atexit

        # what the interpreter does at exit: threading's exit hooks (Prefect's log and event workers drain there)
        # and the join of non-daemon threads, then atexit
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(OSError):
            _send(conn, {"exit": code})
        os._exit(code)


def boot(command: Callable[[], None]) -> None:
    """The starter process's entry (flows.cli.warm_starter, spawned by spawn_starter): FLYWHEEL_WARM_BOOT holds the
    fingerprint and the client's sys.path and PYTHONPATH; then `serve`."""
    spec = json.loads(os.environ.pop("FLYWHEEL_WARM_BOOT"))
    sys.path[:] = spec["path"]
    if spec["pythonpath"] is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = spec["pythonpath"]
    serve(spec["fp"], command)
