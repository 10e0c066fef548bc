"""SIGKILL of a `flywheel generate`, `run` or `serve` in the middle of its rollouts, through the console script, with
no Prefect server configured (flows/localserver.py):
  - no process of the killed command remains (its sandboxes; for `serve` also the flow run it was executing, a
    process of its own session; for a `generate` through a warm starter, flows/warm.py, the starter's forked child
    that ran it and its sandboxes), checked in /proc by descendants and by a marker in the environment, and on
    Docker no running container of it. The processes allowed to remain are the shared local server recorded in
    PREFECT_HOME/flywheel-server.json and the warm starters of `generate` beside it (PREFECT_HOME/flywheel-warm):
    deliberately shared by every command, they idle out by themselves (tests/flows/test_localserver.py) and
    `flywheel server stop` ends them, checked here too. With FLYWHEEL_LOCAL_SERVER=own the command's own temporary
    server is one of its processes and dies with it;
  - the slots it held in the `flywheel-sandbox` global concurrency limit are released (by the shared server's
    watchdog or by the next command), and the next command completes at normal speed instead of waiting forever;
and a control: with FLYWHEEL_LOCAL_SERVER=0 (Prefect's own temporary server) the same kill leaves the slots taken.
A command's own server can die between counting a slot and filing its lease: a fault-injection test counts slots with
no lease and checks that the next command resets them only when no other command lives.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Collection
from pathlib import Path

import pytest

from tests.conftest import FLYWHEEL

pytestmark = pytest.mark.slow


def _env(home: Path, marker: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return {**env, "PREFECT_HOME": str(home), "FW_KILL_TEST": marker}


def shared_server(home: Path) -> int | None:
    """pid of the shared local server recorded in home, if any."""
    try:
        return int(json.loads((home / "flywheel-server.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def warm_starters(home: Path, ready: bool = False) -> dict[str, int]:
    """fingerprint -> pid of the warm starters of `generate` recorded in home (flows/warm.py; recorded when spawned,
    `ready` once listening); with ready=True only the ready ones."""
    out = {}
    for f in (home / "flywheel-warm").glob("*.json") if (home / "flywheel-warm").is_dir() else []:
        st = json.loads(f.read_text())
        if st.get("ready") or not ready:
            out[st["fp"]] = int(st["pid"])
    return out


def processes_with(marker: str, but: Collection[int | None] = ()) -> list[str]:
    """pid and command line of every live process whose environment holds FW_KILL_TEST=marker (but the pids in
    `but`)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in but:
            continue
        try:
            if f"FW_KILL_TEST={marker}".encode() not in (d / "environ").read_bytes().split(b"\0"):
                continue
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z":
            out.append(f"{d.name} {cmd}")
    return out


def why_alive(lines: list[str]) -> str:
    """For a failure message: each leftover process (a `processes_with` line), its state and wait channel, and its
    children alike with the holders of the pipes on their fds 0-2 (a sandbox's PID 1 ends when its stdin closes:
    whoever still holds that pipe keeps it alive)."""
    def desc(pid: str) -> str:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            wchan = Path(f"/proc/{pid}/wchan").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:80]
        except OSError:
            return f"{pid} (gone)"
        return f"{pid} state={stat[0]} ppid={stat[1]} wchan={wchan} {cmd!r}"

    holders: dict[str, list[str]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fds = list((d / "fd").iterdir())
            except OSError:
                continue
            for fd in fds:
                try:
                    holders.setdefault(os.readlink(fd), []).append(f"{d.name}/fd{fd.name}")
                except OSError:
                    continue

    def pipes(pid: str) -> dict[str, tuple[str, list[str] | None]]:
        out = {}
        for fd in ("0", "1", "2"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("pipe:"):
                out[fd] = (target, holders.get(target))
        return out

    parts = []
    for line in lines:
        pid = line.split()[0]
        kids = [k.name for k in Path("/proc").iterdir() if k.name.isdigit() and _parent(int(k.name)) == int(pid)]
        parts.append(desc(pid) + "".join(f"\n    child {desc(k)} pipes {pipes(k)}" for k in kids))
    return "\n".join(parts)


def _start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def descendants(pid: int) -> dict[int, str]:
    """pid -> kernel start time of every live descendant of pid (children lists of every thread, recursively)."""
    out: dict[int, str] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        try:  # a process that exits during the scan is gone, not an error (glob raised FileNotFoundError in CI)
            threads = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for t in threads:
            try:
                kids = [int(k) for k in (t / "children").read_text().split()]
            except OSError:
                continue
            for k in kids:
                if k not in out and (st := _start(k)):
                    out[k] = st
                    todo.append(k)
    return out


def still_alive(procs: dict[int, str]) -> list[str]:
    """Those of procs that still run (same pid and start time, not a zombie), with their command lines."""
    alive = []
    for pid, st in procs.items():
        if _start(pid) != st:
            continue
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            alive.append(f"{pid} " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return alive


def active_slots(home: Path, name: str = "flywheel-sandbox") -> int:
    """Slots the Prefect database counts as taken in limit `name`, or in all flywheel limits with name="*" (0
    before the database or the limit exists)."""
    if not (home / "prefect.db").exists():
        return 0
    try:
        with sqlite3.connect(home / "prefect.db") as db:
            row = db.execute("SELECT sum(active_slots) FROM concurrency_limit_v2 WHERE name GLOB ?",
                             (name if name != "*" else "flywheel-*",)).fetchone()
    except sqlite3.OperationalError:  # not migrated yet
        return 0
    return row[0] or 0


def start_generate(tmp: Path, env: dict, n_tasks: int, out: str, backend: str = "local",
                   command: str = "generate", concurrency: int = 8) -> subprocess.Popen:
    """`flywheel generate` (or `flywheel run`, whose first stage is a generate of n_tasks, or `flywheel serve` of
    the generate flow, whose run of n_tasks `trigger_served_run` creates) in the background; its stdout and stderr
    go to tmp/OUT.out and tmp/OUT.err (files, not pipes: a leftover child would hold a pipe open, and no full pipe
    can block the command)."""
    gen = ["--set", f"generate.n_tasks={n_tasks}", "--set", "generate.samples=1", "--set", f"rollout.concurrency={concurrency}",
           "--set", f"sandbox.backend={json.dumps(backend)}", "--set", f"run.out={json.dumps(str(tmp / out))}"]
    args = {"generate": ["generate", *gen],
            # straight to the rollouts: no copy warm-up, and a held-out split of 2 tasks for round 0's baseline
            # (the default schedule scores 100 there first); its 400 train tasks keep round 1's teacher busy
            "run": ["run", *gen, "--set", "student.tiny.copy_warmup_steps=0", "--set",
                    f'flywheel.suites=[{{suite="arithmetic",train_tasks={n_tasks},heldout_tasks=2}}]'],
            "serve": ["serve", "--flow", "generate", *gen]}[command]
    with open(tmp / f"{out}.out", "w") as o, open(tmp / f"{out}.err", "w") as e:
        return subprocess.Popen([FLYWHEEL, *args], env={**env, "PYTHONUNBUFFERED": "1"}, cwd=tmp, stdout=o, stderr=e)


def _api(home: Path, path: str, body: dict) -> dict:
    """POST to the shared server's API. A 503 (the server busy, as under a loaded CI run) is retried with backoff,
    as Prefect's own client does; any other error, or 503s for a minute, fails the test."""
    url = json.loads((home / "flywheel-server.json").read_text())["url"]
    deadline = time.monotonic() + 60
    for attempt in range(1000):
        req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code != 503 or time.monotonic() > deadline:
                raise
        time.sleep(min(0.5 * 2 ** attempt, 5.0))
    raise AssertionError("unreachable")


def trigger_served_run(home: Path, err: Path, p: subprocess.Popen, deadline: float) -> None:
    """Once `serve` has registered generate/flywheel on the shared server, create a run of it (served config)."""
    while not (home / "flywheel-server.json").exists() or "serving " not in err.with_suffix(".out").read_text():
        assert p.poll() is None, err.read_text()[-3000:]
        assert time.monotonic() < deadline, "serve never started serving"
        time.sleep(0.5)
    while not (home / "flywheel-server.json").exists() or not (
            deps := [d for d in _api(home, "/deployments/filter", {}) if d["name"] == "flywheel"]):
        assert p.poll() is None, err.read_text()[-3000:]
        assert time.monotonic() < deadline, "serve never registered its deployment"
        time.sleep(0.5)
    _api(home, f"/deployments/{deps[0]['id']}/create_flow_run", {})


def kill_mid_rollout(tmp: Path, env: dict, home: Path, backend: str = "local",
                     command: str = "generate") -> tuple[dict[int, str], str]:
    """Start a long generate (or run, or serve and a served run of generate), wait until it holds its 8 sandbox
    slots (`run`, with no student warm-up: until its round-1 teacher rollouts start), SIGKILL it; returns its
    descendants (pid -> start time) as they were just before the kill (its sandboxes, its own server with
    FLYWHEEL_LOCAL_SERVER=own, the flow-run process of `serve`; never the shared server), and the Docker owner
    label value of its sandbox containers."""
    p = start_generate(tmp, env, 400, "lake-killed", backend, command)
    deadline = time.monotonic() + 400
    err = tmp / "lake-killed.err"
    if command == "serve":
        trigger_served_run(home, err, p, deadline)
    while active_slots(home) < 8 if command != "run" else "round 1 teacher: starting" not in err.read_text():
        assert p.poll() is None, err.read_text()[-3000:]
        assert time.monotonic() < deadline, "generate never took its sandbox slots"
        time.sleep(0.2)
    time.sleep(1.0)  # episodes in flight
    procs = descendants(p.pid)
    procs.pop(shared_server(home), None)  # started by this command when none ran, but not its own
    owner = f"{socket.gethostname()}:{p.pid}:{_start(p.pid)}"
    for starter in warm_starters(home).values():  # a warm client: its command is the starter's forked child
        forked = descendants(starter)
        procs.update(forked)
        child = next((k for k in forked if _parent(k) == starter), None)
        if child is not None:
            owner = f"{socket.gethostname()}:{child}:{forked[child]}"
    while backend == "docker" and not running_containers(owner):  # containers come up after the slots
        assert p.poll() is None and time.monotonic() < deadline, "no sandbox container of the command ran"
        time.sleep(0.5)
    p.send_signal(signal.SIGKILL)
    p.wait()
    return procs, owner


def running_containers(owner: str) -> list[str]:
    """Running sandbox containers whose owner label is the killed command (sandbox/reaper.py's label)."""
    out = subprocess.run(["docker", "ps", "-q", "--filter", f"label=flywheel.owner={owner}"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return out.split()


# A plain `generate` on the shared server with local sandboxes is the one pairing not listed: its local sandboxes
# are checked by `run`, `serve` and the warm generate, its shared-server slot release by `serve`, the warm generate
# and the Docker generate.
@pytest.mark.parametrize("command,backend,server", [
    ("run", "local", "shared"), ("serve", "local", "shared"), ("generate", "local", "own"),
    ("generate", "local", "warm"), pytest.param("generate", "docker", "shared", marks=pytest.mark.docker)])
def test_sigkill_leaves_no_process_and_no_taken_slot(tmp_path, command, backend, server):
    home, marker = tmp_path / "prefect-home", uuid.uuid4().hex
    env = {**_env(home, marker), "FLYWHEEL_LOCAL_SERVER": "shared" if server == "warm" else server,
           "FLYWHEEL_WARM": "1" if server == "warm" else "0"}
    try:
        if server == "warm":  # a first generate leaves a warm starter; the killed one is its forked child
            warm_up = start_generate(tmp_path, env, 1, "lake-warm-up")
            assert warm_up.wait(timeout=300) == 0, (tmp_path / "lake-warm-up.err").read_text()[-3000:]
            deadline = time.monotonic() + 180
            while not warm_starters(home, ready=True):
                assert time.monotonic() < deadline, "no warm starter came up"
                time.sleep(0.2)
        procs, owner = kill_mid_rollout(tmp_path, env, home, backend, command)
        shared = shared_server(home)
        deadline = time.monotonic() + 30  # parent-death signals, containers whose attach socket closed: a moment
        while (processes_with(marker, but={shared, *warm_starters(home).values()}) or still_alive(procs)
               or (backend == "docker" and running_containers(owner))) and time.monotonic() < deadline:
            time.sleep(0.2)
        # what there was to kill: its own server and sandboxes; serve's flow run and guard; `run` may still be in
        # threads only (no sandbox process yet) when the shared server is not its own. On Docker the sandboxes are
        # containers, not descendants (kill_mid_rollout waited for them to run).
        if backend == "local":
            assert len(procs) >= {("own", "generate"): 2, ("shared", "serve"): 2, ("shared", "generate"): 1,
                                  ("warm", "generate"): 2}.get((server, command), 0)
        assert still_alive(procs) == []
        left = processes_with(marker, but={shared, *warm_starters(home).values()})
        assert left == [], why_alive(left)
        if backend == "docker":
            assert running_containers(owner) == []

        t0 = time.monotonic()
        p = start_generate(tmp_path, env, 2, "lake-next", backend)
        p.wait(timeout=300)
        out, err = (tmp_path / "lake-next.out").read_text(), (tmp_path / "lake-next.err").read_text()
        assert p.returncode == 0, err
        assert "rows written 2" in out
        if command != "run":  # the slots came back: by the next command, or by the shared server's watchdog
            log = (home / "flywheel-server.log").read_text() if server in ("shared", "warm") else ""
            released = sum(int(n) for n in re.findall(
                r"released (\d+) slot\(s\) of concurrency limit 'flywheel-sandbox' held by a command that died "
                rf"\(pid {owner.split(':')[1]}\)", err + log))
            # own server only: a slot counted by a server killed before it filed the lease (reset_orphan_slots)
            orphans = sum(int(n) for n in re.findall(r"reset (\d+) slot\(s\) of concurrency limit 'flywheel-sandbox'",
                                                     err))
            assert released > 0 and released + orphans == 8 and (orphans == 0 or server == "own"), err + log
        assert active_slots(home, "*") == 0
        assert not [d for d in (home / "flywheel-leases").iterdir() if d.name != "shared"]  # all reaped or removed
        left = processes_with(marker, but={shared, *warm_starters(home).values()})
        assert left == [], why_alive(left)
        print(f"next generate after the kill: {time.monotonic() - t0:.1f} s")
        if server == "own":  # slots counted with no lease filed (_count_slots): the next command resets them
            _count_slots(home, 8)  # all of them: without the reset the next command would wait forever
            p = start_generate(tmp_path, env, 2, "lake-orphans")
            p.wait(timeout=300)
            err = (tmp_path / "lake-orphans.err").read_text()
            assert p.returncode == 0 and "rows written 2" in (tmp_path / "lake-orphans.out").read_text(), err
            assert "reset 8 slot(s) of concurrency limit 'flywheel-sandbox' that no live command holds" in err, err
            assert active_slots(home, "*") == 0
    finally:
        stop = subprocess.run([FLYWHEEL, "server", "stop"], env=env, capture_output=True, text=True, timeout=60,
                              check=False)
    if server in ("shared", "warm"):
        assert "stopped: http://127.0.0.1:" in stop.stdout and f"(pid {shared})" in stop.stdout
    assert processes_with(marker) == []  # `flywheel server stop` ended the shared server and starters: nothing left


def test_control_prefects_own_server_leaks_the_slots(tmp_path):
    """The fault the fix removes, shown on the same path: Prefect's temporary server keeps leases in memory."""
    home, marker = tmp_path / "prefect-home", uuid.uuid4().hex
    env = {**_env(home, marker), "FLYWHEEL_LOCAL_SERVER": "0",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300"}
    kill_mid_rollout(tmp_path, env, home)
    time.sleep(2)
    leftover = processes_with(marker)
    try:
        assert any("prefect.server.api.server:create_app" in c for c in leftover), leftover  # orphaned server
        p = start_generate(tmp_path, env, 2, "lake-next")
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=30)  # waits on 8 of 8 slots nobody will release (alone it ends in ~5 s)
        assert active_slots(home) == 8
        p.kill()
        p.wait()
    finally:
        for line in processes_with(marker):
            os.kill(int(line.split()[0]), signal.SIGKILL)


def _count_slots(home: Path, taken: int) -> None:
    """Fault injection: the database counts `taken` slots of flywheel-sandbox with no lease filed for them, as a
    command's own server leaves them when the command is killed between Prefect's count and its lease file."""
    with sqlite3.connect(home / "prefect.db") as db:
        db.execute("UPDATE concurrency_limit_v2 SET active_slots = ? WHERE name = 'flywheel-sandbox'", (taken,))


def test_reset_orphan_slots_waits_while_another_command_lives(tmp_path, monkeypatch, prefect_api):
    """flows/lease_reaper.py reset_orphan_slots on a real server: slots counted without a lease are left alone while
    another flywheel command lives (its slots may be counted before their lease is filed), and set back to 0 once
    none does. Through the console script, the own-server case of test_sigkill_leaves_no_process_and_no_taken_slot
    plants such slots after its kill and checks that the next command resets them."""
    from flows.lease_reaper import _api as api
    from flows.lease_reaper import reset_orphan_slots

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    name = f"flywheel-test-{uuid.uuid4().hex[:8]}"
    lim = api(prefect_api, "POST", "/v2/concurrency_limits/", {"name": name, "limit": 8, "active_slots": 4})
    try:
        live = tmp_path / "flywheel-leases" / f"{os.getpid()}-{_start(os.getpid())}"  # this test, as a live command
        live.mkdir(parents=True)
        own = live.with_name("1-0")  # the resetting command's own folder
        assert reset_orphan_slots(prefect_api, own) == {}
        assert api(prefect_api, "GET", f"/v2/concurrency_limits/{lim['id']}")["active_slots"] == 4
        live.rmdir()
        assert reset_orphan_slots(prefect_api, own).get(name) == 4
        assert api(prefect_api, "GET", f"/v2/concurrency_limits/{lim['id']}")["active_slots"] == 0
    finally:
        api(prefect_api, "DELETE", f"/v2/concurrency_limits/{lim['id']}")
