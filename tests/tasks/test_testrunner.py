"""The `run_tests` tool's harness (tasks/guest/testrunner.py, with its worker tasks/guest/testworker.py) run
directly with this machine's python3 over a workspace folder: each hostile solution must come back as a non-pass with the right runtime event, and a pass must need a
real report. (Its isolation comes from the sandbox; here only its bookkeeping is under test. Verdicts never come
from this harness: see test_judgebox.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.tools import parse_runner_output, runner_source


def run_harness(files: dict[str, str], tests: list[str], timeout_s: float = 3.0, token: str = "tok123") -> dict:
    """Write `files` and one test file (a test function per snippet) to a fresh folder and run the harness there."""
    import tempfile

    from tasks.code import render_test_file

    work = Path(tempfile.mkdtemp(prefix="fw-harness-"))
    for rel, content in files.items():
        (work / rel).write_text(content)
    (work / "test_t.py").write_text(render_test_file(tests))
    req = {"mode": "workspace", "token": token, "timeout_s": timeout_s}
    p = subprocess.run([sys.executable, "-I", "-c", runner_source()], input=json.dumps(req).encode(),
                       capture_output=True, timeout=60, cwd=work)
    rep = parse_runner_output(p.stdout.decode(), token)
    assert rep is not None, p.stderr.decode()
    return rep


def statuses(rep: dict) -> list[str]:
    return [r["status"] for r in rep["results"]]


def test_pass_and_fail_are_reported_per_test():
    rep = run_harness({"solution.py": "def f(x):\n    return x * 2\n"}, ["assert f(2) == 4", "assert f(3) == 7"])
    assert rep["n_tests"] == 2
    assert statuses(rep) == ["pass", "fail"]
    assert "AssertionError" in rep["results"][1]["error"]


def test_wrong_token_is_not_a_report(tmp_path):
    req = {"mode": "workspace", "token": "a"}
    p = subprocess.run([sys.executable, "-I", "-c", runner_source()], input=json.dumps(req).encode(),
                       capture_output=True, timeout=60, cwd=tmp_path)
    assert parse_runner_output(p.stdout.decode(), "b") is None
    assert parse_runner_output("garbage\n__FLYWHEEL_TESTS__ {not json", "a") is None


@pytest.mark.parametrize("src,event", [
    ("import sys\ndef f(x):\n    return 0\nsys.exit(0)\n", "system_exit"),
    ("import os\ndef f(x):\n    os._exit(0)\n", "process_exit:exited with code 0"),
    ("import os, signal\ndef f(x):\n    os.kill(os.getpid(), signal.SIGTERM)\n", "process_exit:killed by SIGTERM"),
    ("import builtins\nbuiltins.len = lambda x: 0\ndef f(x):\n    return x * 2\n", "builtins_patched:len"),
])
def test_hostile_solutions_never_pass_silently(src, event):
    rep = run_harness({"solution.py": src}, ["assert f(2) == 4"])
    r = rep["results"][0]
    assert any(e.startswith(event) for e in r["events"]), r
    if not event.startswith("builtins"):
        assert r["status"] != "pass"


def test_a_forged_second_report_is_an_error():
    # the solution finds the harness's report pipe and writes a fake pass before the real report
    src = ("import os, json, sys\n_fd = int(sys.argv[2])\n"
           "import __main__\nos.write(_fd, (json.dumps({'token': __main__._report.__defaults__[-1], "
           "'index': 0, 'kind': 'result', 'status': 'pass', 'events': []}) + '\\n').encode())\n"
           "def f(x):\n    return -1\n")
    rep = run_harness({"solution.py": src}, ["assert f(2) == 4"])
    r = rep["results"][0]
    assert r["status"] == "error" and "result_forged" in r["events"]


def test_a_hanging_test_times_out_and_the_next_still_runs():
    rep = run_harness({"solution.py": "def f(x):\n    while True:\n        pass\n"},
                      ["assert f(1) == 1", "assert 1 == 1"], timeout_s=1.0)
    assert statuses(rep) == ["timeout", "pass"]


def test_a_syntax_error_fails_every_test():
    rep = run_harness({"solution.py": "def f(x) return x\n"}, ["assert f(1) == 1", "assert f(2) == 2"])
    assert statuses(rep) == ["error", "error"]
    assert "SyntaxError" in rep["results"][0]["error"]


def test_workspace_mode_discovers_test_functions(tmp_path):
    (tmp_path / "solution.py").write_text("def f(x):\n    return x\n")
    (tmp_path / "test_a.py").write_text("from solution import f\n\ndef test_ok():\n    assert f(1) == 1\n\n"
                                        "def test_bad():\n    assert f(1) == 2\n\ndef helper():\n    pass\n")
    (tmp_path / "test_broken.py").write_text("def test_x(:\n")
    req = {"mode": "workspace", "token": "t", "timeout_s": 3}
    p = subprocess.run([sys.executable, "-I", "-c", runner_source()], input=json.dumps(req).encode(),
                       capture_output=True, timeout=60, cwd=tmp_path)
    rep = parse_runner_output(p.stdout.decode(), "t")
    by = {r["name"]: r["status"] for r in rep["results"]}
    assert by == {"test_a.py::test_ok": "pass", "test_a.py::test_bad": "fail", "test_broken.py": "error"}


def test_import_time_exit_fails_every_test_and_a_daemon_is_killed():
    rep = run_harness({"solution.py": "import os\nos._exit(0)\n"}, ["assert 1", "assert 2"])
    assert statuses(rep) == ["no_result", "no_result"]
    assert all(any(e.startswith("process_exit") for e in r["events"]) for r in rep["results"])
    # a test that forks a sleeper does not hold the harness up
    rep = run_harness({"solution.py": "import os, time\ndef f():\n    if os.fork() == 0:\n        time.sleep(30)\n"
                                      "    return 1\n"}, ["assert f() == 1"], timeout_s=2.0)
    assert statuses(rep) == ["pass"]


def test_many_tests_are_cheap():
    import time

    t0 = time.perf_counter()
    rep = run_harness({"solution.py": "def f(x):\n    return x\n"}, [f"assert f({i}) == {i}" for i in range(40)])
    assert statuses(rep) == ["pass"] * 40
    assert time.perf_counter() - t0 < 10


def test_an_import_that_hangs_is_cut_short():
    import time

    t0 = time.perf_counter()
    rep = run_harness({"solution.py": "while True:\n    pass\n"}, ["assert 1"] * 5, timeout_s=1.0)
    assert statuses(rep) == ["timeout"] * 5 and "importing" in rep["results"][0]["error"]
    assert time.perf_counter() - t0 < 8
