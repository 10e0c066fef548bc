"""Reuse of a task image's agent containers (sandbox/taskenv.py TaskEnvBackend with reset paths; tasks/harbor.py
`acquire(reuse=True)`, what GRPO's Harbor generations get with grpo.harbor_reuse). In Docker: an episode that edits
and deletes the task's files, writes /solution, /tmp and /dev/shm, leaves a System V segment and a background
process hands on a container the next episode finds exactly as the image made it (the same listing and bytes as a
fresh container's); an episode that changes anything outside the reset paths gets its container removed, never
reused; with sandbox.reuse = false every episode gets a fresh one. The path rules are checked without Docker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sandbox.result import SandboxConfig
from sandbox.taskenv import _outermost, _within

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "data" / "harbor" / "csv-sum"
# what a container holds where an episode may leave things: every file under /app with its mode, size and sha256,
# and the entries of the other reset paths and the tmpfs folders
STATE = ("cd / && find /app /tmp /solution /tests /logs /dev/shm /dev/mqueue -mindepth 1 2>/dev/null "
         "-printf '%p %m %u %s\\n' | sort && find /app -type f -exec sha256sum {} + | sort && ipcs -m | tail -n +4 "
         "&& stat -c '%n %a %U' /app /tmp && for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done "
         "| grep -c '^sleep 300'")
MESS = ("echo new > /app/new.txt; rm -f /app/*.csv; chmod 600 /app; mkdir -p /solution /logs/verifier; "
        "echo 'echo 1' > /solution/solve.sh; echo 1 > /logs/verifier/reward.txt; echo y > /tmp/y; "
        "echo z > /dev/shm/z; ipcmk -M 4096 >/dev/null; (sleep 300 >/dev/null 2>&1 &); echo messed")


def test_reset_paths_are_the_outermost_ones():
    assert _outermost(["/app", "/logs", "/logs/artifacts", "/app/", "/tmp", "/app/out"]) == ["/app", "/logs", "/tmp"]
    assert _within("/app/x", "/app") and _within("/app", "/app") and not _within("/apple", "/app")


def _shell(sb, command: str) -> str:
    from tasks.tools import run_tool

    r = run_tool(sb, "shell", {"command": command}, timeout_s=20)
    return r.stdout


def _settled(be, key: str, value: int) -> None:
    """Wait for the backend's reset thread to count `value` in stats[key]."""
    deadline = time.monotonic() + 30
    while be.stats[key] < value and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def task():
    from tasks import harbor

    t = harbor.load_harbor(TASK, build=True)[0]
    yield t
    harbor.shutdown()


@pytest.mark.docker
def test_the_next_episode_finds_the_container_as_the_image_made_it(task):
    from tasks import harbor

    fresh = harbor.acquire(task, None)
    pristine = _shell(fresh, STATE)
    fresh.close()
    assert "/app/" in pristine and pristine.rstrip().endswith("0")  # files, no sleep process

    sb = harbor.acquire(task, None, reuse=True)
    first = sb.container_id
    assert _shell(sb, MESS).strip() == "messed"
    messed = _shell(sb, STATE)
    assert messed != pristine and "/solution/solve.sh" in messed and "/dev/shm/z" in messed
    be = sb._owner
    sb.close()
    _settled(be, "reused", 0)
    again = harbor.acquire(task, None, reuse=True)
    assert again.container_id == first and be.stats["reused"] == 1 and be.stats["reset_failed"] == 0
    assert _shell(again, STATE) == pristine
    again.close()


@pytest.mark.docker
def test_a_container_changed_outside_the_reset_paths_is_removed(task):
    from tasks import harbor

    sb = harbor.acquire(task, None, reuse=True)
    first, be = sb.container_id, sb._owner
    _shell(sb, "echo 'evil:x:0:0::/:/bin/sh' >> /etc/passwd")
    sb.close()
    _settled(be, "reset_failed", 1)
    nxt = harbor.acquire(task, None, reuse=True)
    assert nxt.container_id != first and be.stats["reset_failed"] == 1 and be.stats["reused"] == 0
    assert "evil" not in _shell(nxt, "cat /etc/passwd")
    nxt.close()


@pytest.mark.docker
def test_reuse_off_in_the_run_config_means_fresh_containers(task):
    from tasks import harbor
    from sandbox.backend import open_backend

    with open_backend(SandboxConfig(backend="docker", reuse=False), pool_size=0) as run_backend:
        ids = []
        for _ in range(2):
            sb = harbor.acquire(task, run_backend, reuse=True)
            ids.append(sb.container_id)
            sb.close()
        assert ids[0] != ids[1] and sb._owner.stats["reused"] == 0
