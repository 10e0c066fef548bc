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
This module is the command's side (fingerprint, connect, forward signals, spawn) and the list of starters; the
starter's own process (pre-import, listen, accept, fork, the child) is flows/warm_process.py.
It does not make other commands warm, nor run on other platforms than Linux. Importing it does not import prefect.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from flows import localserver, shared_server
from flows.prefect_home import LocalServerError, prefect_home, pythonpath_with_repo
from sandbox.procfs import start_time

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agents", "curate", "flows", "sandbox", "tasks", "training", "warehouse")
VOLATILE = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES"})
CONNECT_TIMEOUT_S = 15.0  # the starter forks and answers in milliseconds; past this the command runs in-process
MAX_STARTERS = 2  # per PREFECT_HOME; a new fingerprint stops the oldest starter
HEADER = struct.Struct("!I")
_inside = False  # True in a forked child (`mark_forked`): its own `main()` runs in-process
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


def mark_forked() -> None:
    """Called in a starter's forked child before it runs the command: that command runs in-process."""
    global _inside
    _inside = True


def socket_address(path: Path, dir_fd: int) -> str:
    """A socket address for path that fits AF_UNIX's 108 bytes however deep PREFECT_HOME is: through the open
    folder's /proc/self/fd link."""
    return f"/proc/self/fd/{dir_fd}/{path.name}"


@contextlib.contextmanager
def dir_fd() -> object:
    d = warm_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def send(conn: socket.socket, msg: dict) -> None:
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
        with dir_fd() as dfd:
            conn.connect(socket_address(warm_dir() / f"{fp}.sock", dfd))
        body = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}).encode()
        socket.send_fds(conn, [HEADER.pack(len(body)) + body], [0, 1, 2])
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
    write_state({"pid": proc.pid, "start": start_time(proc.pid), "fp": fp, "ready": False,
                  "started": time.time(), "log": str(prefect_home() / "flywheel-warm.log")},
                 f"{fp}.{proc.pid}")
    _spawned.append(proc)
    return proc


def write_state(st: dict, name: str | None = None) -> None:
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
