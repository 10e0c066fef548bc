"""The in-sandbox programs run with this machine's python3, outside any sandbox. The judge's (tasks/judge/guest/):
each role's program compiles, the call server answers a batch of calls in plaindata's encoding (and skips a test's
calls after its first failed one), and plaindata round-trips what it encodes (the sandboxed runs are
test_judgebox.py's and test_judge_third_pass.py's). The tools' (tasks/guest/): the workspace snapshot reads a
folder (the run_tests harness and its worker: test_testrunner.py)."""

from __future__ import annotations

import glob
import json
import os
import secrets
import shutil
import subprocess
import sys

import pytest

from tasks.judge.guest import plaindata
from tasks.judge.unittests import guest_program
from tasks.tools import snapshot_source


@pytest.mark.parametrize("role", ["serve", "launch", "runner"])
def test_each_role_is_one_program_that_compiles(role):
    src = guest_program(role)
    compile(src, f"<judge {role}>", "exec")
    assert src.rstrip().endswith(f"{role}()")
    assert ("def runner():" in src) == (role == "runner")


def test_the_call_server_answers_a_batch_on_the_host():
    module = "sol_" + secrets.token_hex(6)
    token = secrets.token_hex(8)
    enc = plaindata.encode

    def call(func, args, test):
        return {"func": func, "args": enc(args), "kwargs": enc({}), "test": test}

    req = {"mode": "batch", "token": token, "module": module, "timeout_s": 10.0,
           "files": {f"{module}.py": "def double(x):\n    return x * 2\n\ndef boom():\n    raise KeyError('no')\n\n"
                                     "def odd():\n    return object()\n"},
           "calls": [call("double", (21,), 0), call("boom", (), 1), call("double", (1,), 1), call("odd", (), 2)]}
    try:
        p = subprocess.run([sys.executable, "-I", "-c", guest_program("serve")], input=(json.dumps(req) + "\n").encode(),
                           capture_output=True, timeout=60, check=False)
    finally:  # the server places the files in /tmp/fwjudge-<random>/: remove the ones holding this module
        for d in glob.glob("/tmp/fwjudge-*"):
            if os.path.exists(os.path.join(d, f"{module}.py")):
                shutil.rmtree(d, ignore_errors=True)
    replies = [json.loads(line) for line in p.stdout.decode().splitlines() if line.startswith("{")]
    assert all(m["token"] == token for m in replies)
    ready = [m for m in replies if m["kind"] == "ready"]
    assert len(ready) == 1 and ready[0]["error"] is None and {"double", "boom", "odd"} <= set(ready[0]["names"])
    calls = {m["i"]: m for m in replies if m["kind"] == "call"}
    assert sorted(calls) == [0, 1, 3]  # call 2 belongs to test 1, whose first call already failed
    assert calls[0]["status"] == "ok" and plaindata.decode(calls[0]["value"]) == 42
    assert calls[1]["status"] == "error" and "KeyError" in calls[1]["error"]
    assert calls[3]["status"] == "not_plain"


@pytest.mark.parametrize("value", [None, True, 3, -2.5, float("inf"), 1 + 2j, "é", b"\x00", [1, (2, 3)],
                                   {"a": {1, 2}}, frozenset({4})])
def test_plaindata_round_trips(value):
    back = plaindata.decode(json.loads(json.dumps(plaindata.encode(value))))
    assert type(back) is type(value) and plaindata.equal(back, value)


def test_the_workspace_snapshot_reads_a_folder_on_the_host(tmp_path):
    (tmp_path / "solution.py").write_text("def f():\n    return 1\n")
    (tmp_path / "big.txt").write_text("x" * 50)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "data.bin").write_bytes(b"\xff\xfe")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "skip.pyc").write_bytes(b"0")
    (tmp_path / "link").symlink_to("solution.py")
    p = subprocess.run([sys.executable, "-I", "-c", snapshot_source(), "10", "1000"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60, check=False)
    line = [x for x in p.stdout.splitlines() if x.startswith("__FLYWHEEL_SNAPSHOT__ ")]
    snap = json.loads(line[0].split(" ", 1)[1])
    assert sorted(snap) == ["big.txt", "link", "pkg/data.bin", "solution.py"]
    assert snap["solution.py"]["text"].startswith("def f()") and snap["solution.py"]["size"] == 22
    assert "text" not in snap["big.txt"] and snap["big.txt"]["size"] == 50  # over the 10-byte limit
    assert "text" not in snap["pkg/data.bin"]  # not UTF-8
    assert snap["link"] == {"symlink": "solution.py"}
