"""Hostile programs, one test each, on both backends (docker and local): each asserts the verdict the sandbox gives
and that the host is unharmed and clean afterwards (the `episode` fixture checks that no process carrying the
test's marker and no container of the episode is left).

The bombs are bounded (at most ~1000 processes, 2 GB, 256 MB of disk, a few seconds) so that a backend that fails
to contain them fails its test without harming the shared machine; network and signal tests first check that the
sandbox is isolated (no interface but lo, its own pid namespace) and refuse to go on otherwise, so no real traffic
ever leaves and no host process can be signalled.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time

import pytest

from sandbox.result import SandboxError

LIMIT = 64_000  # output_limit_bytes of the small config in conftest.py
HOST_SECRET = os.environ["FLYWHEEL_TEST_HOST_SECRET"]  # set by conftest.py before any backend starts
GRACE = 2.0  # the backends' backstop grace past a call's timeout
SLACK = 1.5  # scheduling slack on 2 shared cores


def check_isolated(sb) -> None:
    """Refuse to run a dangerous test unless the sandbox has its own pid namespace and no network interface."""
    host_ns = os.readlink("/proc/self/ns/pid")
    r = sb.run_python("import os, socket\n"
                      "print(os.readlink('/proc/self/ns/pid'))\n"
                      "print(sorted(n for _, n in socket.if_nameindex()))")
    assert r.verdict == "ok", r
    ns, ifaces = r.stdout.splitlines()[:2]
    assert ns != host_ns, "the sandbox shares the host's pid namespace: refusing to run this test"
    assert ifaces == "['lo']", f"the sandbox sees network interfaces {ifaces}: refusing to attempt egress"


def bounded_bomb(marker: str, report: bool = False) -> str:
    """A classic fork bomb bounded at 2**10 processes; children sleep (so they hold pids) and carry the marker.
    A child whose fork fails exits; with `report` it first prints the error's traceback, as a naive bomb does.
    (A bomb whose failing children exit silently is caught on Docker by the cgroup's pids counter; the local
    backend has no cgroup and judges a plain exec by its stderr and the task count at the end, which such a bomb
    can slip under once its failed members have exited: that exec case is tested with `report`. For run_python
    it also samples the task count while the call runs.)"""
    report_src = "        traceback.print_exc()\n        sys.stderr.flush()\n" if report else ""
    child_exit = report_src + "        os._exit(1)\n"
    return (
        "import os, sys, time, traceback\n"
        "me = os.getpid()\n"
        "try:\n"
        "    for _ in range(10):\n"
        "        os.fork()\n"
        "except BlockingIOError:\n"
        "    if os.getpid() != me:\n"
        + child_exit +
        "    raise\n"
        "if os.getpid() != me:\n"
        f"    os.execvp('sleep', ['sleep', '20'])  # {marker}\n"
        "time.sleep(3)  # the parent outlives its forks a moment, so a slow machine still sees the tree hit the limit\n"
    )


# --------------------------------------------------------------------------------------------------- processes


def test_fork_bomb_in_interpreter(episode, marker):
    r = episode.run_python(bounded_bomb(marker), timeout_s=15)
    assert r.verdict == "resource_limit", r
    # the sandbox still answers afterwards
    assert episode.run_python("print(6 * 7)").stdout.strip() == "42"


def test_a_cell_still_runs_when_the_pids_limit_is_full(episode):
    # a child of the first cell fills the limit with threads after the cell ended, and holds them
    r = episode.run_python("import os, threading, time\n"
                           "pid = os.fork()\n"
                           "if pid == 0:\n"
                           "    time.sleep(0.3)\n"
                           "    threading.stack_size(256 * 1024)\n"
                           "    ev = threading.Event()\n"
                           "    try:\n"
                           "        while True:\n"
                           "            threading.Thread(target=ev.wait).start()\n"
                           "    except RuntimeError:\n"
                           "        ev.wait()")
    assert r.verdict == "ok", r
    time.sleep(1.5)
    # the next cell finds no room for its interpreter's own watchdog thread, runs anyway, and can free the room
    r = episode.run_python("import signal\nos.kill(pid, signal.SIGKILL)\nos.waitpid(pid, 0)\nprint('freed')")
    assert r.stdout.strip() == "freed", r
    assert episode.run_python("print(6 * 7)").stdout.strip() == "42"


def test_fork_bomb_exec(episode, marker):
    r = episode.exec(["python3", "-c", bounded_bomb(marker, report=True), marker], timeout_s=15)
    assert r.verdict == "resource_limit", r
    assert episode.exec(["python3", "-c", "print(6 * 7)"]).stdout.strip() == "42"


def test_kill_all_and_kill_parent(episode, marker):
    check_isolated(episode)
    canary = subprocess.Popen(["sh", "-c", "sleep 60", f"canary-{marker}"])
    try:
        episode.run_python("x = 1")
        # kill(-1) spares the caller (ESRCH when there is nothing else to kill); whatever died was the sandbox's
        r = episode.run_python("import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\n"
                               "except ProcessLookupError:\n    pass\nprint('survived')")
        assert r.verdict == "ok" and r.stdout.strip() == "survived", r
        r = episode.exec(["sh", "-c", "kill -9 -1; sleep 1"])
        assert r.verdict == "error" and not r.timed_out, r
        r = episode.run_python("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(0, signal.SIGKILL)")
        assert r.verdict == "error", r
        assert episode.run_python("print('still here')").stdout.strip() == "still here"
        assert canary.poll() is None, "a host process died"
    finally:
        canary.kill()
        canary.wait()


def test_double_forked_daemon_outlives_call(backend, episode, marker, host):
    code = ("import os\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            f"        os.execvp('python3', ['python3', '-c', 'import time; time.sleep(300)', '{marker}'])\n"
            "    os._exit(0)\n"
            "os.wait()\n"
            "print('spawned')")
    t = time.monotonic()
    r = episode.run_python(code, timeout_s=5)
    assert r.verdict == "ok" and r.stdout.strip() == "spawned", r
    assert time.monotonic() - t < 3, "the call waited for its daemon"
    time.sleep(0.3)
    assert host.pids_with(marker), "the daemon should be running while its episode lasts"
    count = ("import os, sys\nm = (sys.argv[1] + sys.argv[2]).encode()\nn = 0\n"
             "for p in os.listdir('/proc'):\n"
             "    try: n += p.isdigit() and m in open(f'/proc/{p}/cmdline', 'rb').read()\n"
             "    except OSError: pass\n"
             "print(n)")
    r = episode.exec(["python3", "-c", count, marker[:6], marker[6:]])  # no command line holds the whole marker
    assert r.verdict == "ok" and r.stdout.strip() == "1", r  # the daemon, seen from inside
    episode.close()  # the fixture then checks that the daemon is gone
    assert host.wait_gone(marker) == []
    nxt = backend.acquire()
    try:
        r = nxt.exec(["python3", "-c", count, marker[:6], marker[6:]])
        assert r.verdict == "ok" and r.stdout.strip() == "0", r
    finally:
        nxt.close()


def test_sleeper_and_busy_loop_die_on_time(episode):
    for code in ("import time\ntime.sleep(100)", "while True:\n    pass"):
        t = time.monotonic()
        r = episode.run_python(code, timeout_s=1)
        took = time.monotonic() - t
        assert r.verdict == "timeout" and r.timed_out, r
        assert 0.9 <= took < 1 + GRACE + SLACK, took
    for argv in (["sleep", "100"], ["python3", "-c", "while True: pass"]):
        t = time.monotonic()
        r = episode.exec(argv, timeout_s=1)
        took = time.monotonic() - t
        assert r.verdict == "timeout" and r.timed_out, r
        assert 0.9 <= took < 1 + GRACE + SLACK, took
    # a sleeper that blocks the interpreter's alarm: the host-side backstop still ends the call
    t = time.monotonic()
    r = episode.run_python("import signal, time\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n"
                           "time.sleep(100)", timeout_s=1)
    assert r.verdict == "timeout", r
    assert time.monotonic() - t < 1 + GRACE + 3 * SLACK
    assert episode.run_python("print('fresh')").stdout.strip() == "fresh"


# ----------------------------------------------------------------------------------------------------- memory


def test_sudden_memory_bomb(episode):
    r = episode.run_python("b = b'x' * (1 << 30)", timeout_s=15)
    assert r.verdict == "resource_limit", r
    r = episode.exec(["python3", "-c", "b = b'x' * (1 << 30)"], timeout_s=15)
    assert r.verdict == "resource_limit", r
    assert episode.run_python("print('alive')").stdout.strip() == "alive"


def test_gradual_memory_bomb(episode):
    code = "chunks = []\nfor _ in range(2048):\n    chunks.append(b'x' * (1 << 20))"
    r = episode.run_python(code, timeout_s=15)
    assert r.verdict == "resource_limit", r
    assert episode.run_python("print('alive')").stdout.strip() == "alive"


# ----------------------------------------------------------------------------------------------------- output


def test_infinite_stdout(episode):
    t = time.monotonic()
    r = episode.run_python("while True:\n    print('x' * 1000)", timeout_s=1.5)
    assert r.verdict == "timeout" and r.timed_out and r.truncated, r  # the interpreter drops what is past the cap
    assert len(r.stdout.encode()) <= LIMIT
    assert time.monotonic() - t < 1.5 + GRACE + SLACK


def test_infinite_stderr(episode, marker):
    # a timeout far past the flood limit (32 MiB, written in well under a second): the flood ends the call
    r = episode.exec(["python3", "-c", "import sys\nwhile True:\n    sys.stderr.write('e' * 1000)", marker],
                     timeout_s=30)
    assert r.verdict == "resource_limit" and not r.timed_out and r.truncated and "output flood" in r.stderr, r
    assert len(r.stderr.encode()) <= LIMIT + 1000  # the cap, plus the sandbox's own note


def test_legitimate_10mb_burst_is_not_a_timeout(episode):
    r = episode.run_python("import sys\nsys.stdout.write('y' * 10_000_000)\nprint()", timeout_s=15)
    assert r.verdict == "ok" and not r.timed_out and r.truncated, r
    assert len(r.stdout) == LIMIT and set(r.stdout) == {"y"}
    r = episode.exec(["python3", "-c", "import sys; sys.stdout.write('y' * 10_000_000)"], timeout_s=15)
    assert r.verdict == "ok" and not r.timed_out and r.truncated, r
    assert len(r.stdout) == LIMIT


# ------------------------------------------------------------------------------------------------ disk and files


def test_disk_fill(episode):
    free_before = shutil.disk_usage("/").free
    code = ("import os\n"
            "for d in ('/tmp', os.getcwd()):\n"
            "    try:\n"
            "        with open(os.path.join(d, 'fill'), 'wb') as f:\n"
            "            for _ in range(256):\n"
            "                f.write(b'z' * (1 << 20))\n"
            "                f.flush()\n"
            "        print(d, 'not full')\n"
            "    except OSError as e:\n"
            "        print(d, e.errno)\n")
    r = episode.run_python(code, timeout_s=15)
    assert r.verdict == "ok", r
    # ENOSPC (tmpfs full) or EFBIG (a file size rlimit) in both places
    assert "not full" not in r.stdout and r.stdout.count(" 28") + r.stdout.count(" 27") == 2, r
    r = episode.run_python("open('/usr/evil', 'w')")
    assert r.verdict == "error" and ("Read-only" in r.stderr or "Permission" in r.stderr), r
    assert shutil.disk_usage("/").free > free_before - 64 * (1 << 20), "the host disk filled up"


def test_leftover_files_invisible_to_next_episode(backend, episode, marker):
    script = f"echo x > /tmp/{marker} && echo x > /dev/shm/{marker} && echo x > ./{marker} && ls /tmp /dev/shm ."
    r = episode.exec(["sh", "-c", script])
    assert r.verdict == "ok" and r.stdout.count(marker) == 3, r
    episode.close()
    nxt = backend.acquire()
    try:
        r = nxt.exec(["sh", "-c", "ls -a /tmp /dev/shm .; cat /proc/mounts"])
        assert r.verdict == "ok" and marker not in r.stdout, r
    finally:
        nxt.close()


def test_symlink_tricks_on_files_read_back(tmp_path, episode):
    host_file = tmp_path / "host-only.txt"
    host_file.write_text(HOST_SECRET)
    script = (f"ln -s {host_file} answer.txt; ln -s /etc/shadow shadow.txt; ln -s /proc/1/environ env.txt; "
              "ln -s /etc/hostname out.txt")
    r = episode.exec(["sh", "-c", script])
    assert r.verdict == "ok", r
    for name in ("answer.txt", "shadow.txt", "env.txt"):
        got = episode.exec(["cat", name])
        assert HOST_SECRET not in got.stdout + got.stderr, name
        assert "root:" not in got.stdout, name  # /etc/shadow is unreadable or not the host's
    # write_files replaces a planted symlink instead of writing through it
    episode.write_files({"out.txt": "mine"})
    r = episode.exec(["sh", "-c", "cat out.txt; echo; test -L out.txt && echo LINK || echo FILE; cat /etc/hostname"])
    assert r.stdout.splitlines()[:2] == ["mine", "FILE"], r
    assert host_file.read_text() == HOST_SECRET
    # and refuses a path whose folder is a planted symlink (on every backend: one writer, sandbox/files.py)
    assert episode.exec(["ln", "-s", "/tmp", "linked"]).verdict == "ok"
    with pytest.raises(SandboxError, match="refusing path through a symlink"):
        episode.write_files({"linked/planted.txt": "x"})
    r = episode.exec(["sh", "-c", "ls /tmp"])
    assert r.verdict == "ok" and "planted.txt" not in r.stdout, r


# ----------------------------------------------------------------------------------------------- secrets, network


def test_no_host_environment_or_secrets(episode):
    code = ("import os, glob\n"
            "print(dict(os.environ))\n"
            "for p in glob.glob('/proc/[0-9]*/environ'):\n"
            "    try: print(p, open(p, 'rb').read())\n"
            "    except OSError as e: print(p, e)\n"
            "print('sock', os.path.exists('/var/run/docker.sock'), os.path.exists('/run/docker.sock'))\n"
            "print('uid', os.getuid(), os.geteuid())\n"
            "print(open('/proc/self/status').read())")
    r = episode.run_python(code)
    assert r.verdict == "ok", r
    assert HOST_SECRET not in r.stdout
    assert "FLYWHEEL_TEST_HOST_SECRET" not in r.stdout
    assert "sock False False" in r.stdout
    assert "uid 0 " not in r.stdout
    caps = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("CapEff:")]
    assert caps == ["0000000000000000"], caps
    assert "NoNewPrivs:\t1" in r.stdout


def test_network_egress_attempts_fail(episode):
    """Egress checked without a single packet aimed off this machine: inside the sandbox there is no interface
    but lo, no route (IPv4 or IPv6), so no resolver can be reached; and a listener the test opens on the host's
    127.0.0.1 answers the host (the control) but not the sandbox, whose loopback is its own."""
    check_isolated(episode)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # control: the host reaches it
        code = ("import json, socket\n"
                "out = {'ifaces': sorted(n for _, n in socket.if_nameindex())}\n"
                "out['routes4'] = open('/proc/net/route').read().splitlines()[1:]\n"
                "try:\n"
                "    v6 = open('/proc/net/ipv6_route').read().splitlines()\n"
                "except FileNotFoundError:\n"
                "    v6 = []  # no IPv6 in this kernel: no route either\n"
                "out['routes6'] = [r for r in v6 if not r.rstrip().endswith(' lo')]\n"
                "try:\n"
                f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).close(); out['host_lo'] = 'OPEN'\n"
                "except OSError as e:\n"
                "    out['host_lo'] = type(e).__name__\n"
                "print(json.dumps(out))")
        r = episode.run_python(code, timeout_s=15)
    assert r.verdict == "ok", r
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"ifaces": ["lo"], "routes4": [], "routes6": [], "host_lo": "ConnectionRefusedError"}, out
