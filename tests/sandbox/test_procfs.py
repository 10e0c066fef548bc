"""sandbox/procfs.py: the one stat parser and the one liveness rule (a zombie is gone), on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from sandbox import procfs


def test_parse_stat_reads_a_command_name_with_spaces_and_parentheses():
    raw = b"4242 (a (b) c) S 17 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1 2 3\n"
    st = procfs.parse_stat(4242, raw)
    assert (st.comm, st.state, st.ppid, st.start, st.alive) == ("a (b) c", "S", 17, "987654", True)


def test_this_process_is_alive_with_a_stable_start_time():
    me = os.getpid()
    assert procfs.running(me)
    assert procfs.start_time(me) == procfs.start_time(me) is not None
    assert procfs.stat(me).ppid == os.getppid()
    assert me in procfs.pids()


def test_a_zombie_is_gone_and_a_reaped_process_has_no_stat():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while procfs.stat(child.pid) is not None and procfs.stat(child.pid).state != "Z":
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.01)
    assert procfs.stat(child.pid).state == "Z"  # exited, not reaped: /proc still has it
    assert procfs.start_time(child.pid) is None and not procfs.running(child.pid)
    child.wait()
    assert procfs.stat(child.pid) is None and procfs.start_time(child.pid) is None


def test_descendants_lists_children_and_grandchildren():
    code = "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "print(p.pid, flush=True); time.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        grandchild = int(parent.stdout.readline())
        assert procfs.descendants(parent.pid) == [grandchild]
        assert parent.pid in procfs.descendants(os.getpid())
    finally:
        os.kill(grandchild, 9)
        parent.kill()
        parent.wait()
