"""The local bubblewrap backend keeps the sandbox contract: ExecResult fields and verdicts, a persistent interpreter,
limits, isolation (user, capabilities, environment, filesystem, network), a clean sandbox per episode, and nothing
left behind after close, shutdown or the death of the owning process. Hostile programs are in test_hostile.py."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from sandbox import procfs
from sandbox.bwrap import SANDBOX_ENV
from sandbox.local import LocalBackend
from sandbox.result import ExecResult, SandboxConfig, SandboxError, SandboxUnavailable

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install "
                                "bubblewrap)")

SMALL = {"memory_mb": 128, "pids_limit": 64, "cpus": 1.0, "timeout_s": 3.0, "output_limit_bytes": 20_000, "tmpfs_mb": 8}


def sleeper(marker: str) -> list[str]:
    """A long sleep whose command line carries the marker (so the host can find it)."""
    return ["python3", "-c", "import time; time.sleep(300)", marker]


@pytest.fixture(scope="module")
def backend():
    b = LocalBackend(SandboxConfig(backend="local", **SMALL), pool_size=0)  # the pool has its own test
    yield b
    b.shutdown()


@pytest.fixture
def sb(backend):
    s = backend.acquire()
    yield s
    s.close()
    assert s.processes() == []


def test_missing_bwrap_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # fault injection: no bwrap on PATH
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        LocalBackend(SandboxConfig(backend="local"))


def test_exec_fields_and_verdicts(sb):
    r = sb.exec(["sh", "-c", "echo out; echo err >&2"])
    assert isinstance(r, ExecResult)
    assert (r.verdict, r.exit_code, r.stdout, r.stderr, r.timed_out, r.truncated) == ("ok", 0, "out\n", "err\n",
                                                                                       False, False)
    assert r.duration_ms > 0 and r.error is None and not r.oom_killed
    r = sb.exec(["sh", "-c", "exit 3"])
    assert (r.verdict, r.exit_code) == ("error", 3)
    r = sb.exec(["no-such-program"])
    assert (r.verdict, r.exit_code) == ("error", 127) and "no-such-program" in r.stderr
    assert sb.exec(["cat"], stdin=b"piped in").stdout == "piped in"
    big = os.urandom(300_000).hex().encode()  # larger than a pipe buffer both ways
    r = sb.exec(["sh", "-c", "cat | wc -c"], stdin=big)
    assert r.stdout.strip() == str(len(big))


def test_exec_timeout_and_background_children(sb):
    t = time.monotonic()
    r = sb.exec(["sleep", "30"], timeout_s=0.5)
    assert r.verdict == "timeout" and r.timed_out and r.exit_code is None
    assert time.monotonic() - t < 2
    t = time.monotonic()
    r = sb.exec(["sh", "-c", "sleep 30 & echo started"])  # the daemon keeps stdout open: we do not wait for it
    assert r.verdict == "ok" and r.stdout == "started\n" and time.monotonic() - t < 2


def test_run_python_keeps_state_and_reports_errors(sb):
    assert sb.run_python("import math\nr = math.sqrt(16)").verdict == "ok"
    r = sb.run_python("print(r)\nr * 2")
    assert (r.verdict, r.exit_code, r.stdout) == ("ok", 0, "4.0\n8.0\n")
    r = sb.run_python("undefined_name")
    assert r.verdict == "error" and r.exit_code == 1 and "NameError" in r.stderr and r.error is None
    r = sb.run_python("import sys; sys.exit(4)")
    assert (r.verdict, r.exit_code) == ("error", 4)
    r = sb.run_python("import time; time.sleep(30)", timeout_s=0.5)
    assert r.verdict == "timeout" and r.timed_out
    assert sb.run_python("r").stdout == "4.0\n"


def test_interpreter_death_restarts_with_a_note_and_keeps_files(sb):
    sb.run_python("open('kept.txt', 'w').write('file survives')\nv = 1")
    r = sb.run_python("import os\nos._exit(9)")
    assert r.verdict == "error" and r.exit_code == 9
    r = sb.run_python("print(open('kept.txt').read())\nprint('v' in globals())")
    assert r.verdict == "ok" and r.stdout == "file survives\nFalse\n"
    assert "fresh interpreter" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the host-user switch happens only when we are root")
def test_as_root_the_sandbox_runs_as_host_nobody_without_root_groups(sb):
    """Seen from the host: PID 1 of the sandbox and every entered process run as uid/gid 65534 with no
    supplementary groups (the switch is made by setpriv and by the enter helper, not by Popen's user/group
    arguments, which would make CPython fork the whole flow process for every spawn)."""
    assert sb.run_python("x = 1").verdict == "ok"  # the persistent interpreter: an entered process that stays

    def status(pid: int) -> dict[str, str]:
        return dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if ":\t" in line)

    holder = status(sb.holder_pid)
    assert holder["Uid"].split()[:2] == ["65534", "65534"] and holder["Gid"].split()[:2] == ["65534", "65534"]
    assert holder["Groups"].strip() == ""
    interp = [p for p in sb.processes() if p != sb.holder_pid]
    assert interp, sb.processes()
    for pid in interp:
        st = status(pid)
        assert st["Uid"].split()[0] == "65534" and st["Groups"].strip() == "", st


def test_files_are_shared_between_exec_write_files_and_python(sb):
    sb.write_files({"pkg/data.txt": "hello", "top.txt": "t"})
    assert sb.exec(["cat", "pkg/data.txt"]).stdout == "hello"
    assert sb.run_python("print(open('/workspace/top.txt').read())").stdout == "t\n"
    with pytest.raises(SandboxError, match="outside the workspace"):
        sb.write_files({"../etc/evil": "x"})


def test_identity_and_environment(sb):
    r = sb.run_python(f"ENV = {SANDBOX_ENV!r}\n" + textwrap.dedent("""
        import os, socket
        status = dict(line.split(':\\t', 1) for line in open('/proc/self/status').read().splitlines() if ':\\t' in line)
        print(os.getuid(), os.getgid(), os.getgroups(), os.getcwd(), socket.gethostname())
        print(status['CapEff'].strip(), status['CapBnd'].strip() != '', status['NoNewPrivs'].strip())
        print(sorted(os.environ.items()) == sorted(ENV.items()))
        print(sorted(os.listdir('/')))
        env1 = dict(kv.split(b'=', 1) for kv in open('/proc/1/environ', 'rb').read().split(b'\\0')[:-1])
        print(env1 == {**{k.encode(): v.encode() for k, v in ENV.items()}, b'PWD': b'/workspace'})
    """))
    assert r.verdict == "ok", r
    lines = r.stdout.splitlines()
    assert lines[0] == "65534 65534 [] /workspace sandbox"
    assert lines[1] == "0000000000000000 True 1"
    assert lines[2] == "True"
    assert lines[3] == str(sorted(["bin", "dev", "etc", "lib", "lib64", "proc", "sbin", "tmp", "usr", "workspace"]
                                  + [d for d in ("lib32", "libx32") if Path("/" + d).exists()]))
    assert lines[4] == "True"


def test_host_paths_and_root_are_not_reachable(sb):
    r = sb.exec(["sh", "-c", "ls /root /home /work /var 2>&1; touch /usr/x /x /etc/x 2>&1; id -un"])
    assert r.stdout.count("No such file or directory") == 4, r
    assert r.stdout.count("Read-only file system") == 3, r
    assert r.stdout.strip().endswith("nobody")
    r = sb.exec(["python3", "-c", "import ctypes; print(ctypes.CDLL(None, use_errno=True).unshare(0x10000000))"])
    assert r.stdout.split()[0] == "-1", r  # no nested user namespaces (no way around the tmpfs sizes)


def test_no_network(sb):
    r = sb.run_python("import socket\nprint([n for _, n in socket.if_nameindex()])\n"
                      "print(len(open('/proc/net/route').read().splitlines()) - 1)")
    assert r.stdout.splitlines() == ["['lo']", "0"]  # no interface but lo, no route: nothing can leave


def test_tmpfs_sizes_and_memory_and_pids_limits(sb):
    r = sb.exec(["df", "-k", "/tmp", "/workspace", "/dev/shm"])
    sizes = [int(line.split()[1]) for line in r.stdout.splitlines()[1:]]
    assert sizes == [SMALL["tmpfs_mb"] * 1024] * 3, r.stdout
    r = sb.exec(["python3", "-c", "b = bytearray(200 * 1024 * 1024)"])
    assert r.verdict == "resource_limit" and "memory limit" in r.stderr
    r = sb.run_python("b = bytearray(200 * 1024 * 1024)")
    assert r.verdict == "resource_limit"
    bomb = "import os, time\nfor _ in range(200):\n    if os.fork() == 0:\n        time.sleep(30)\n        os._exit(0)"
    r = sb.exec(["python3", "-c", bomb])
    assert r.verdict == "resource_limit" and "pids limit" in r.stderr, r
    assert sb.exec(["echo", "recovered"]).stdout == "recovered\n"  # the bomb's processes were killed


def test_output_caps(sb):
    r = sb.exec(["python3", "-c", "import sys; sys.stdout.write('y' * 1_000_000)"])
    assert r.verdict == "ok" and r.truncated and r.stdout == "y" * SMALL["output_limit_bytes"]
    r = sb.exec(["yes"], timeout_s=10)
    assert r.verdict == "resource_limit" and r.truncated and "flood" in r.stderr


def test_episodes_are_clean_and_separate(backend):
    a = backend.acquire()
    try:
        r = a.exec(["sh", "-c", "echo 1 > /tmp/left; echo 1 > /dev/shm/left; echo 1 > left; readlink /proc/self/ns/pid"])
        ns_a = r.stdout.strip()
        a.run_python("secret = 'episode a'")
        b = backend.acquire()
        try:
            r = b.exec(["sh", "-c", "ls -A /tmp /dev/shm /workspace; readlink /proc/self/ns/pid"])
            assert "left" not in r.stdout
            assert r.stdout.strip().splitlines()[-1] != ns_a
            assert b.run_python("'secret' in globals()").stdout == "False\n"
        finally:
            b.close()
    finally:
        a.close()


def test_close_kills_everything_and_is_idempotent(backend, host, marker):
    s = backend.acquire()
    s.run_python(f"import subprocess\nsubprocess.Popen({sleeper(marker)!r}, start_new_session=True)\nNone")
    time.sleep(0.2)
    assert host.pids_with(marker)
    holder = s.holder_pid
    s.close()
    s.close()
    assert host.wait_gone(marker) == [] and not Path(f"/proc/{holder}").exists()
    assert s.exec(["true"]).verdict == "infra_error"
    assert s.run_python("1").verdict == "infra_error"


def test_shutdown_closes_live_sandboxes(host, marker):
    b = LocalBackend(SandboxConfig(backend="local", **SMALL), prestart_interpreter=False)
    boxes = [b.acquire() for _ in range(3)]
    for s in boxes:
        assert s.exec(["sh", "-c", f"{shlex.join(sleeper(marker))} & echo"]).verdict == "ok"
    time.sleep(0.3)
    assert len(host.pids_with(marker)) == 3
    b.shutdown()
    assert all(s.closed for s in boxes)
    assert host.wait_gone(marker) == []
    with pytest.raises(SandboxError):
        b.acquire()


def test_sandbox_dies_with_its_owner(host, marker):
    script = textwrap.dedent(f"""
        import sys, time
        from sandbox.local import LocalBackend
        from sandbox.result import SandboxConfig
        sb = LocalBackend(SandboxConfig(backend="local")).acquire()
        sb.run_python("import subprocess; subprocess.Popen({sleeper(marker)!r}, start_new_session=True)")
        print(sb.holder_pid, flush=True)
        time.sleep(300)
    """)
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    holder = int(owner.stdout.readline())
    assert Path(f"/proc/{holder}").exists() and host.pids_with(marker)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert host.wait_gone(marker, timeout_s=5) == []
    deadline = time.monotonic() + 5
    while Path(f"/proc/{holder}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{holder}").exists()


def test_owner_killed_while_bwrap_starts_leaves_no_sandbox_process():
    """A SIGKILL of the owner right after it started bwrap, before it read anything back (FAULT INJECTED: the child's
    _await_holder kills its own process): within seconds no process of that sandbox remains (the start-time kill of
    tests/flows/test_kill.py, made deterministic; random kill times: scripts/kill_during_start.py)."""
    from sandbox.reaper import OWNER_ARG

    script = textwrap.dedent("""
        import os, signal
        from sandbox.local import LocalBackend, LocalSandbox
        from sandbox.reaper import owner_arg
        from sandbox.result import SandboxConfig
        backend = LocalBackend(SandboxConfig(backend="local"), pool_size=0, prestart_interpreter=False)
        print(owner_arg(), flush=True)
        def killed_owner(self, info_fd):  # FAULT: the owner dies the moment bwrap runs
            os.kill(os.getpid(), signal.SIGKILL)
        LocalSandbox._await_holder = killed_owner
        backend.acquire()
    """)
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    arg = owner.stdout.readline().strip()
    assert arg.startswith(OWNER_ARG)
    assert owner.wait(timeout=60) == -signal.SIGKILL

    def left() -> list[int]:
        pids = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and arg.encode() in (d / "cmdline").read_bytes().split(b"\0") \
                        and (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(d.name))
            except OSError:
                continue
        return pids

    deadline = time.monotonic() + 10
    while (pids := left()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:  # the sandbox this test started: do not leave it to later tests
        os.kill(pid, signal.SIGKILL)
    assert pids == [], f"processes of the sandbox whose owner died during its start: {pids}"


def test_parallel_sandboxes_in_threads(backend):
    results: dict[int, str] = {}

    def episode(i: int) -> None:
        with backend.acquire() as s:
            s.run_python(f"n = {i}")
            results[i] = s.run_python("n * 10").stdout.strip()

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: str(i * 10) for i in range(4)}


def test_pool_hands_out_fresh_sandboxes_and_shutdown_empties_it():
    b = LocalBackend(SandboxConfig(backend="local", **SMALL), pool_size=2)
    try:
        deadline = time.monotonic() + 10
        while len(b._pool._ready) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pooled = [s.holder_pid for s in b._pool._ready]
        assert len(pooled) == 2
        t = time.perf_counter()
        first = b.acquire()
        assert (time.perf_counter() - t) < 0.05  # taken from the pool, not started now
        second = b.acquire()
        assert first.holder_pid != second.holder_pid
        assert first.run_python("x = 1").verdict == "ok" and second.run_python("'x' in globals()").stdout == "False\n"
        first.close()
        third = b.acquire()  # never the closed one again
        assert third.holder_pid not in (first.holder_pid, second.holder_pid) and third.alive()
        holders = [first.holder_pid, second.holder_pid, third.holder_pid, *(s.holder_pid for s in b._pool._ready)]
    finally:
        b.shutdown()
    deadline = time.monotonic() + 5
    while any(Path(f"/proc/{p}").exists() for p in holders) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(Path(f"/proc/{p}").exists() for p in holders)


def test_enter_refuses_a_pid_that_is_not_the_sandbox(sb):
    sb_pidns = sb._pidns
    sb._pidns = os.readlink("/proc/self/ns/pid")  # fault injection: as if the holder's pid now were a host process
    try:
        r = sb.exec(["id"])
        assert r.verdict == "infra_error" and "no longer the sandbox's PID 1" in (r.error or ""), r
    finally:
        sb._pidns = sb_pidns
    assert sb.exec(["true"]).verdict == "ok"


def test_killed_calls_leave_no_orphans_and_close_is_prompt(sb):
    sb.run_python("1")
    expected = {sb.holder_pid, sb._zygote_pid, *sb._children_of(sb._zygote_pid)}  # PID 1, zygote, interpreter
    assert len(expected) == 3
    # a sleeper ends on the clock; `yes` (given a clock far past it) on the output flood limit
    for argv, timeout_s, verdict in ((["sleep", "30"], 0.5, "timeout"), (["yes"], 30, "resource_limit")):
        r = sb.exec(argv, timeout_s=timeout_s)
        assert r.verdict == verdict, r
        # nothing left, not even a zombie handed to the host's init (which would stall the sandbox's teardown);
        # a loaded machine may take a moment to reap the killed tree
        deadline = time.monotonic() + 3.0
        while set(sb.processes()) != expected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(sb.processes()) == expected
    t = time.monotonic()
    sb.close()
    assert time.monotonic() - t < 1.0


def test_reap_local_kills_only_sandbox_processes_whose_owner_is_gone():
    """sandbox.local.reap_local: a process carrying the sandbox marker and a dead owner is killed; one whose owner
    lives, and one without the marker, are left alone (real processes, no sandbox needed). The marker is the
    test's own: with MARKER, a command of another test running beside this one (each command reaps) killed the
    dead-owner process first, and this call found nothing to kill (a clean-clone CI run failed on `0 >= 1`)."""
    from sandbox.reaper import MARKER, OWNER_ARG, owner_arg, reap_local

    marker = f"{MARKER}-test-{uuid.uuid4().hex}"
    code = "import time; time.sleep(120)"
    dead = subprocess.Popen([sys.executable, "-c", code, marker, f"{OWNER_ARG}999999999-1"])
    live = subprocess.Popen([sys.executable, "-c", code, marker, owner_arg()])
    other = subprocess.Popen([sys.executable, "-c", code, "not-a-sandbox", f"{OWNER_ARG}999999999-1"])
    try:
        time.sleep(0.3)
        reap_local()  # what every command runs (MARKER): it leaves the test's processes alone
        assert dead.poll() is None
        assert reap_local(marker) == 1
        assert dead.wait(timeout=10) == -signal.SIGKILL
        assert live.poll() is None and other.poll() is None
    finally:
        for p in (dead, live, other):
            p.kill()
            p.wait()


def test_reap_local_kills_the_group_of_a_dead_owners_bwrap():
    """A sandbox process that leads its process group (bwrap, started in a session of its own) is killed with its
    group: bwrap's child, cloned but not yet given the go-ahead, waits forever once its parent is gone (an orphaned
    copy of bwrap; reproduced with bwrap's --userns-block-fd). Here the leader carries the marker and a dead owner,
    its child in the same group carries neither: one call kills both, and counts the leader once."""
    from sandbox.reaper import MARKER, OWNER_ARG, reap_local

    marker = f"{MARKER}-test-{uuid.uuid4().hex}"
    code = "import subprocess, sys, time; c = subprocess.Popen(['sleep', '120']); print(c.pid, flush=True); time.sleep(120)"
    leader = subprocess.Popen([sys.executable, "-c", code, marker, f"{OWNER_ARG}999999999-1"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        child = int(leader.stdout.readline())
        assert os.getpgid(child) == leader.pid
        assert reap_local(marker) == 1
        assert leader.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while procfs.running(child) and time.monotonic() < deadline:  # its parent gone: init reaps it
            time.sleep(0.05)
        assert not procfs.running(child)
    finally:
        try:
            os.killpg(leader.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        leader.wait()


def test_a_handle_dropped_without_close_frees_its_slot_when_collected():
    """The backend bounds the sandboxes in use; a handle its caller lost without close() gives its slot back when it
    is collected, so lost handles cannot wear the bound down until every acquire() waits and fails."""
    import gc

    b = LocalBackend(SandboxConfig(backend="local"), pool_size=0, max_sandboxes=1, acquire_timeout_s=3)
    try:
        sb = b.acquire()
        holder = sb.holder_pid
        del sb
        gc.collect()
        try:  # its PID 1 ends when its stdin closes with the collected handle; make sure, as close() would
            os.kill(holder, signal.SIGKILL)
        except ProcessLookupError:
            pass
        again = b.acquire()  # with the slot still taken this waits 3 s and raises "exhausted"
        assert again.exec(["true"]).verdict == "ok"
        again.close()
    finally:
        b.shutdown()
