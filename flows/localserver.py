"""The Prefect server of CLI commands, started by flywheel instead of by Prefect, so that a killed command leaves
neither a server nor taken concurrency slots behind, and so that commands can share one server.

With no PREFECT_API_URL, Prefect starts a server subprocess on a command's first API call. Two faults follow from
that (issue 22): a SIGKILL of the command leaves the server running, re-parented to init; and the server keeps the
leases of global concurrency slots in its memory while the slot counts live in the user's database, so slots a
killed command held stay taken for good and every later command waits on them. Here instead:
  - `start()` uses the shared server of `flywheel server start` when one runs (found through
    PREFECT_HOME/flywheel-server.json; `start_shared`/`stop_shared`/`shared_status`): no server start at all;
  - otherwise it launches the command's own server (uvicorn over `prefect.server.api.server:create_app`, the user's
    database in PREFECT_HOME, so runs stay visible to a later `prefect server start`) at the start of the command,
    in parallel with config checks and imports, with PR_SET_PDEATHSIG=SIGKILL: the kernel kills it when the
    command dies, however it dies (SIGKILL and OOM included);
  - that server's leases go to a folder of this command, PREFECT_HOME/flywheel-leases/PID-STARTTIME
    (flows/lease_storage.py), so they survive the command on disk;
  - `wait_ready()` (before the first flow) waits for the health check, then releases the slots of the lease
    folders whose command is gone (pid dead, or reused by another process) and deletes those folders. A lease on
    disk after a power loss is reaped the same way. Concurrent live commands keep their slots.
On a shared or configured server, the server's repossessor frees the slots of leases that stopped being renewed.
This module does nothing when PREFECT_API_URL is set or FLYWHEEL_LOCAL_SERVER=0 (Prefect's own temporary server,
the old behaviour, kept for comparison in benchmarks/startup.py). Importing it does not import prefect.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

_PR_SET_PDEATHSIG = 1


class LocalServerError(RuntimeError):
    """This command's temporary Prefect server did not come up; the message names the fix."""


_server: subprocess.Popen | None = None
_url: str | None = None
_lease_dir: Path | None = None


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()


def lease_root() -> Path:
    return prefect_home() / "flywheel-leases"


def _start_time(pid: int) -> str | None:
    """The kernel's start time of process pid (field 22 of /proc/PID/stat), None when no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wanted() -> bool:
    return not os.environ.get("PREFECT_API_URL") and os.environ.get("FLYWHEEL_LOCAL_SERVER", "1") != "0" \
        and sys.platform.startswith("linux")


def _server_argv(port: int) -> list[str]:
    prefect_dir = Path(importlib.util.find_spec("prefect").origin).parent.parent
    return [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect_dir), "--factory",
            "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port), "--log-level",
            "error", "--lifespan", "on"]


def _server_env(lease_dir: Path, ephemeral: bool) -> dict[str, str]:
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME": str(prefect_home()),
           "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": "flows.lease_storage", "FLYWHEEL_LEASE_DIR": str(lease_dir),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                          *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("PREFECT_API_URL", None)
    if ephemeral:  # as Prefect starts its own temporary server: no UI, fewer services
        env.update({"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"})
    return env


def start() -> str | None:
    """Point PREFECT_API_URL at the shared server of `flywheel server start` when one runs, else launch this
    command's own server (once); returns the API URL, or None when a server is configured already (see
    `wanted`). Returns at once: `wait_ready()` waits for the command's own server."""
    global _server, _url, _lease_dir
    if _url or not wanted():
        return _url
    shared = shared_url()
    if shared:
        _url = os.environ["PREFECT_API_URL"] = shared
        return _url
    pid = os.getpid()
    _lease_dir = lease_root() / f"{pid}-{_start_time(pid)}"
    _lease_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    _server = subprocess.Popen(_server_argv(port), env=_server_env(_lease_dir, ephemeral=True),
                               preexec_fn=_die_with_parent,  # noqa: PLW1509 - before any thread
                               stdin=subprocess.DEVNULL)
    # atexit runs last-in first-out: registered before prefect is imported, the server stops after Prefect's own
    # exit hooks have sent the buffered logs and events to it
    atexit.register(stop)
    _url = f"http://127.0.0.1:{port}/api"
    os.environ["PREFECT_API_URL"] = _url
    return _url


# --- the shared server of `flywheel server start` --------------------------------------------------------------

def state_file() -> Path:
    return prefect_home() / "flywheel-server.json"


def _health(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


def shared_status() -> dict | None:
    """The state of the shared server (pid, url, log) when its process is alive, else None."""
    try:
        st = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return None
    return st if _start_time(int(st.get("pid", 0))) == st.get("start") else None


def shared_url() -> str | None:
    st = shared_status()
    return st["url"] if st and _health(st["url"]) else None


def start_shared(port: int | None = None, timeout_s: float = 120.0) -> dict:
    """Start the shared local server (UI included) in its own session, so it outlives this command; later
    commands find it through PREFECT_HOME/flywheel-server.json and start none of their own. Returns its state."""
    st = shared_status()
    if st:
        return st
    port = port or _free_port()
    lease_dir = lease_root() / "shared"
    lease_dir.mkdir(parents=True, exist_ok=True)
    log = prefect_home() / "flywheel-server.log"
    env = {**_server_env(lease_dir, ephemeral=False), "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api"}
    with open(log, "ab") as out:
        proc = subprocess.Popen(_server_argv(port), env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)
    st = {"pid": proc.pid, "start": _start_time(proc.pid), "url": f"http://127.0.0.1:{port}/api", "log": str(log)}
    deadline = time.monotonic() + timeout_s
    while not _health(st["url"]):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise LocalServerError(f"the shared Prefect server did not start; see its log {log}")
        time.sleep(0.1)
    tmp = state_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(st))
    tmp.replace(state_file())
    return st


def stop_shared(timeout_s: float = 15.0) -> dict | None:
    """Stop the shared server (SIGTERM, SIGKILL after timeout_s); returns the state it had, None if none ran."""
    st = shared_status()
    if st:
        os.kill(st["pid"], signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _start_time(st["pid"]) == st["start"] and time.monotonic() < deadline:
            time.sleep(0.1)
        if _start_time(st["pid"]) == st["start"]:
            os.kill(st["pid"], signal.SIGKILL)
    state_file().unlink(missing_ok=True)
    return st


def _api(method: str, path: str, body: dict | None = None, timeout: float = 10.0):
    req = urllib.request.Request(f"{_url}{path}", method=method, data=None if body is None else
                                 json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def wait_ready(timeout_s: float = 120.0) -> None:
    """Block until this command's server answers, then reap the slots of dead commands. No-op without one."""
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


def reap_dead_leases() -> dict[str, int]:
    """Release the slots of every lease folder whose command is gone; returns limit name -> slots released."""
    released: Counter[str] = Counter()
    root = lease_root()
    for folder in sorted(root.glob("*-*")) if root.is_dir() else []:
        pid, _, start = folder.name.partition("-")
        if not pid.isdigit() or folder == _lease_dir or _start_time(int(pid)) == start:
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
        for rid, slots in per_limit.items():
            if slots <= 0:
                continue
            try:
                name = _api("GET", f"/v2/concurrency_limits/{rid}")["name"]
                _api("POST", "/v2/concurrency_limits/decrement", {"slots": slots, "names": [name]})
            except (OSError, urllib.error.URLError, KeyError, TypeError):
                continue  # the limit was deleted meanwhile: nothing to release
            released[name] += slots
            print(f"released {slots} slot(s) of concurrency limit {name!r} held by a command that died "
                  f"(pid {pid})", file=sys.stderr)
        shutil.rmtree(claimed, ignore_errors=True)
    return dict(released)


def stop() -> None:
    """Stop this command's server (SIGTERM, then SIGKILL after 5 s) and remove its lease folder."""
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
    if _lease_dir is not None and not any(f.name != "expirations.json" for f in _lease_dir.glob("*.json")):
        shutil.rmtree(_lease_dir, ignore_errors=True)  # a lease still on disk stays for the next command to reap
    if _url and os.environ.get("PREFECT_API_URL") == _url:
        os.environ.pop("PREFECT_API_URL")
    _url = None
