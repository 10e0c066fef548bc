"""Shared fixtures: a real Prefect server on loopback for the whole session (started once, ~10 s), the project
root, the path of the `flywheel` console script in the venv, and a lake footer cache of its own for every test."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Keep the lake's footer cache of each test out of the user's home."""
    monkeypatch.setenv("FLYWHEEL_CACHE_DIR", str(tmp_path_factory.mktemp("fw-cache")))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory):
    """A real `prefect server` on 127.0.0.1; yields its API URL and points this process and children at it."""
    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_UI_ENABLED": os.environ.get("PREFECT_SERVER_UI_ENABLED", "true"),
           "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api"}
    env.pop("PREFECT_API_URL", None)
    log = open(home / "server.log", "w")
    proc = subprocess.Popen([str(Path(sys.executable).with_name("prefect")), "server", "start", "--host",
                             "127.0.0.1", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.time() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"prefect server did not start; log: {(home / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    old = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield url
        try:  # send buffered logs while the server still answers, so nothing retries against a dead one at exit
            from prefect.logging.handlers import APILogHandler

            APILogHandler.flush()
        except Exception:  # noqa: BLE001 - best effort
            pass
    if old is None:
        os.environ.pop("PREFECT_API_URL", None)
    else:
        os.environ["PREFECT_API_URL"] = old
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
