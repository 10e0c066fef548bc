"""The shared local Prefect server (flows/localserver.py), through the console script: the first command that needs
Prefect starts it detached, later commands reuse it (their runs are on it, visible in its UI), it stops itself when
idle and no client command lives, a stale state file is replaced, a command that fails on bad input leaves no server
it started, and `flywheel server stop` leaves no process of it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import FLYWHEEL

GEN = ("generate", "--n-tasks", "1", "--samples", "1", "--backend", "local")


def flywheel(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "FLYWHEEL_SERVER_IDLE_S")}
    return subprocess.run([FLYWHEEL, *args], capture_output=True, text=True, timeout=600,
                          env={**e, "PREFECT_HOME": str(home), **env})


def state(home: Path) -> dict:
    return json.loads((home / "flywheel-server.json").read_text())


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not alive(pid)


def flow_runs(url: str) -> list[dict]:
    req = urllib.request.Request(f"{url}/flow_runs/filter", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_status_without_a_server_exits_1(tmp_path):
    p = flywheel(tmp_path, "server", "status")
    assert (p.returncode, p.stdout.strip()) == (1, "not running")
    assert flywheel(tmp_path, "server", "stop").stdout.strip() == "not running"


def test_start_refuses_when_a_server_is_configured(tmp_path):
    p = flywheel(tmp_path, "server", "start", PREFECT_API_URL="http://127.0.0.1:9/api")
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith("error: PREFECT_API_URL is set")


def test_bad_idle_timeout_is_refused(tmp_path):
    p = flywheel(tmp_path, *GEN, "--out", str(tmp_path / "lake"), FLYWHEEL_SERVER_IDLE_S="soon")
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith("error: FLYWHEEL_SERVER_IDLE_S='soon'")
    assert not (tmp_path / "flywheel-server.json").exists()


@pytest.mark.slow
def test_first_command_starts_the_server_and_later_ones_reuse_it(tmp_path):
    home = tmp_path / "home"
    g1 = flywheel(home, *GEN, "--out", str(tmp_path / "lake1"))
    assert g1.returncode == 0, g1.stderr
    st = state(home)
    try:
        assert alive(st["pid"])  # detached: it outlived the command that started it
        assert flywheel(home, "server", "status").returncode == 0
        g2 = flywheel(home, *GEN, "--out", str(tmp_path / "lake2"))
        assert g2.returncode == 0, g2.stderr
        assert state(home)["pid"] == st["pid"]  # reused, not replaced
        assert not list((home / "flywheel-leases").glob("[0-9]*"))  # every lease released, none left to reap
        assert not list((home / "flywheel-clients").iterdir())  # both commands unregistered when they ended
        runs = flow_runs(st["url"])
        assert len(runs) == 2 and {x["state_type"] for x in runs} == {"COMPLETED"}  # both runs, on its UI's API
        p = flywheel(home, "server", "start")
        assert p.returncode == 0 and f"pid {st['pid']}" in p.stdout  # already running: the same one
    finally:
        stop = flywheel(home, "server", "stop")
    assert stop.returncode == 0 and f"pid {st['pid']}" in stop.stdout
    assert wait_gone(st["pid"], 5)
    assert flywheel(home, "server", "status").returncode == 1


CLIENT = ("import sys, time; from flows import localserver; localserver.start(); localserver.wait_ready(); "
          "print('ready', flush=True); time.sleep(600)")


@pytest.mark.slow
def test_server_idles_out_only_when_no_client_lives(tmp_path):
    """A registered client that sends nothing keeps the server; once it is SIGKILLed the server stops itself
    within the idle timeout (and a few seconds of watchdog tick) and removes its state file."""
    home = tmp_path / "home"
    p = flywheel(home, "server", "start", "--idle-timeout", "3")
    assert p.returncode == 0, p.stderr
    assert "stops after 3 s idle" in p.stdout
    st = state(home)
    env = {**{k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}, "PREFECT_HOME": str(home)}
    client = subprocess.Popen([sys.executable, "-c", CLIENT], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "ready"
        time.sleep(8)
        assert alive(st["pid"]), "the server stopped while a client command lived"
        assert flywheel(home, "server", "status").stdout.endswith("1 client command(s))\n")
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
    assert wait_gone(st["pid"], 20), "the server outlived its last client by more than the idle timeout"
    assert not (home / "flywheel-server.json").exists()
    assert "no API request and no client for 3 s: stopping" in Path(st["log"]).read_text()
    assert flywheel(home, "server", "status").returncode == 1


@pytest.mark.slow
def test_stale_state_is_replaced_and_bad_input_leaves_no_server(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    # a recorded "server" whose process lives but never answered, recorded long ago: killed and replaced
    impostor = subprocess.Popen(["sleep", "600"])
    start = Path(f"/proc/{impostor.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    (home / "flywheel-server.json").write_text(json.dumps({
        "pid": impostor.pid, "start": start, "url": "http://127.0.0.1:9/api", "log": "-", "started": 0}))
    try:
        p = flywheel(home, *GEN, "--suite", "nope", "--out", str(tmp_path / "lake"))
        assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith("error: unknown suite 'nope'")
        assert impostor.wait(timeout=5) is not None  # the stale server's process was stopped
        assert not (home / "flywheel-server.json").exists()  # and the server this command started is gone too
        assert not [ln for ln in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
                    .splitlines() if "flows.server_process" in ln and str(home) in ln]
        # a state file whose pid is gone: replaced by the next command's server
        (home / "flywheel-server.json").write_text(json.dumps({
            "pid": impostor.pid, "start": start, "url": "http://127.0.0.1:9/api", "log": "-", "started": 0}))
        g = flywheel(home, *GEN, "--out", str(tmp_path / "lake"))
        assert g.returncode == 0, g.stderr
        assert state(home)["pid"] != impostor.pid and alive(state(home)["pid"])
    finally:
        impostor.kill()
        flywheel(home, "server", "stop")
