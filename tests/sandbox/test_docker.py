"""The Docker backend against a real engine: the ExecResult contract, the container's limits, notebook state within
an episode and none across episodes, the warm pool, infra_error when the engine is unreachable, the reaper, and
cleanup when the owning process is killed."""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import textwrap
import time

import pytest

from sandbox.backend import check_backend, exec_once, open_backend
from sandbox.docker import DockerBackend
from sandbox.engine import owner_alive
from sandbox.reaper import reap
from sandbox.result import ExecResult, SandboxConfig, SandboxUnavailable

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def docker_backend(sandbox_image, host):
    b = DockerBackend(host.small_config("docker"), pool_size=2)
    yield b
    b.shutdown()
    assert host.own_containers(b) == []


def test_exec_contract_fields(sandbox_image, host):
    cfg = host.small_config("docker")
    ok = exec_once(cfg, ["python3", "-c", "import sys; print('out'); print('err', file=sys.stderr)"])
    assert isinstance(ok, ExecResult)
    assert (ok.verdict, ok.exit_code, ok.stdout, ok.stderr) == ("ok", 0, "out\n", "err\n")
    assert not ok.timed_out and not ok.oom_killed and not ok.truncated and ok.error is None and ok.duration_ms > 0
    err = exec_once(cfg, ["sh", "-c", "exit 3"])
    assert (err.verdict, err.exit_code) == ("error", 3)
    slow = exec_once(cfg.model_copy(update={"timeout_s": 1.0}), ["sleep", "30"])
    assert slow.verdict == "timeout" and slow.timed_out
    fed = exec_once(cfg, ["cat"], stdin=b"from stdin")
    assert fed.stdout == "from stdin"
    big = exec_once(cfg, ["python3", "-c", "print('z' * 100_000)"])
    assert big.verdict == "ok" and big.truncated and len(big.stdout) == cfg.output_limit_bytes
    oom = exec_once(cfg.model_copy(update={"timeout_s": 15.0}), ["python3", "-c", "b = b'x' * (1 << 30)"])
    assert oom.verdict == "resource_limit" and oom.oom_killed
    missing = exec_once(cfg, ["no-such-program"])
    assert missing.verdict == "error" and missing.exit_code == 127
    assert set(ok.model_dump()) >= {"exit_code", "stdout", "stderr", "timed_out", "oom_killed", "truncated",
                                    "duration_ms", "verdict"}


def test_container_limits(docker_backend, host):
    sb = docker_backend.acquire()
    try:
        info = docker_backend.client.api.inspect_container(sb.container_id)
        hc, cfg = info["HostConfig"], info["Config"]
        small = host.small
        assert hc["NetworkMode"] == "none" and cfg.get("NetworkDisabled") is True
        assert hc["Memory"] == hc["MemorySwap"] == small["memory_mb"] * 1024 * 1024
        assert hc["PidsLimit"] == small["pids_limit"]
        assert hc["NanoCpus"] == int(small["cpus"] * 1e9)
        assert hc["ReadonlyRootfs"] is True
        assert hc["CapDrop"] == ["ALL"] and not hc.get("CapAdd")
        assert "no-new-privileges" in hc["SecurityOpt"] and hc["Privileged"] is False
        assert set(hc["Tmpfs"]) == {"/tmp", "/workspace"}
        assert all(f"size={small['tmpfs_mb']}m" in v for v in hc["Tmpfs"].values())
        assert cfg["User"] == "65534:65534"
        assert cfg["Labels"]["flywheel.sandbox"] == "1" and cfg["Labels"]["flywheel.owner"] == docker_backend.owner
        assert not info["Mounts"] and not hc.get("Binds")  # no Docker socket, no host folder
        env = dict(e.split("=", 1) for e in cfg["Env"])
        assert set(env) <= {"PATH", "LANG", "PYTHONDONTWRITEBYTECODE", "HOME"}, env
        r = sb.exec(["sh", "-c", "id -u; touch /usr/x 2>&1; df -m /tmp /workspace | tail -2"])
        lines = r.stdout.splitlines()
        assert lines[0] == "65534" and "Read-only" in lines[1]
    finally:
        sb.close()


def test_state_kept_within_episode_and_absent_in_next(docker_backend):
    sb = docker_backend.acquire()
    try:
        assert sb.run_python("counter = 10\ndef bump():\n    global counter\n    counter += 1").verdict == "ok"
        for want in (11, 12, 13):
            r = sb.run_python("bump()\ncounter")
            assert r.verdict == "ok" and r.stdout.strip() == str(want), r
        sb.write_files({"notes/a.txt": "hello"})
        assert sb.run_python("print(open('notes/a.txt').read())").stdout.strip() == "hello"
    finally:
        sb.close()
    nxt = docker_backend.acquire()
    try:
        r = nxt.run_python("counter")
        assert r.verdict == "error" and "NameError" in r.stderr
        assert nxt.exec(["ls", "-A"]).stdout == ""
    finally:
        nxt.close()


def test_clean_sandbox_per_episode(docker_backend):
    ids = []
    for i in range(3):
        sb = docker_backend.acquire()
        ids.append(sb.container_id)
        script = ("ls -A /tmp /workspace /dev/shm | grep -v : | grep -c . ; "
                  f"echo {i} > /tmp/f; sleep 300 >/dev/null 2>&1 & echo started")
        r = sb.exec(["sh", "-c", script])
        assert r.stdout.splitlines()[0] == "0", r  # nothing left by the previous episode
        sb.close()
    assert len(set(ids)) == 3


def test_pool_acquire_is_fast(docker_backend):
    times = []
    for _ in range(6):
        time.sleep(0.6)  # let the refill thread keep up, as between real episodes
        t = time.perf_counter()
        sb = docker_backend.acquire()
        times.append((time.perf_counter() - t) * 1000)
        assert sb.run_python("print(1)").verdict == "ok"
        sb.close()
    assert statistics.median(times) <= 50, times


def test_warm_interpreter_call_is_fast(docker_backend):
    """Side by side in one sandbox: a call to the warm interpreter against a process started per call (exec).
    The 10 ms goal is checked by benchmarks/sandbox.py; here, relative, so a loaded CI machine does not flake."""
    sb = docker_backend.acquire()
    try:
        sb.run_python("x = 0")
        interp, proc = [], []
        for _ in range(10):
            t = time.perf_counter()
            assert sb.run_python("x += 1").verdict == "ok"
            interp.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            assert sb.exec(["python3", "-c", "x = 1"]).verdict == "ok"
            proc.append((time.perf_counter() - t) * 1000)
        assert sb.run_python("x").stdout.strip() == "10"
        assert statistics.median(interp) * 5 <= statistics.median(proc), (interp, proc)
        assert statistics.median(interp) <= 50, interp
    finally:
        sb.close()


def test_engine_unreachable_is_unavailable_with_fix(monkeypatch, host):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    cfg = host.small_config("docker")
    with pytest.raises(SandboxUnavailable, match="start dockerd"):
        open_backend(cfg)
    with pytest.raises(SandboxUnavailable, match="start dockerd"):
        check_backend(cfg)
    with pytest.raises(SandboxUnavailable, match="start dockerd"):
        exec_once(cfg, ["true"])


def test_engine_lost_mid_episode_is_infra_error(sandbox_image, host):
    """Fault injection: after acquire, the backend's client is swapped for one on a dead socket (a test double).
    pool_size=0 and no reuse (whose acquire starts the keeper's interpreter ahead), so no interpreter was started
    ahead: both calls need the engine."""
    import docker

    b = DockerBackend(host.small_config("docker", reuse=False), pool_size=0)
    sb = b.acquire()
    real = b.client
    dead_client_double = docker.DockerClient(base_url="unix:///nonexistent", version="1.41")
    try:
        b.client = dead_client_double
        for r in (sb.exec(["true"]), sb.run_python("print(1)")):
            assert r.verdict == "infra_error" and r.exit_code is None and r.error, r
            assert "nonexistent" in r.error or "No such file" in r.error or "Connection" in r.error
    finally:
        b.client = real
        sb.close()
        b.shutdown()


def test_create_failure_is_retried_then_infra(sandbox_image, host):
    """Fault injection: container creation fails (client double on a dead socket) -> retried, then SandboxError."""
    import docker

    from sandbox.result import SandboxError

    b = DockerBackend(host.small_config("docker"), pool_size=0)
    real = b.client
    b.client = docker.DockerClient(base_url="unix:///nonexistent", version="1.41")  # dead-engine double
    try:
        t = time.monotonic()
        with pytest.raises(SandboxError, match="3 times") as e:
            b.acquire()
        assert not isinstance(e.value, SandboxUnavailable)
        assert time.monotonic() - t >= 0.2 + 0.4  # backoff between tries
        assert "3 times" in str(e.value)
    finally:
        b.client = real
        b.shutdown()


def test_missing_image_names_the_fix(host):
    cfg = host.small_config("docker", image="flywheel-sandbox:does-not-exist")
    with pytest.raises(SandboxUnavailable, match="build-image"):
        open_backend(cfg)


def test_reaper_removes_strays_only(docker_backend, sandbox_image):
    api = docker_backend.client.api
    dead_owner = f"{socket.gethostname()}:999999999:1"
    assert not owner_alive(dead_owner) and owner_alive(docker_backend.owner)
    stray = api.create_container(sandbox_image, ["sleep", "300"], labels={"flywheel.sandbox": "1",
                                 "flywheel.owner": dead_owner}, host_config=api.create_host_config(network_mode="none"))
    api.start(stray["Id"])
    sb = docker_backend.acquire()  # a live container of a live owner: must survive
    try:
        reap(docker_backend.client)  # (another process's backend, starting now, may reap it first: same code)
        # When another process's reaper got there first, its removal may still be in progress ("already in
        # progress" is skipped by reap): wait for the engine to finish it, bounded.
        end = time.monotonic() + 30
        while api.containers(all=True, filters={"id": stray["Id"]}) and time.monotonic() < end:
            time.sleep(0.5)
        assert not api.containers(all=True, filters={"id": stray["Id"]})
        assert api.containers(filters={"id": sb.container_id})
        assert sb.run_python("print('alive')").stdout.strip() == "alive"
    finally:
        sb.close()


def test_containers_go_when_owner_is_killed(sandbox_image, host):
    code = textwrap.dedent("""
        import sys, time
        from sandbox.docker import DockerBackend
        from sandbox.result import SandboxConfig
        b = DockerBackend(SandboxConfig(memory_mb=128), pool_size=2)
        sb = b.acquire()
        sb.run_python("x = 1")
        print(b.owner, flush=True)
        time.sleep(300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        owner = proc.stdout.readline().strip()
        assert owner, "the child backend did not start"
        import docker

        api = docker.from_env().api
        label = {"label": f"flywheel.owner={owner}"}
        deadline = time.monotonic() + 30
        while len(api.containers(filters=label)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(api.containers(filters=label)) == 3  # one in use, two pooled
    finally:
        proc.kill()  # SIGKILL: no atexit, no signal handler runs
        proc.wait()
    deadline = time.monotonic() + 15
    while api.containers(all=True, filters=label) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert api.containers(all=True, filters=label) == []


def test_auto_fallback_to_local_is_said(monkeypatch, caplog, host):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    with caplog.at_level("WARNING"):
        r = exec_once(host.small_config("docker"), ["sh", "-c", "echo via-local"], auto_fallback=True)
    assert r.verdict == "ok" and r.stdout.strip() == "via-local"
    assert any("falling back to the local" in m for m in caplog.messages)


def test_config_defaults_are_valid():
    assert SandboxConfig().backend == "auto"  # Docker when an engine answers, else bubblewrap (said in the log)


def test_build_image_reuses_and_names_missing_tools(sandbox_image, monkeypatch):
    from sandbox import image as image_mod

    t = time.monotonic()
    assert image_mod.build_image(SandboxConfig().image) == sandbox_image  # already there: reused, not rebuilt
    assert time.monotonic() - t < 5
    assert image_mod.image_id("flywheel-sandbox:no-such-tag") is None
    # fault injection: debootstrap absent from PATH (a stand-in for `which`) -> the fix is named, nothing built
    monkeypatch.setattr(image_mod.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="apt-get install -y debootstrap"):
        image_mod.build_image("flywheel-sandbox:never-built", force=True)
    assert image_mod.image_id("flywheel-sandbox:never-built") is None
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    with pytest.raises(SandboxUnavailable, match="start dockerd"):
        image_mod.build_image()


def test_write_files_stays_in_workspace(docker_backend):
    from sandbox.result import SandboxError

    sb = docker_backend.acquire()
    try:
        sb.write_files({"a.py": "print('a')\n", "pkg/b.txt": "ü and ✓"})
        assert sb.exec(["python3", "a.py"]).stdout == "a\n"
        assert sb.exec(["cat", "pkg/b.txt"]).stdout == "ü and ✓"
        with pytest.raises(SandboxError, match="outside the workspace"):
            sb.write_files({"../tmp/x": "no"})
    finally:
        sb.close()


def test_memory_spread_over_processes_is_contained(docker_backend):
    """30 processes x 8 MB against a 128 MB limit: the cgroup OOM killer takes commands, never PID 1, and the
    episode's interpreter (with its variables) survives a command's memory bomb."""
    sb = docker_backend.acquire()
    try:
        assert sb.run_python("kept = 'yes'").verdict == "ok"
        code = ("import os, time\n"
                "for i in range(30):\n"
                "    if os.fork() == 0:\n"
                "        b = b'x' * (8 << 20); time.sleep(2); os._exit(0)\n"
                "for i in range(30):\n"
                "    os.wait()\n")
        r = sb.exec(["python3", "-c", code], timeout_s=10)
        assert r.verdict == "resource_limit" and r.oom_killed, r
        assert sb.exec(["echo", "alive"]).stdout == "alive\n"
        assert sb.run_python("print(kept)").stdout == "yes\n"
    finally:
        sb.close()


def test_interpreter_killed_between_calls_is_replaced_and_said(docker_backend):
    sb = docker_backend.acquire()
    try:
        assert sb.run_python("v = 1").verdict == "ok"
        kill = ("import os, signal\n"
                "m = b'_Ker' + b'nel()'\n"
                "for p in os.listdir('/proc'):\n"
                "    if p.isdigit() and int(p) not in (os.getpid(), os.getppid()):\n"
                "        try:\n"
                "            if m in open(f'/proc/{p}/cmdline', 'rb').read(): os.kill(int(p), signal.SIGKILL)\n"
                "        except OSError: pass\n")
        assert sb.exec(["python3", "-c", kill]).verdict == "ok"
        time.sleep(0.5)  # the engine closes the dead interpreter's stream asynchronously (a model turn is longer)
        r = sb.run_python("print('new')")
        assert r.verdict == "ok" and r.stdout == "new\n", r
        assert "had died since the last call" in r.stderr
        r = sb.run_python("v")
        assert r.verdict == "error" and "NameError" in r.stderr
    finally:
        sb.close()
