"""Which Prefect server a CLI command uses, started and found by flywheel instead of by Prefect: the orchestration
of the local-server arrangement, with the supervision in modules of its own.

With no PREFECT_API_URL, Prefect starts a server subprocess on a command's first API call (issue 22): every command
pays a server start and a migration check, a SIGKILL of the command leaves that server running, and the server keeps
the leases of global concurrency slots in its memory while the slot counts live in the user's database, so slots a
killed command held stay taken for good. Here instead, by FLYWHEEL_LOCAL_SERVER:
  - `shared` (the default): one shared server that every command reuses, started on first use, detached, and
    stopped by itself after FLYWHEEL_SERVER_IDLE_S seconds (default 900; 0 = never) with no API request and no
    live client command. Supervisor: flows/shared_server.py; the server's process and its watchdog:
    flows/server_process.py.
  - `own`: the command's own temporary server, which the kernel kills when the command dies
    (flows/own_server.py).
  - `0`: Prefect's own temporary server (the behaviour before issue 22, kept for comparison in
    benchmarks/startup.py).
`start()` points PREFECT_API_URL at the server and returns at once; `wait_ready()` waits until it answers, then
releases the slots of dead commands (flows/lease_reaper.py) and kills the local sandboxes whose command is gone
(sandbox/local.py). `flywheel serve`'s flow runs are guarded by flows/child_guard.py.
This module does nothing when PREFECT_API_URL is set. Importing it does not import prefect.
"""

from __future__ import annotations

import atexit
import json
import os
import sys

from flows import own_server, shared_server
from flows.lease_reaper import reap_dead_leases, reset_orphan_slots
from flows.prefect_home import LocalServerError, self_id

_url: str | None = None


def mode() -> str:
    """`shared`, `own` or `0` (Prefect's own server): FLYWHEEL_LOCAL_SERVER; LocalServerError on another value."""
    m = os.environ.get("FLYWHEEL_LOCAL_SERVER", "shared").strip().lower() or "shared"
    m = {"1": "shared"}.get(m, m)
    if m not in ("shared", "own", "0"):
        raise LocalServerError(f"FLYWHEEL_LOCAL_SERVER={m!r}: choose shared (the default), own or 0")
    return m


def wanted() -> bool:
    return not os.environ.get("PREFECT_API_URL") and mode() != "0" and sys.platform.startswith("linux")


def start() -> str | None:
    """Point PREFECT_API_URL at the shared server (started now, detached, when none runs), or launch the command's
    own server in mode `own`; returns the API URL, or None when a server is configured already (see `wanted`).
    Returns at once: `wait_ready()` waits until the server answers."""
    global _url
    if _url or not wanted():
        return _url
    if mode() == "shared":
        _url = os.environ["PREFECT_API_URL"] = shared_server.ensure_shared()["url"]
        headers = json.loads(os.environ.get("PREFECT_CLIENT_CUSTOM_HEADERS") or "{}")
        os.environ["PREFECT_CLIENT_CUSTOM_HEADERS"] = json.dumps({**headers, shared_server.CLIENT_HEADER: self_id()})
        atexit.register(shared_server.unregister)
        _refresh_prefect_settings()
        return _url
    _url = own_server.launch()
    # atexit runs last-in first-out: registered before prefect is imported, the server stops after Prefect's own
    # exit hooks have sent the buffered logs and events to it
    atexit.register(stop)
    os.environ["PREFECT_API_URL"] = _url
    _refresh_prefect_settings()
    return _url


def _refresh_prefect_settings() -> None:
    """Prefect reads its settings when imported: where it was imported before `start` (a warm starter's child,
    flows/warm.py), make it read PREFECT_API_URL and the client header again."""
    ctx = sys.modules.get("prefect.context")
    if ctx is not None:
        ctx.refresh_global_settings_context()


def wait_ready(timeout_s: float = 120.0) -> None:
    """Block until this command's server answers, then reap the slots of dead commands and the local sandboxes of
    dead commands. No-op without a server of flywheel's."""
    shared = shared_server.in_use()
    if shared is not None:
        from sandbox.reaper import reap_local

        shared_server.wait_shared(shared, timeout_s)
        reap_dead_leases(shared["url"])
        reap_local()
        return
    if not own_server.launched():
        return
    from sandbox.reaper import reap_local

    own_server.wait(timeout_s)
    reap_dead_leases(_url, own=own_server.lease_dir())
    reset_orphan_slots(_url, own_server.lease_dir())
    reap_local()


def stop() -> None:
    """Stop this command's own server and remove its lease folder (when empty); unset PREFECT_API_URL."""
    global _url
    own_server.stop()
    if _url and os.environ.get("PREFECT_API_URL") == _url:
        os.environ.pop("PREFECT_API_URL")
    _url = None
