"""The local Prefect server of CLI commands, started and found by flywheel instead of by Prefect: one shared server
that every command reuses (started on first use, stopped after an idle timeout), so that a command starts in
seconds, leaves no process of its own behind when killed, and frees the concurrency slots it held.

With no PREFECT_API_URL, Prefect starts a server subprocess on a command's first API call (issue 22): every command
pays a server start and a migration check, a SIGKILL of the command leaves that server running, and the server keeps
the leases of global concurrency slots in its memory while the slot counts live in the user's database, so slots a
killed command held stay taken for good. Here instead, by FLYWHEEL_LOCAL_SERVER:
  - `shared` (the default): `start()` uses the shared server named by PREFECT_HOME/flywheel-server.json when its
    process lives (same pid and kernel start time) and it answers, or started under 2 minutes ago and may still be
    coming up. Otherwise (no state file, a dead pid, a server that never answered) it starts one, detached (its own
    session, log in PREFECT_HOME/flywheel-server.log), records it, and later commands reuse it. A file lock
    (PREFECT_HOME/flywheel-server.lock) makes concurrent first commands start one server, not several.
    The server (`python -m flows.localserver`: Prefect's app with UI, plus a watchdog thread) exits by itself after
    FLYWHEEL_SERVER_IDLE_S seconds (default 900; 0 = never) in which no API request came and no client command
    lived: each command registers as a client (PREFECT_HOME/flywheel-clients/PID-STARTTIME, under the lock) and
    the watchdog drops the clients whose process is gone, so a server cannot outlive its users for more than the
    timeout, even when every client was killed. It removes the state file under the same lock before it exits.
  - `own`: the command's own temporary server (uvicorn over Prefect's app, no UI), launched at the start of the
    command with PR_SET_PDEATHSIG=SIGKILL so the kernel kills it when the command dies, however it dies.
  - `0`: Prefect's own temporary server (the behaviour before issue 22, kept for comparison in
    benchmarks/startup.py).
Slots of dead commands: every lease a command takes is filed in PREFECT_HOME/flywheel-leases/PID-STARTTIME of that
command (flows/lease_storage.py; on the shared server the command names itself in an X-Flywheel-Client header,
through PREFECT_CLIENT_CUSTOM_HEADERS). `reap_dead_leases` releases the slots of folders whose command is gone (pid
dead, or reused by another process) and deletes them: each command runs it before its first flow, and the shared
server's watchdog every few seconds. A lease on disk after a power loss is reaped the same way. An own server can
be killed between counting a slot and filing its lease; `reset_orphan_slots` sets such counts back to 0 when a
command finds no other flywheel command alive.
`flywheel serve` runs flow runs in subprocesses of their own session; `guard_children` marks them and starts a guard
process that kills them once `serve` is gone.
This module does nothing when PREFECT_API_URL is set. Importing it does not import prefect.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Iterator

from sandbox.procfs import start_time

_PR_SET_PDEATHSIG = 1
IDLE_DEFAULT_S = 900.0  # FLYWHEEL_SERVER_IDLE_S
STARTING_GRACE_S = 120.0  # a shared server that has not answered yet is left to come up for this long
CLIENT_HEADER = "X-Flywheel-Client"
WATCHDOG_HEADER = "X-Flywheel-Watchdog"  # the watchdog's own requests, not counted as activity
_ID = re.compile(r"^\d+-\d+$")


class LocalServerError(RuntimeError):
    """The local Prefect server did not come up; the message names the fix."""


_server: subprocess.Popen | None = None  # the command's own server (mode `own`)
_shared: dict | None = None  # the state of the shared server this command uses (mode `shared`)
_url: str | None = None
_lease_dir: Path | None = None
_client_file: Path | None = None
_spawned: list[subprocess.Popen] = []  # the shared server, when this command started it
_spawned_guard: list[subprocess.Popen] = []


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()


def lease_root() -> Path:
    return prefect_home() / "flywheel-leases"


def clients_dir() -> Path:
    return prefect_home() / "flywheel-clients"


def state_file() -> Path:
    return prefect_home() / "flywheel-server.json"


def idle_timeout_s() -> float:
    raw = os.environ.get("FLYWHEEL_SERVER_IDLE_S", "")
    try:
        return float(raw) if raw else IDLE_DEFAULT_S
    except ValueError:
        raise LocalServerError(f"FLYWHEEL_SERVER_IDLE_S={raw!r} is not a number of seconds; set e.g. 900 "
                               "(0 keeps the server until `flywheel server stop`)") from None


def _alive(ident: str) -> bool:
    """Whether the process named PID-STARTTIME still runs (and is that process, not a reused pid)."""
    pid, _, start = ident.partition("-")
    return pid.isdigit() and start_time(int(pid)) == start


def self_id() -> str:
    return f"{os.getpid()}-{start_time(os.getpid())}"


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mode() -> str:
    """`shared`, `own` or `0` (Prefect's own server): FLYWHEEL_LOCAL_SERVER; LocalServerError on another value."""
    m = os.environ.get("FLYWHEEL_LOCAL_SERVER", "shared").strip().lower() or "shared"
    m = {"1": "shared"}.get(m, m)
    if m not in ("shared", "own", "0"):
        raise LocalServerError(f"FLYWHEEL_LOCAL_SERVER={m!r}: choose shared (the default), own or 0")
    return m


def wanted() -> bool:
    return not os.environ.get("PREFECT_API_URL") and mode() != "0" and sys.platform.startswith("linux")


def _server_argv(port: int) -> list[str]:
    prefect_dir = Path(importlib.util.find_spec("prefect").origin).parent.parent
    return [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect_dir), "--factory",
            "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port), "--log-level",
            "error", "--lifespan", "on"]


def _server_env(ephemeral: bool, lease_dir: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME": str(prefect_home()),
           "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": "flows.lease_storage", "FLYWHEEL_LEASE_ROOT": str(lease_root()),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                          *filter(None, [os.environ.get("PYTHONPATH")])])}
    for k in ("PREFECT_API_URL", "FLYWHEEL_DIE_WITH", "PREFECT_CLIENT_CUSTOM_HEADERS", "FLYWHEEL_LEASE_DIR"):
        env.pop(k, None)
    if lease_dir is not None:
        env["FLYWHEEL_LEASE_DIR"] = str(lease_dir)
    if ephemeral:  # as Prefect starts its own temporary server: no UI, fewer services
        env.update({"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"})
    return env


def start() -> str | None:
    """Point PREFECT_API_URL at the shared server (started now, detached, when none runs), or launch the command's
    own server in mode `own`; returns the API URL, or None when a server is configured already (see `wanted`).
    Returns at once: `wait_ready()` waits until the server answers."""
    global _server, _url, _lease_dir, _shared
    if _url or not wanted():
        return _url
    if mode() == "shared":
        _shared = ensure_shared()
        _url = os.environ["PREFECT_API_URL"] = _shared["url"]
        headers = json.loads(os.environ.get("PREFECT_CLIENT_CUSTOM_HEADERS") or "{}")
        os.environ["PREFECT_CLIENT_CUSTOM_HEADERS"] = json.dumps({**headers, CLIENT_HEADER: self_id()})
        atexit.register(_unregister)
        _refresh_prefect_settings()
        return _url
    _lease_dir = lease_root() / self_id()
    _lease_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    _server = subprocess.Popen(_server_argv(port), env=_server_env(ephemeral=True, lease_dir=_lease_dir),
                               preexec_fn=_die_with_parent,  # noqa: PLW1509 - before any thread
                               stdin=subprocess.DEVNULL)
    # atexit runs last-in first-out: registered before prefect is imported, the server stops after Prefect's own
    # exit hooks have sent the buffered logs and events to it
    atexit.register(stop)
    _url = f"http://127.0.0.1:{port}/api"
    os.environ["PREFECT_API_URL"] = _url
    _refresh_prefect_settings()
    return _url


def _refresh_prefect_settings() -> None:
    """Prefect reads its settings when imported: where it was imported before `start` (a warm starter's child,
    flows/warm.py), make it read PREFECT_API_URL and the client header again."""
    ctx = sys.modules.get("prefect.context")
    if ctx is not None:
        ctx.refresh_global_settings_context()


# --- the shared server ------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _state_lock() -> Iterator[None]:
    """Exclusive lock over the state file and the client registrations (commands vs the idle watchdog)."""
    prefect_home().mkdir(parents=True, exist_ok=True)
    with open(prefect_home() / "flywheel-server.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _health(url: str, timeout: float = 2.0) -> bool:
    try:
        req = urllib.request.Request(f"{url}/health", headers={WATCHDOG_HEADER: "1"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


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
    return st["url"] if st and _health(st["url"]) else None


def _usable(st: dict | None) -> bool:
    """A recorded server is usable when its process lives and it answers, or it is young enough to be starting."""
    if not st or start_time(int(st["pid"])) != st.get("start"):
        return False
    return _health(st["url"], timeout=1.0) or time.time() - float(st.get("started", 0)) < STARTING_GRACE_S


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


def _unregister() -> None:
    """Drop this command's client registration and its lease folder when no lease is left in it (a lease still on
    disk stays for the watchdog or the next command to reap)."""
    if _client_file is not None:
        _client_file.unlink(missing_ok=True)
        _drop_if_empty(lease_root() / _client_file.name)


def _drop_if_empty(folder: Path) -> None:
    if folder.is_dir() and not any(f.name != "expirations.json" for f in folder.glob("*.json")):
        shutil.rmtree(folder, ignore_errors=True)


def ensure_shared(port: int | None = None, idle_s: float | None = None) -> dict:
    """The shared server's state, after starting it (detached, not waiting for it to answer) when none is usable;
    this command is registered as its client, so the watchdog keeps it while the command lives. A stale state
    file (dead pid, or a server that never answered) is replaced, its process killed."""
    global _client_file
    with _state_lock():
        st = read_state()
        if not _usable(st):
            if st and start_time(int(st["pid"])) == st.get("start"):
                _kill(st)  # alive but it never answered
            st = _spawn_shared(port, idle_timeout_s() if idle_s is None else idle_s)
        _client_file = _register(self_id())
    return st


def _spawn_shared(port: int | None, idle_s: float) -> dict:
    port = port or _free_port()
    log = prefect_home() / "flywheel-server.log"
    url = f"http://127.0.0.1:{port}/api"
    env = {**_server_env(ephemeral=False), "PREFECT_UI_API_URL": url}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flows.localserver", str(port), str(idle_s)], env=env,
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
    while not _health(st["url"]):
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
    global _shared
    st = _shared = ensure_shared(port, idle_s)
    _unregister()
    wait_shared(st, timeout_s)
    return st


def stop_if_unused() -> None:
    """A command that started the shared server and then failed (bad input, a bug, Ctrl-C) stops it again, unless
    another command uses it meanwhile: a mistyped command leaves no server behind."""
    global _shared
    if not _spawned or _shared is None:
        return
    _unregister()
    with _state_lock():
        if not live_clients():
            _kill(_shared)
            st = read_state()
            if st and st.get("pid") == _shared["pid"]:
                state_file().unlink(missing_ok=True)
    _shared = None


def stop_shared() -> dict | None:
    """Stop the shared server (SIGTERM, SIGKILL after 15 s); returns the state it had, None if none ran."""
    with _state_lock():
        st = shared_status()
        if st:
            _kill(st)
        state_file().unlink(missing_ok=True)
    return st


def live_clients() -> list[str]:
    """PID-STARTTIME of the registered client commands that still run; the registrations of dead ones removed."""
    out = []
    for f in sorted(clients_dir().glob("*-*")) if clients_dir().is_dir() else []:
        if _alive(f.name):
            out.append(f.name)
        else:
            f.unlink(missing_ok=True)
    return out


# --- the process of the shared server ------------------------------------------------------------------------------

def serve_shared(port: int, idle_s: float) -> None:
    """Run Prefect's server app on 127.0.0.1:port with the activity middleware and the watchdog thread; returns when
    the server is idle for idle_s (or on SIGTERM)."""
    global _url
    import uvicorn
    from prefect.server.api.server import create_app

    from flows.lease_storage import CLIENT

    app = create_app()
    last = [time.monotonic()]
    me = self_id()

    async def tracked(scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if WATCHDOG_HEADER.lower().encode() not in headers:
            last[0] = time.monotonic()
        client = headers.get(CLIENT_HEADER.lower().encode(), b"").decode()
        token = CLIENT.set(client if _ID.match(client) else None)
        try:
            return await app(scope, receive, send)
        finally:
            CLIENT.reset(token)

    server = uvicorn.Server(uvicorn.Config(tracked, host="127.0.0.1", port=port, log_level="error", lifespan="on"))
    _url = f"http://127.0.0.1:{port}/api"

    def watchdog() -> None:
        tick = 2.0 if not idle_s else max(0.5, min(5.0, idle_s / 4))
        while not server.started and not server.should_exit:
            time.sleep(0.1)
        last[0] = max(last[0], time.monotonic())  # idle from the moment it answers, not from its launch
        while not server.should_exit:
            time.sleep(tick)
            with contextlib.suppress(Exception):  # a failed reap is retried on the next tick
                reap_dead_leases()
            with contextlib.suppress(Exception):
                reap_sandboxes()
            if not idle_s or time.monotonic() - last[0] < idle_s:
                continue
            with _state_lock():
                if live_clients() or time.monotonic() - last[0] < idle_s:
                    continue
                st = read_state()
                if st and f"{st['pid']}-{st.get('start')}" == me:
                    state_file().unlink(missing_ok=True)
                print(f"flywheel: no API request and no client for {idle_s:.0f} s: stopping", flush=True)
                server.should_exit = True

    threading.Thread(target=watchdog, name="flywheel-idle-watchdog", daemon=True).start()
    server.run()


def guard_children() -> str:
    """Mark this process's future children (FLYWHEEL_DIE_WITH=PID-STARTTIME in the environment) and start a guard
    that, once this process is gone however it died, SIGKILLs every process carrying the mark: the flow runs that
    `flywheel serve` starts in sessions of their own do not outlive it. Returns the mark."""
    ident = self_id()
    os.environ["FLYWHEEL_DIE_WITH"] = ident
    env = {k: v for k, v in os.environ.items() if k != "FLYWHEEL_DIE_WITH"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                         *filter(None, [os.environ.get("PYTHONPATH")])])
    _spawned_guard.append(subprocess.Popen([sys.executable, "-m", "flows.localserver", "guard", ident], env=env,
                                           stdin=subprocess.DEVNULL, start_new_session=True))
    return ident


def _marked(ident: str) -> list[int]:
    mark = f"FLYWHEEL_DIE_WITH={ident}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if mark in (d / "environ").read_bytes().split(b"\0"):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def guard(ident: str) -> None:
    """The guard process of `guard_children`: wait until PID-STARTTIME is gone, then kill the marked processes (and
    the process groups they lead) until none is left."""
    while _alive(ident):
        time.sleep(0.5)
    for _ in range(20):
        pids = _marked(ident)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGKILL)
        time.sleep(0.25)


# --- slots of dead commands and readiness ---------------------------------------------------------------------------

def _api(method: str, path: str, body: dict | None = None, timeout: float = 10.0):
    req = urllib.request.Request(f"{_url}{path}", method=method, data=None if body is None else
                                 json.dumps(body).encode(), headers={"Content-Type": "application/json",
                                                                     WATCHDOG_HEADER: "1"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def wait_ready(timeout_s: float = 120.0) -> None:
    """Block until this command's server answers, then reap the slots of dead commands. No-op without a server of
    flywheel's."""
    if _shared is not None:
        wait_shared(_shared, timeout_s)
        reap_dead_leases()
        reap_sandboxes()
        return
    if _server is None:
        return
    deadline = time.monotonic() + timeout_s
    while not _health(_url):
        if _server.poll() is not None:
            raise LocalServerError(f"the temporary Prefect server exited with code {_server.returncode} before it "
                                   "answered; start one with `flywheel server start` (or `prefect server start` and "
                                   "export PREFECT_API_URL)")
        if time.monotonic() > deadline:
            raise LocalServerError(f"the temporary Prefect server did not answer in {timeout_s:.0f} s; start one "
                                   "with `flywheel server start` (or `prefect server start` and export "
                                   "PREFECT_API_URL)")
        time.sleep(0.05)
    reap_dead_leases()
    reset_orphan_slots()
    reap_sandboxes()


def reap_sandboxes() -> int:
    """Kill the local sandboxes whose command is gone (sandbox/local.py `reap_orphans`)."""
    from sandbox.local import reap_orphans

    return reap_orphans()


def reap_dead_leases() -> dict[str, int]:
    """Release the slots of every lease folder whose command is gone; returns limit name -> slots released."""
    released: Counter[str] = Counter()
    root = lease_root()
    for folder in sorted(root.glob("*-*")) if root.is_dir() else []:
        pid, _, start = folder.name.partition("-")
        if not pid.isdigit() or folder == _lease_dir or start_time(int(pid)) == start:
            continue  # ours, or a live command's
        claimed = folder.with_name(f".reaping-{os.getpid()}-{folder.name}")
        try:
            folder.rename(claimed)  # one reaper per folder, even with several commands starting at once
        except OSError:
            continue
        per_limit: Counter[str] = Counter()
        for f in claimed.glob("*.json"):
            if f.name == "expirations.json":
                continue
            try:
                lease = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            for rid in lease.get("resource_ids", []):
                per_limit[rid] += int((lease.get("metadata") or {}).get("slots", 0))
        unreleased = False
        for rid, slots in per_limit.items():
            if slots <= 0:
                continue
            name = _release(rid, slots)
            if name is None:
                continue  # the limit was deleted meanwhile: nothing to release
            if name is False:
                unreleased = True
                continue
            released[name] += slots
            print(f"released {slots} slot(s) of concurrency limit {name!r} held by a command that died "
                  f"(pid {pid})", file=sys.stderr, flush=True)
        if unreleased and not released:  # the server did not answer: leave the folder for the next reaper
            try:
                claimed.rename(folder)
            except OSError:
                pass
            print(f"warning: could not release the slots of a command that died (pid {pid}): the server did not "
                  "answer; the next command or the shared server's watchdog tries again", file=sys.stderr,
                  flush=True)
            continue
        shutil.rmtree(claimed, ignore_errors=True)
    return dict(released)


def _other_command_lives() -> bool:
    """Whether a flywheel command other than this one may use PREFECT_HOME's database: a live command's lease
    folder (an own-server command makes its folder before its server starts), a live client of the shared server,
    or a shared server that lives or may be starting."""
    root = lease_root()
    folders = root.glob("*-*") if root.is_dir() else []
    return (any(f != _lease_dir and _alive(f.name) for f in folders) or bool(live_clients())
            or _usable(read_state()))


def reset_orphan_slots() -> dict[str, int]:
    """On this command's own server, before its first flow: when no other flywheel command lives, set the taken
    slots of every `flywheel-*` concurrency limit to 0; returns limit name -> slots reset.

    Prefect's server commits a slot count before it files the lease (`increment-with-lease`); an own server dies
    with its command, so a command killed between the two leaves slots counted that no lease folder names:
    `reap_dead_leases` cannot see them, and every later command would wait for them forever. With no other command
    alive, no slot counted in the database has a holder. A command that starts while this one resets has not taken
    a slot yet (its server is still starting)."""
    if _server is None or _other_command_lives():
        return {}
    reset: dict[str, int] = {}
    for attempt in range(5):  # a fresh server on a loaded machine answers 503 for a while
        try:
            for lim in _api("POST", "/v2/concurrency_limits/filter", {"limit": 200}, timeout=30.0) or []:
                if str(lim.get("name", "")).startswith("flywheel-") and int(lim.get("active_slots") or 0) > 0:
                    _api("PATCH", f"/v2/concurrency_limits/{lim['id']}", {"active_slots": 0}, timeout=30.0)
                    reset[lim["name"]] = int(lim["active_slots"])
                    print(f"reset {reset[lim['name']]} slot(s) of concurrency limit {lim['name']!r} that no live "
                          "command holds (a command killed while its server took them)", file=sys.stderr, flush=True)
            return reset
        except OSError as e:  # urllib's errors included
            if attempt == 4:  # the command goes on, as with a lease the reaper cannot release
                print(f"warning: could not reset the slots that no live command holds: the server did not answer "
                      f"({e})", file=sys.stderr, flush=True)
            else:
                time.sleep(1.0 + 2 * attempt)
    return reset


def _release(rid: str, slots: int) -> str | None | bool:
    """Decrement limit `rid` by `slots`: its name, None when the limit no longer exists, False when the server did
    not answer (three tries; a loaded machine's fresh server can take more than the default timeout)."""
    for attempt in range(3):
        try:
            name = _api("GET", f"/v2/concurrency_limits/{rid}", timeout=30.0)["name"]
            _api("POST", "/v2/concurrency_limits/decrement", {"slots": slots, "names": [name]}, timeout=30.0)
            return name
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
        except (KeyError, TypeError):
            return None
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(1.0 + attempt)
    return False


def stop() -> None:
    """Stop this command's own server (SIGTERM, then SIGKILL after 5 s) and remove its lease folder."""
    global _server, _url
    if _server is not None:
        if _server.poll() is None:
            _server.terminate()
            try:
                _server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _server.kill()
                _server.wait()
        _server = None
    if _lease_dir is not None:
        _drop_if_empty(_lease_dir)
    if _url and os.environ.get("PREFECT_API_URL") == _url:
        os.environ.pop("PREFECT_API_URL")
    _url = None


if __name__ == "__main__":  # python -m flows.localserver PORT IDLE_S (the shared server) | guard PID-STARTTIME
    if sys.argv[1] == "guard":
        guard(sys.argv[2])
    else:
        serve_shared(int(sys.argv[1]), float(sys.argv[2]))
