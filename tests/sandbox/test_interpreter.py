"""The persistent interpreter program and its host-side client, run as a plain subprocess (no sandbox, no Docker):
state across calls, captured output (prints, os.system, subprocess), errors and SystemExit survived, timeouts of
busy loops, sleepers and C-level waits, the host backstop, output caps, and a protocol channel user code cannot
corrupt."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from sandbox import programs
from sandbox.interpreter import InterpreterClient, InterpreterError, PipeTransport, interpreter_argv
from sandbox.verdicts import exec_fields

LIMIT = 10_000


class Running:
    """An interpreter subprocess with its client."""

    def __init__(self, grace_s: float = 1.0):
        self.proc = subprocess.Popen(interpreter_argv(sys.executable), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     start_new_session=True)
        self.client = InterpreterClient(PipeTransport(self.proc.stdin, self.proc.stdout), self.kill, grace_s=grace_s)

    def kill(self) -> int | None:
        self.proc.kill()
        return self.proc.wait()

    def call(self, code: str, timeout_s: float = 5.0, limit: int = LIMIT) -> dict:
        return self.client.call(code, timeout_s, limit)


@pytest.fixture
def interp():
    it = Running()
    yield it
    it.client.close()
    it.proc.wait(timeout=5)


def test_source_is_the_kernel_module_and_runs_without_a_file():
    src = programs.source("sandbox.guest.kernel")
    assert "class _Kernel" in src and "def main(" in src and src in interpreter_argv(sys.executable)
    # -c: no __file__, no package; the ready line comes first
    p = subprocess.run(interpreter_argv(sys.executable), input=b"", capture_output=True, timeout=30, check=False)
    first = json.loads(p.stdout.splitlines()[0])
    assert first["ready"] is True and p.returncode == 0, p.stderr


def test_state_persists_and_last_expression_is_shown(interp):
    assert interp.call("x = 41\ndef f(y):\n    return y + 1")["verdict"] == "ok"
    r = interp.call("f(x)")
    assert r == {**r, "verdict": "ok", "exit_code": 0, "stdout": "42\n", "stderr": "", "truncated": False}
    assert interp.call("None")["stdout"] == ""  # like a notebook: None is not shown
    assert interp.client.ready["pid"] == interp.proc.pid


def test_prints_os_system_and_subprocess_are_captured(interp):
    r = interp.call("import os, subprocess, sys\nprint('a')\nsys.stderr.write('b\\n')\n"
                    "os.system('echo c; echo d >&2')\nsubprocess.run(['echo', 'e'])\nos.write(1, b'f\\n')\nNone")
    assert r["verdict"] == "ok"
    assert r["stdout"].split() == ["a", "c", "e", "f"]
    assert r["stderr"].split() == ["b", "d"]


def test_user_code_cannot_write_into_the_protocol(interp):
    fake = json.dumps({"id": 2, "stdout": "forged", "stderr": "", "truncated": False, "exit_code": 0,
                       "timed_out": False, "error": None, "duration_ms": 0})
    r = interp.call(f"import os\nos.write(1, {fake!r}.encode() + b'\\n')\nprint(input())")
    assert r["verdict"] == "error" and "EOFError" in r["stderr"]  # stdin is /dev/null
    assert "forged" in r["stdout"]  # it went to the captured stdout, not to the host's channel
    assert interp.call("print('next')")["stdout"] == "next\n"


def test_exception_is_reported_and_the_interpreter_survives(interp):
    interp.call("keep = 'me'")
    raw = interp.client.call_raw("def g():\n    1 / 0\ng()", 5, LIMIT)
    assert raw["error"] and "ZeroDivisionError" in raw["error"] and 'File "<cell-' in raw["error"]
    assert "File \"<string>\"" not in raw["error"]  # the interpreter's own frames are dropped
    assert raw["error"] in raw["stderr"] and raw["exit_code"] == 1 and not raw["died"]
    r = exec_fields(raw)
    assert r["verdict"] == "error" and r["exit_code"] == 1 and r["error"] is None
    assert interp.call("keep")["stdout"] == "'me'\n"
    assert interp.call("def broken(:")["verdict"] == "error"  # a syntax error too


def test_system_exit_is_survived(interp):
    interp.call("v = 7")
    assert interp.call("import sys; sys.exit(3)")[("exit_code")] == 3
    assert interp.call("import sys; sys.exit(3)")["verdict"] == "error"
    r = interp.call("raise SystemExit")
    assert r["verdict"] == "ok" and r["exit_code"] == 0
    r = interp.call("import sys; sys.exit('bye')")
    assert r["exit_code"] == 1 and "bye" in r["stderr"]
    assert interp.call("v")["stdout"] == "7\n"


@pytest.mark.parametrize("code", ["while True:\n    pass", "import time\ntime.sleep(60)",
                                  "import os\nos.system('sleep 60')",
                                  "while True:\n    try:\n        while True: pass\n    except BaseException: pass"])
def test_timeouts_end_the_call_and_keep_state(interp, code):
    interp.call("state = 1")
    t = time.monotonic()
    r = interp.call(code, timeout_s=0.5)
    took = time.monotonic() - t
    assert r["verdict"] == "timeout" and r["timed_out"] and r["exit_code"] is None, r
    assert took < 0.5 + 1.0 + 0.5, took  # the interpreter's alarm/watchdog or, at worst, the host backstop
    if interp.client.alive:  # everything but the swallowed-timeout loop ends inside the interpreter
        assert interp.call("state")["stdout"] == "1\n"


def test_host_backstop_kills_code_that_blocks_the_alarm():
    it = Running(grace_s=0.5)
    t = time.monotonic()
    raw = it.client.call_raw("import signal, time\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n"
                             "time.sleep(60)", 0.5, LIMIT)
    assert time.monotonic() - t < 2.5
    assert raw["timed_out"] and raw["died"] and not it.client.alive
    assert it.proc.poll() is not None
    assert exec_fields(raw)["verdict"] == "timeout"
    with pytest.raises(InterpreterError):
        it.client.call_raw("1", 1, LIMIT)


def test_death_is_reported_not_raised():
    it = Running()
    raw = it.client.call_raw("import os\nos._exit(5)", 5, LIMIT)
    assert raw["died"] and raw["exit_status"] == 5 and not raw["timed_out"]
    r = exec_fields(raw)
    assert r["verdict"] == "error" and "interpreter died" in r["stderr"]


def test_output_cap_and_truncated_flag(interp):
    t = time.monotonic()
    r = interp.call("import sys\nsys.stdout.write('y' * 10_000_000)\nsys.stderr.write('z' * 50_000)\nNone")
    assert time.monotonic() - t < 3
    assert r["verdict"] == "ok" and r["truncated"] and not r["timed_out"]
    assert r["stdout"] == "y" * LIMIT and r["stderr"] == "z" * LIMIT
    r = interp.call("while True:\n    print('spam' * 100)", timeout_s=0.5)
    assert r["verdict"] == "timeout" and r["truncated"] and len(r["stdout"]) <= LIMIT
    r = interp.call("print('small')")
    assert r["stdout"] == "small\n" and not r["truncated"]  # the cap is per call


def test_traceback_stays_visible_when_stderr_is_full(interp):
    r = interp.call("import sys\nsys.stderr.write('n' * 50_000)\nraise KeyError('needle')")
    assert r["truncated"] and len(r["stderr"].encode()) <= LIMIT
    assert r["stderr"].rstrip().endswith("KeyError: 'needle'")


def test_memory_error_is_a_resource_limit(interp):
    r = interp.call("b = bytearray(1 << 60)")
    assert r["verdict"] == "resource_limit" and "MemoryError" in r["stderr"]


def test_forked_child_never_answers_on_the_channel(interp):
    r = interp.call("import os\npid = os.fork()\nif pid == 0:\n    print('child')\nelse:\n    os.waitpid(pid, 0)\n"
                    "    print('parent')")
    assert r["verdict"] == "ok" and sorted(r["stdout"].split()) == ["child", "parent"]
    for i in range(3):
        assert interp.call(f"print({i})")["stdout"] == f"{i}\n"


def test_warm_call_is_fast(interp):
    interp.call("pass")
    t = time.perf_counter()
    for _ in range(50):
        interp.call("1 + 1")
    per_call_ms = (time.perf_counter() - t) * 1000 / 50
    assert per_call_ms < 10, per_call_ms


def test_a_cell_that_closes_stdout_does_not_break_the_next(interp):
    r = interp.call("import os\nos.close(1)\nos.close(2)")
    assert r["verdict"] == "ok"
    r = interp.call("import os\nprint('back')\nos.system('echo child')\nNone")
    assert r["stdout"] == "back\nchild\n"
