"""Reuse of local sandboxes (SandboxConfig.reuse): after an episode the backend resets its sandbox through the
sandbox's zygote and hands it to the next episode only when the checks pass; the next episode sees nothing of the
last one, a sandbox that fails a check is destroyed, and user code can neither reach the zygote nor an old handle
reach the next episode. The hostile suite (test_hostile.py) also runs against a reusing backend."""

from __future__ import annotations

import shutil
import textwrap
import threading
import time
from pathlib import Path

import pytest

from sandbox.local import LocalBackend
from sandbox.result import SandboxConfig, SandboxUnavailable

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install "
                                "bubblewrap)")

SMALL = {"memory_mb": 128, "pids_limit": 64, "cpus": 1.0, "timeout_s": 3.0, "output_limit_bytes": 20_000, "tmpfs_mb": 8}


@pytest.fixture
def backend():
    """pool_size=0: the reset runs in close(), so the next acquire() gets the reset sandbox deterministically."""
    b = LocalBackend(SandboxConfig(backend="local", reuse=True, **SMALL), pool_size=0)
    yield b
    b.shutdown()


def gone(pid: int, timeout_s: float = 5.0) -> bool:
    end = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < end:
        time.sleep(0.05)
    return not Path(f"/proc/{pid}").exists()


MESS = textwrap.dedent("""
    import os, subprocess
    secret = "episode one"
    for d in ("/tmp", "/workspace", "/dev/shm"):
        os.makedirs(f"{d}/deep/er", exist_ok=True)
        open(f"{d}/deep/er/f", "w").write("x")
        open(f"{d}/.hidden", "w").write("x")
        os.symlink("/usr", f"{d}/link")
        os.mkfifo(f"{d}/fifo")
        os.chmod(f"{d}/deep/er", 0)
        os.chmod(f"{d}/deep", 0)
    os.chmod("/tmp", 0o700)
    # a daemon that outlives the call (double fork, own session), and a stopped process
    subprocess.Popen(["sh", "-c", "sleep 300 & exit 0"], start_new_session=True)
    subprocess.Popen(["sleep", "300"]).send_signal(19)
    print(len(os.listdir("/proc")))
""")


def test_the_next_episode_sees_nothing_of_the_last_one(backend, marker, host):
    a = backend.acquire()
    assert a.run_python(MESS.replace("sleep 300", f"sleep 300 # {marker}")).verdict == "ok"
    assert a.run_python("'secret' in globals()").stdout == "True\n"
    holder = a.holder_pid
    a.close()
    assert host.wait_gone(marker) == [], "the last episode's processes survived the reset"
    b = backend.acquire()
    try:
        assert b.holder_pid == holder and b.episodes == 2 and backend.stats["reused"] == 1
        r = b.run_python("import os, stat\n"
                         "print(sorted(os.listdir('/tmp') + os.listdir('/workspace') + os.listdir('/dev/shm')))\n"
                         "print(oct(stat.S_IMODE(os.stat('/tmp').st_mode)))\n"
                         "print('secret' in globals())")
        assert r.verdict == "ok", r
        files, mode, secret = r.stdout.splitlines()
        assert files == "[]" and mode != "0o700" and secret == "False"
        # PID 1, the zygote and this episode's interpreter: nothing else runs
        assert len(b.processes()) == 3
        r = b.exec(["sh", "-c", "echo ok > /workspace/f && cat /workspace/f"])
        assert r.verdict == "ok" and r.stdout == "ok\n", r
    finally:
        b.close()


def test_a_sandbox_failing_a_check_is_destroyed_not_reused(backend):
    a = backend.acquire()
    # a System V shared memory segment lives in the sandbox's IPC namespace, outside any file or process
    r = a.run_python("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                     "print(libc.shmget(0, 4096, 0o1600) >= 0)")  # IPC_PRIVATE, IPC_CREAT | 0600
    assert r.stdout == "True\n", r
    holder = a.holder_pid
    a.close()
    assert backend.stats["reset_failed"] == 1 and gone(holder)
    b = backend.acquire()
    try:
        assert b.holder_pid != holder and b.episodes == 1
        r = b.run_python("print(open('/proc/sysvipc/shm').read().count(chr(10)))")
        assert r.stdout == "1\n", r  # the header line only
    finally:
        b.close()


def test_user_code_cannot_reach_the_zygote(backend):
    sb = backend.acquire()
    try:
        r = sb.run_python(textwrap.dedent("""
            import ctypes, os
            z = os.getppid()  # the zygote forked this interpreter
            out = []
            for path in (f"/proc/{z}/mem", f"/proc/{z}/environ", f"/proc/{z}/fd/0"):
                try:
                    open(path, "rb").read(1)
                    out.append("read " + path)
                except OSError as e:
                    out.append(type(e).__name__)
            libc = ctypes.CDLL(None, use_errno=True)
            out.append(libc.ptrace(16, z, 0, 0) == 0)  # PTRACE_ATTACH
            print(out)
        """))
        assert r.verdict == "ok", r
        assert r.stdout.strip() == "['PermissionError', 'PermissionError', 'PermissionError', False]", r.stdout
    finally:
        sb.close()
    assert backend.stats["reset_failed"] == 0


def test_killing_the_zygote_keeps_the_episode_but_ends_reuse(backend):
    a = backend.acquire()
    holder = a.holder_pid
    a.run_python("x = 1")
    r = a.exec(["sh", "-c", "kill -9 -1; sleep 0.2"])  # kills every process of the sandbox but PID 1: the zygote too
    assert r.verdict == "error", r
    assert a.run_python("x").verdict == "error"  # the interpreter died with the rest: its variables are gone
    r = a.run_python("print('still here')")
    assert r.stdout.strip() == "still here", r
    a.close()
    assert gone(holder)
    b = backend.acquire()
    try:
        assert b.holder_pid != holder and b.episodes == 1
    finally:
        b.close()


def test_posix_message_queues_are_refused(backend):
    sb = backend.acquire()
    try:
        r = sb.run_python("import ctypes, ctypes.util, os\n"
                          "rt = ctypes.CDLL(ctypes.util.find_library('rt'), use_errno=True)\n"
                          "fd = rt.mq_open(b'/fwq', os.O_CREAT | os.O_RDWR, 0o600, None)\n"
                          "print(fd, ctypes.get_errno())")
        fd, errno = r.stdout.split()
        assert fd == "-1" and int(errno) != 0, r
    finally:
        sb.close()


def test_an_old_handle_cannot_touch_the_next_episode(backend):
    a = backend.acquire()
    a.run_python("x = 1")
    a.close()
    b = backend.acquire()
    try:
        assert b.holder_pid == a.holder_pid
        assert a.run_python("print('old')").verdict == "infra_error"
        assert a.exec(["touch", "/workspace/old"]).verdict == "infra_error"
        assert a.processes() == [] and not a.alive()
        a.close()  # idempotent, and does not end b
        assert b.alive() and b.run_python("import os\nprint(os.listdir('.'))").stdout == "[]\n"
    finally:
        b.close()


def test_concurrent_episodes_on_a_pooled_reusing_backend():
    b = LocalBackend(SandboxConfig(backend="local", reuse=True, **SMALL), pool_size=2)
    dirty: list[str] = []

    def episodes(i: int) -> None:
        for j in range(4):
            with b.acquire() as sb:
                r = sb.run_python("import os\nprint(os.listdir('/workspace'), 'mine' in globals())")
                if r.stdout.strip() != "[] False":
                    dirty.append(r.stdout)
                sb.run_python(f"mine = {i}\nopen('/workspace/{i}-{j}', 'w').write('x')")

    try:
        threads = [threading.Thread(target=episodes, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert dirty == []
        assert b.stats["reused"] > 0 and b.stats["reset_failed"] == 0
    finally:
        b.shutdown()


def test_sequential_episodes_reuse_one_sandbox(backend):
    holders = set()
    for _ in range(6):
        sb = backend.acquire()
        holders.add(sb.holder_pid)
        assert sb.run_python("1").stdout == "1\n"
        sb.close()
    assert len(holders) == 1 and backend.stats == {"started": 2, "reused": 5, "reset_failed": 0}


def test_reuse_on_docker_is_refused_naming_the_fix():
    from sandbox.backend import check_backend

    with pytest.raises(SandboxUnavailable, match="local backend only; fix: use --backend local"):
        check_backend(SandboxConfig(backend="docker", reuse=True))
