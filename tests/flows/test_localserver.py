"""The shared local Prefect server of `flywheel server start|status|stop`, through the console script: a later
command finds it and reports its flow run there (visible in its UI) instead of starting a server of its own, and
`stop` leaves no process of it."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import FLYWHEEL


def flywheel(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return subprocess.run([FLYWHEEL, *args], capture_output=True, text=True, timeout=600,
                          env={**e, "PREFECT_HOME": str(home), **env})


def test_status_without_a_server_exits_1(tmp_path):
    p = flywheel(tmp_path, "server", "status")
    assert (p.returncode, p.stdout.strip()) == (1, "not running")
    assert flywheel(tmp_path, "server", "stop").stdout.strip() == "not running"


def test_start_refuses_when_a_server_is_configured(tmp_path):
    p = flywheel(tmp_path, "server", "start", PREFECT_API_URL="http://127.0.0.1:9/api")
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith("error: PREFECT_API_URL is set")


@pytest.mark.slow
def test_commands_reuse_the_shared_server_and_stop_leaves_nothing(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    p = flywheel(home, "server", "start")
    assert p.returncode == 0, p.stderr
    st = json.loads((home / "flywheel-server.json").read_text())
    try:
        assert flywheel(home, "server", "status").returncode == 0
        assert flywheel(home, "server", "start").stdout == p.stdout  # already running: the same one
        g = flywheel(home, "generate", "--n-tasks", "1", "--samples", "1", "--backend", "local", "--out",
                     str(tmp_path / "lake"))
        assert g.returncode == 0, g.stderr
        assert "Starting temporary server" not in g.stderr
        assert not list((home / "flywheel-leases").glob("[0-9]*"))  # no server of its own, no lease folder
        req = urllib.request.Request(f"{st['url']}/flow_runs/filter", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            runs = json.loads(r.read())
        assert runs and {x["state_type"] for x in runs} == {"COMPLETED"}  # the generate run, kept on the server
    finally:
        stop = flywheel(home, "server", "stop")
    assert stop.returncode == 0 and f"pid {st['pid']}" in stop.stdout
    assert not Path(f"/proc/{st['pid']}").exists() or "Z" in Path(f"/proc/{st['pid']}/stat").read_text().split()[2]
    assert flywheel(home, "server", "status").returncode == 1
