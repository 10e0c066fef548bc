"""A command's own temporary Prefect server (FLYWHEEL_LOCAL_SERVER=own): uvicorn over Prefect's app, no UI, on a
free loopback port, launched with PR_SET_PDEATHSIG=SIGKILL so that the kernel kills it when the command dies,
however it dies. Its leases go to the command's own folder, PREFECT_HOME/flywheel-leases/PID-STARTTIME. A home with
no database gets the migrated template first (flows/prefect_db.py).

This module launches, waits for and stops that one process; which server a command uses, and the reaping before
its first flow, are flows/localserver.py's. It does not import prefect.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from flows import prefect_db
from flows.prefect_home import LocalServerError, drop_if_empty, lease_root, prefect_home, self_id
from flows.shared_server import free_port, health, server_env

_PR_SET_PDEATHSIG = 1
_server: subprocess.Popen | None = None
_url: str | None = None
_lease_dir: Path | None = None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _server_argv(port: int) -> list[str]:
    prefect_dir = Path(importlib.util.find_spec("prefect").origin).parent.parent
    return [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect_dir), "--factory",
            "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port), "--log-level",
            "error", "--lifespan", "on"]


def launch() -> str:
    """Make this command's lease folder and launch its server (not waiting for it); returns its API URL."""
    global _server, _url, _lease_dir
    _lease_dir = lease_root() / self_id()
    _lease_dir.mkdir(parents=True, exist_ok=True)
    prefect_db.seed(prefect_home())
    port = free_port()
    _server = subprocess.Popen(_server_argv(port), env=server_env(ephemeral=True, lease_dir=_lease_dir),
                               preexec_fn=_die_with_parent,  # noqa: PLW1509 - before any thread
                               stdin=subprocess.DEVNULL)
    _url = f"http://127.0.0.1:{port}/api"
    return _url


def lease_dir() -> Path | None:
    """This command's lease folder, once `launch` made it."""
    return _lease_dir


def launched() -> bool:
    return _server is not None


def wait(timeout_s: float = 120.0) -> None:
    """Block until the launched server answers; LocalServerError when it exits first or takes over timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not health(_url):
        if _server.poll() is not None:
            raise LocalServerError(f"the temporary Prefect server exited with code {_server.returncode} before it "
                                   "answered; start one with `flywheel server start` (or `prefect server start` and "
                                   "export PREFECT_API_URL)")
        if time.monotonic() > deadline:
            raise LocalServerError(f"the temporary Prefect server did not answer in {timeout_s:.0f} s; start one "
                                   "with `flywheel server start` (or `prefect server start` and export "
                                   "PREFECT_API_URL)")
        time.sleep(0.05)


def stop() -> None:
    """Stop the server (SIGTERM, then SIGKILL after 5 s) and remove the lease folder when no lease is left in it."""
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
        drop_if_empty(_lease_dir)
    _url = None
