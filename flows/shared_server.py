"""The supervisor of the shared local Prefect server, on the command's side: find it, start it, wait for it, stop it.

The shared server is named by PREFECT_HOME/flywheel-server.json (pid, kernel start time, url, log, started,
idle_s). A command uses it when its process lives (same pid and start time) and it answers, or when it started
under STARTING_GRACE_S ago and may still be coming up; otherwise (no state file, a dead pid, a server that never
answered) the command starts one, detached (its own session, log PREFECT_HOME/flywheel-server.log; a home with no
database gets the migrated template first, flows/prefect_db.py), and records it. A file lock (PREFECT_HOME/flywheel-server.lock) makes concurrent first commands start one server, not several,
and orders the client registrations (PREFECT_HOME/flywheel-clients/PID-STARTTIME) against the server's idle
watchdog. The server's own process (the app, the idle watchdog) is flows/server_process.py; the releasing of
dead commands' slots is flows/lease_reaper.py. This module does not import prefect.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from flows import prefect_db
from flows.prefect_home import (
    LocalServerError,
    clients_dir,
    drop_if_empty,
    lease_root,
    prefect_home,
    pythonpath_with_repo,
    self_id,
    state_file,
)
from flows.prefect_home import alive as command_alive
from sandbox.procfs import start_time

IDLE_DEFAULT_S = 900.0  # FLYWHEEL_SERVER_IDLE_S
STARTING_GRACE_S = 120.0  # a shared server that has not answered yet is left to come up for this long
CLIENT_HEADER = "X-Flywheel-Client"
WATCHDOG_HEADER = "X-Flywheel-Watchdog"  # the watchdog's own requests, not counted as activity

_shared: dict | None = None  # the state of the shared server this command uses
_client_file: Path | None = None
_spawned: list[subprocess.Popen] = []  # the shared server, when this command started it


def idle_timeout_s() -> float:
    raw = os.environ.get("FLYWHEEL_SERVER_IDLE_S", "")
    try:
        return float(raw) if raw else IDLE_DEFAULT_S
    except ValueError:
        raise LocalServerError(f"FLYWHEEL_SERVER_IDLE_S={raw!r} is not a number of seconds; set e.g. 900 "
                               "(0 keeps the server until `flywheel server stop`)") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(ephemeral: bool, lease_dir: Path | None = None) -> dict[str, str]:
    """The environment of a flywheel Prefect server process: flywheel's lease storage, PREFECT_HOME, no client
    settings; `ephemeral` as Prefect starts its own temporary server."""
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME": str(prefect_home()),
           "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": "flows.lease_storage", "FLYWHEEL_LEASE_ROOT": str(lease_root()),
           "PYTHONPATH": pythonpath_with_repo(os.environ.get("PYTHONPATH"))}
    for k in ("PREFECT_API_URL", "FLYWHEEL_DIE_WITH", "PREFECT_CLIENT_CUSTOM_HEADERS", "FLYWHEEL_LEASE_DIR"):
        env.pop(k, None)
    if lease_dir is not None:
        env["FLYWHEEL_LEASE_DIR"] = str(lease_dir)
    if ephemeral:  # as Prefect starts its own temporary server: no UI, fewer services
        env.update({"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"})
    return env


def health(url: str, timeout: float = 2.0) -> bool:
    try:
        req = urllib.request.Request(f"{url}/health", headers={WATCHDOG_HEADER: "1"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


@contextlib.contextmanager
def state_lock() -> Iterator[None]:
    """Exclusive lock over the state file and the client registrations (commands vs the idle watchdog)."""
    prefect_home().mkdir(parents=True, exist_ok=True)
    with open(prefect_home() / "flywheel-server.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_state() -> dict | None:
    try:
        st = json.loads(state_file().read_text())
        return st if isinstance(st, dict) and str(st.get("pid", "")).isdigit() else None
    except (OSError, ValueError):
        return None


def shared_status() -> dict | None:
    """The state of the shared server (pid, start, url, log, started, idle_s) when its process is alive, else
    None."""
    st = read_state()
    return st if st and start_time(int(st["pid"])) == st.get("start") else None


def shared_url() -> str | None:
    st = shared_status()
    return st["url"] if st and health(st["url"]) else None


def in_use() -> dict | None:
    """The state of the shared server this command uses (after `ensure_shared`), else None."""
    return _shared


def usable(st: dict | None) -> bool:
    """A recorded server is usable when its process lives and it answers, or it is young enough to be starting."""
    if not st or start_time(int(st["pid"])) != st.get("start"):
        return False
    return health(st["url"], timeout=1.0) or time.time() - float(st.get("started", 0)) < STARTING_GRACE_S


def _kill(st: dict) -> None:
    """SIGTERM the recorded server (its own session: the whole group), SIGKILL after 15 s; only that process."""
    pid = int(st["pid"])
    for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        if start_time(pid) != st.get("start"):
            return
        with contextlib.suppress(OSError):
            os.killpg(pid, sig) if os.getpgid(pid) == pid else os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while start_time(pid) == st.get("start") and time.monotonic() < deadline:
            time.sleep(0.1)


def _register(ident: str) -> Path:
    clients_dir().mkdir(parents=True, exist_ok=True)
    f = clients_dir() / ident
    f.touch()
    return f


def unregister() -> None:
    """Drop this command's client registration and its lease folder when no lease is left in it (a lease still on
    disk stays for the watchdog or the next command to reap)."""
    if _client_file is not None:
        _client_file.unlink(missing_ok=True)
        drop_if_empty(lease_root() / _client_file.name)


def ensure_shared(port: int | None = None, idle_s: float | None = None) -> dict:
    """The shared server's state, after starting it (detached, not waiting for it to answer) when none is usable;
    this command is registered as its client, so the watchdog keeps it while the command lives. A stale state
    file (dead pid, or a server that never answered) is replaced, its process killed."""
    global _client_file, _shared
    with state_lock():
        st = read_state()
        if not usable(st):
            if st and start_time(int(st["pid"])) == st.get("start"):
                _kill(st)  # alive but it never answered
            st = _spawn_shared(port, idle_timeout_s() if idle_s is None else idle_s)
        _client_file = _register(self_id())
    _shared = st
    return st


def _spawn_shared(port: int | None, idle_s: float) -> dict:
    port = port or free_port()
    log = prefect_home() / "flywheel-server.log"
    url = f"http://127.0.0.1:{port}/api"
    env = {**server_env(ephemeral=False), "PREFECT_UI_API_URL": url}
    prefect_db.seed(prefect_home())
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flows.server_process", str(port), str(idle_s)], env=env,
                                start_new_session=True, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)
    st = {"pid": proc.pid, "start": start_time(proc.pid), "url": url, "log": str(log), "started": time.time(),
          "idle_s": idle_s}
    tmp = state_file().with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(st))
    tmp.replace(state_file())
    _spawned.append(proc)  # detached: never waited for; kept so that Popen's destructor does not warn
    return st


def wait_shared(st: dict, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not health(st["url"]):
        if start_time(int(st["pid"])) != st.get("start"):
            raise LocalServerError(f"the shared Prefect server (pid {st['pid']}) exited before it answered; see its "
                                   f"log {st['log']}")
        if time.monotonic() > deadline:
            raise LocalServerError(f"the shared Prefect server did not answer in {timeout_s:.0f} s; see its log "
                                   f"{st['log']}, then `flywheel server stop` and retry")
        time.sleep(0.05)


def start_shared(port: int | None = None, idle_s: float | None = None, timeout_s: float = 120.0) -> dict:
    """`flywheel server start`: the shared server's state once it answers (started when none is usable). This
    command is not kept as its client: the server idles out after idle_s unless used."""
    st = ensure_shared(port, idle_s)
    unregister()
    wait_shared(st, timeout_s)
    return st


def stop_if_unused() -> None:
    """A command that started the shared server and then failed (bad input, a bug, Ctrl-C) stops it again, unless
    another command uses it meanwhile: a mistyped command leaves no server behind."""
    global _shared
    if not _spawned or _shared is None:
        return
    unregister()
    with state_lock():
        if not live_clients():
            _kill(_shared)
            st = read_state()
            if st and st.get("pid") == _shared["pid"]:
                state_file().unlink(missing_ok=True)
    _shared = None


def stop_shared() -> dict | None:
    """Stop the shared server (SIGTERM, SIGKILL after 15 s); returns the state it had, None if none ran."""
    with state_lock():
        st = shared_status()
        if st:
            _kill(st)
        state_file().unlink(missing_ok=True)
    return st


def live_clients() -> list[str]:
    """PID-STARTTIME of the registered client commands that still run; the registrations of dead ones removed."""
    out = []
    for f in sorted(clients_dir().glob("*-*")) if clients_dir().is_dir() else []:
        if command_alive(f.name):
            out.append(f.name)
        else:
            f.unlink(missing_ok=True)
    return out
