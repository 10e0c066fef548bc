"""Reuse of sandboxes (SandboxConfig.reuse). Local: after an episode the backend resets its sandbox through the
sandbox's zygote and hands it to the next episode only when the checks pass; the next episode sees nothing of the
last one, a sandbox that fails a check is destroyed, and user code can neither reach the zygote nor an old handle
reach the next episode. Docker (reuse is its default): the host kills the episode's processes through the
container's cgroup, the container's keeper forks a fresh interpreter that empties the writable folders, and the
state it reports must match the container's fresh state; the same kinds of leftovers are tried, and a failed check
(a fault injected, named as such) removes the container. The hostile suite (test_hostile.py) also runs against
reusing backends."""

from __future__ import annotations

import shutil
import textwrap
import threading
import time
from pathlib import Path

import pytest

from sandbox.local import LocalBackend
from sandbox.result import SandboxConfig

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


MESS_FILES = textwrap.dedent("""
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
""")  # files, links, a fifo and unreadable folders in every writable folder (the Docker test leaves these too)
MESS = MESS_FILES + textwrap.dedent("""
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


# ---------------------------------------------------------------------------------------------------------------
# Docker: containers reset and checked between episodes (the default there)


@pytest.fixture
def docker_backend(sandbox_image):
    """pool_size=0: the reset runs in close(), so the next acquire() gets the reset container deterministically."""
    from sandbox.docker import DockerBackend

    b = DockerBackend(SandboxConfig(backend="docker", **SMALL), pool_size=0)
    yield b
    b.shutdown()
    assert b.client.api.containers(all=True, filters={"label": f"flywheel.backend={b.instance}"}) == []


DOCKER_MESS = MESS_FILES + textwrap.dedent("""
    import fcntl
    open("/workspace/.env", "w").write("export PATH=/tmp/evil:$PATH\\n")  # an environment change, in a file
    open("/tmp/solution.py", "w").write("def f(): return 'old'\\n")
    open("/tmp/solution.py", "a").write("def f(): return 'patched'\\n")  # a modified file in a writable path
    # a daemon that outlives the call (double fork, own session), a stopped process, a held lock and fd
    subprocess.Popen(["sh", "-c", "sleep 300 & exit 0"], start_new_session=True)
    subprocess.Popen(["sleep", "300"]).send_signal(19)
    subprocess.Popen(["python3", "-c", "import fcntl, time; f = open('/etc/passwd'); fcntl.flock(f, fcntl.LOCK_EX); "
                      "time.sleep(300) # sleep 300"], start_new_session=True)
    import time; time.sleep(0.5)
    print(len([p for p in os.listdir("/proc") if p.isdigit()]))
""")

DOCKER_LOOK = textwrap.dedent("""
    import fcntl, os, stat
    print(sorted(os.listdir('/tmp') + os.listdir('/workspace') + os.listdir('/dev/shm')))
    print('secret' in globals())
    f = open('/etc/passwd')
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError while the last episode's lock is held
    print('lock free')
    print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid())))
""")


@pytest.mark.docker
def test_docker_the_next_episode_sees_nothing_of_the_last_one(docker_backend, marker, host):
    b = docker_backend
    a = b.acquire()
    r = a.run_python(DOCKER_MESS.replace("sleep 300", f"sleep 300 # {marker}"))
    assert r.verdict == "ok" and int(r.stdout) >= 6, r  # PID 1, keeper, interpreter and the episode's processes
    assert host.pids_with(marker), "the episode's background processes should run until it ends"
    fresh = a.run_python(DOCKER_LOOK.replace("fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)", "pass"))
    cid = a.container_id
    a.close()
    assert host.wait_gone(marker) == [], "the last episode's processes survived the reset"
    nxt = b.acquire()
    try:
        assert nxt.container_id == cid and nxt.episodes == 2 and b.stats["reused"] == 1, b.stats
        r = nxt.run_python(DOCKER_LOOK)
        assert r.verdict == "ok", r
        files, secret, lock, procs = r.stdout.splitlines()
        assert (files, secret, lock, procs) == ("[]", "False", "lock free", "[]"), r.stdout
        assert fresh.stdout.splitlines()[0] != "[]"  # the look itself sees the mess when it is there
        r = nxt.exec(["sh", "-c", "echo ok > /workspace/f && cat /workspace/f && ls -A /tmp"])
        assert r.verdict == "ok" and r.stdout == "ok\n", r
    finally:
        nxt.close()
    assert b.stats["reset_failed"] == 0


@pytest.mark.docker
def test_docker_a_fresh_and_a_reused_container_look_the_same(docker_backend):
    """What an episode can see of its sandbox (processes, folders, mounts, limits, its interpreter) is the same in a
    fresh container and in one reset after an episode that ran code."""
    look = ("import os, sys, resource\n"
            "procs = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
            "print(procs == sorted({1, os.getppid(), os.getpid()}))\n"
            "print(os.getcwd(), os.getuid(), sorted(os.environ), sys.argv)\n"
            "print(sorted(k for k in globals() if not k.startswith('__')))\n"
            "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
            "print(resource.getrlimit(resource.RLIMIT_NOFILE), open('/proc/self/oom_score_adj').read().strip())\n"
            "print(sorted(l.split()[4] for l in open('/proc/self/mountinfo')))")
    a = docker_backend.acquire()
    first = a.run_python(look)
    a.run_python("x = 1\nopen('/tmp/f', 'w').write('y')\nimport json")
    a.close()
    nxt = docker_backend.acquire()
    try:
        assert nxt.episodes == 2
        again = nxt.run_python(look)
    finally:
        nxt.close()
    assert first.verdict == again.verdict == "ok", (first, again)
    assert first.stdout == again.stdout and first.stdout.startswith("True\n"), (first.stdout, again.stdout)


@pytest.mark.docker
def test_docker_a_container_failing_a_check_is_destroyed_not_reused(docker_backend):
    a = docker_backend.acquire()
    # a System V shared memory segment lives in the container's IPC namespace, outside any file or process
    r = a.run_python("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                     "print(libc.shmget(0, 4096, 0o1600) >= 0)")  # IPC_PRIVATE, IPC_CREAT | 0600
    assert r.stdout == "True\n", r
    cid = a.container_id
    a.close()
    assert docker_backend.stats["reset_failed"] == 1
    nxt = docker_backend.acquire()
    try:
        assert nxt.container_id != cid and nxt.episodes == 1
        r = nxt.run_python("print(open('/proc/sysvipc/shm').read().count(chr(10)))")
        assert r.stdout == "1\n", r  # the header line only
    finally:
        nxt.close()
    deadline = time.monotonic() + 10
    while docker_backend.client.api.containers(all=True, filters={"id": cid}) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not docker_backend.client.api.containers(all=True, filters={"id": cid}), "the failed container was kept"


@pytest.mark.docker
def test_docker_a_reset_whose_kill_fails_destroys_the_container(docker_backend, monkeypatch):
    """Fault injected (a stand-in for the host-side kill that reports survivors): the container is removed."""
    def fault_injected_kill(box, spare):
        return "1 process(es) survived the reset (fault injected)"

    a = docker_backend.acquire()
    a.run_python("x = 1")
    cid = a.container_id
    monkeypatch.setattr(docker_backend, "_kill_all_but", fault_injected_kill)
    a.close()
    monkeypatch.undo()
    assert docker_backend.stats["reset_failed"] == 1
    nxt = docker_backend.acquire()
    try:
        assert nxt.container_id != cid and nxt.run_python("'x' in globals()").stdout == "False\n"
    finally:
        nxt.close()


@pytest.mark.docker
def test_docker_killing_the_keeper_keeps_the_episode_and_the_next_is_clean(docker_backend, marker, host):
    a = docker_backend.acquire()
    a.run_python("x = 1")
    r = a.exec(["sh", "-c", f"sleep 300 & kill -9 -1; sleep 0.2 # {marker}"])  # everything but PID 1: keeper too
    assert r.verdict == "error", r
    r = a.run_python("print('still here')")
    assert r.stdout.strip().endswith("still here") or "still here" in r.stdout, r
    a.run_python(f"import subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 300 # {marker}'])")
    a.close()
    assert host.wait_gone(marker) == []
    nxt = docker_backend.acquire()  # reset with a new keeper (by exec), or destroyed: clean either way
    try:
        r = nxt.run_python("import os\nprint(os.listdir('/tmp'), 'x' in globals())")
        assert r.stdout == "[] False\n", r
    finally:
        nxt.close()


@pytest.mark.docker
def test_docker_an_old_handle_cannot_touch_the_next_episode(docker_backend):
    a = docker_backend.acquire()
    a.run_python("x = 1")
    a.close()
    b = docker_backend.acquire()
    try:
        assert b.container_id == a.container_id
        assert a.run_python("print('old')").verdict == "infra_error"
        assert a.exec(["touch", "/workspace/old"]).verdict == "infra_error"
        a.close()  # idempotent, and does not end b
        assert b.run_python("import os\nprint(os.listdir('.'))").stdout == "[]\n"
    finally:
        b.close()


@pytest.mark.docker
def test_docker_concurrent_episodes_on_a_pooled_reusing_backend(sandbox_image):
    from sandbox.docker import DockerBackend

    b = DockerBackend(SandboxConfig(backend="docker", **SMALL), pool_size=2)
    dirty: list[str] = []

    def episodes(i: int) -> None:
        for j in range(4):
            with_sb = b.acquire()
            try:
                r = with_sb.run_python("import os\nprint(os.listdir('/workspace'), 'mine' in globals())")
                if r.stdout.strip() != "[] False":
                    dirty.append(r.stdout)
                with_sb.run_python(f"mine = {i}\nopen('/workspace/{i}-{j}', 'w').write('x')")
            finally:
                with_sb.close()

    try:
        threads = [threading.Thread(target=episodes, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert dirty == []
        assert b.stats["reused"] > 0 and b.stats["reset_failed"] == 0, b.stats
    finally:
        b.shutdown()


def test_reuse_unset_means_off_for_local():
    """The local half of "unset means on for Docker, off for local"; the Docker half is the next test."""
    from sandbox.local import LocalBackend

    assert SandboxConfig().reuse is None
    lb = LocalBackend(SandboxConfig(backend="local"), pool_size=0)
    try:
        assert not lb.reuse
        first = lb.acquire()
        first.close()
        nxt = lb.acquire()
        try:
            assert nxt.episodes == 1  # a fresh sandbox, not the closed one reset
        finally:
            nxt.close()
    finally:
        lb.shutdown()


@pytest.mark.docker
def test_docker_reuse_unset_means_on(docker_backend):
    """The Docker half: with reuse unset (docker_backend's config does not set it) the next episode gets the
    container of the last one, reset."""
    assert docker_backend.config.reuse is None and docker_backend.reuse
    docker_backend.acquire().close()
    nxt = docker_backend.acquire()
    try:
        assert nxt.episodes == 2
    finally:
        nxt.close()
