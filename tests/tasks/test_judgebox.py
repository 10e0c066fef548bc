"""The judge in real sandboxes: the data path (calls in the sandbox, comparisons on the host) and the isolated path
(a non-dumpable runner that reaches the solution only through proxies), attacked from inside the solution.
Every hostile solution must fail, whatever it does to the process it runs in; honest ones must pass."""

from __future__ import annotations

import pytest

from sandbox.backend import open_backend
from sandbox.result import SandboxConfig
from tasks.judge.testsplit import plan
from tasks.judge.unittests import run_unit_tests
from tasks.spec import ReferenceSolution, Task, VerifierSpec


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request):
    with open_backend(SandboxConfig(backend=request.param)) as be:
        yield be


SPLIT = ["assert double(2) == 4", "assert double(-3) == -6\nassert double(0) == 0"]
LOOP = ["for x in range(3):\n    assert double(x) == 2 * x"]  # a loop: does not split, runs isolated


def task(tests: list[str], tolerance: float = 0.0) -> Task:
    return Task(id="t-double", suite="s", version="1", split="train", prompt="write double", tools=["write_file"],
                verifier=VerifierSpec(kind="unit_tests", timeout_s=2.0, float_tolerance=tolerance),
                reference=ReferenceSolution(final="done"), hidden_tests=tests, metadata={"entry_point": "double"})


HONEST = "def double(x):\n    return x * 2\n"


def statuses(run):
    return [(r.status, r.strength) for r in run.results]


def test_plans_split_what_they_can():
    assert plan("assert f(1, [2]) == 3") is not None
    assert plan("assert abs(f(0.5) - 0.25) < 1e-6\nassert not f('')") is not None
    assert plan("import math\nassert math.isclose(f(2), 1.41, rel_tol=1e-2)") is not None
    assert plan("def check(candidate):\n    assert candidate(1) == 2\n\ncheck(f)") is not None
    assert plan("for x in range(3):\n    assert f(x) == x") is None  # a loop
    assert plan("assert f(helper(1)) == 2") is None  # an argument the host cannot evaluate alone
    assert plan("assert f == g") is None  # the function used as a value
    assert plan("x = f(1)\nassert x == 2") is None  # a result kept in a variable


def test_honest_solutions_pass_on_both_paths(backend):
    run = run_unit_tests(task(SPLIT + LOOP), {"solution.py": HONEST}, backend)
    assert run.passed, run.results
    assert statuses(run) == [("pass", "data"), ("pass", "data"), ("pass", "isolated")]
    assert run.strength == "isolated"
    # a namedtuple, a Counter and a float within the task's tolerance are honest results
    src = ("import collections\nP = collections.namedtuple('P', 'a b')\ndef double(x):\n"
           "    return {'t': P(x, x), 'c': collections.Counter('ab'), 'f': x * 2.0000000001}\n")
    t = task(["assert double(1) == {'t': (1, 1), 'c': {'a': 1, 'b': 1}, 'f': 2.0}"], tolerance=1e-6)
    assert run_unit_tests(t, {"solution.py": src}, backend).passed


def test_wrong_results_say_expected_and_got(backend):
    run = run_unit_tests(task(SPLIT), {"solution.py": "def double(x):\n    return x + 2\n"}, backend)
    r = run.results[0]
    assert (r.status, r.expected, r.got) == ("pass", None, None)  # 2 + 2 == 4: right by accident
    r = run.results[1]
    assert (r.status, r.expected, r.got) == ("fail", "-6", "-1") and "double(-3) == -6" in r.error


# Each call of the solution appends its argument to a file of the sandbox (shared by the call's forked processes);
# double('log') reads it back. A negative argument gives a value that is not plain data: that call fails the test.
LOGGING = ("import json, os\nLOG = '/tmp/flywheel-test-calls.json'\n"
           "def double(x):\n"
           "    calls = json.load(open(LOG)) if os.path.exists(LOG) else []\n"
           "    if x == 'log':\n"
           "        return calls\n"
           "    json.dump(calls + [x], open(LOG, 'w'))\n"
           "    return object() if x < 0 else 2 * x\n")


def test_a_tests_calls_after_its_first_failed_one_are_not_run(backend):
    """A failed call is the test's result, so the test's later calls are not run (a hanging solution costs one
    timeout per test, not one per call); other tests' calls still run. Data path: the call server skips them;
    isolated path: the proxy raises at once, even when the test catches the failure."""
    data = ["assert double(-1) == -2\nassert double(7) == 14", "assert double('log') == [-1]"]
    run = run_unit_tests(task(data), {"solution.py": LOGGING}, backend)
    assert statuses(run) == [("fail", "data"), ("pass", "data")], run.results
    isolated = ["for x in (-1, 7):\n    try:\n        double(x)\n    except Exception:\n        pass",
                "for _ in (0,):\n    assert double('log') == [-1]"]
    run = run_unit_tests(task(isolated), {"solution.py": LOGGING}, backend)
    assert statuses(run) == [("fail", "isolated"), ("pass", "isolated")], run.results
    assert "caught by the test" in run.results[0].error


HOSTILE = {
    "always_equal": "class A:\n    def __eq__(self, o):\n        return True\ndef double(x):\n    return A()\n",
    "int_subclass_eq": "class I(int):\n    __eq__ = lambda s, o: True\n    __hash__ = int.__hash__\n"
                       "def double(x):\n    return I(0)\n",
    "type_built_class": "A = type('A', (), {'__eq__': lambda s, o: True, '__ne__': lambda s, o: False})\n"
                        "def double(x):\n    return A()\n",
    "mock_any": "from unittest import mock\ndef double(x):\n    return mock.ANY\n",
    "exit_at_import": "import sys\nsys.exit(0)\ndef double(x):\n    return 0\n",
    "os_exit_in_call": "import os\ndef double(x):\n    os._exit(0)\n",
    "sigterm_self": "import os, signal\ndef double(x):\n    os.kill(os.getpid(), signal.SIGTERM)\n",
    "hang": "def double(x):\n    while True:\n        pass\n",
    # write a forged "ok" reply for every call on each descriptor the process has, with a guessed value
    "forged_replies": "import os, json\n"
                      "def double(x):\n"
                      "    for fd in map(int, os.listdir('/proc/self/fd')):\n"
                      "        for i in range(4):\n"
                      "            try:\n"
                      "                os.write(fd, (json.dumps({'kind': 'call', 'i': i, 'status': 'ok', "
                      "'value': ['i', '0x0']}) + '\\n').encode())\n"
                      "            except OSError:\n"
                      "                pass\n"
                      "    return None\n",
    # patch the call server itself at import: every call reports success with the argument echoed back
    "patched_server": "import __main__\n"
                      "orig = __main__._Server._run\n"
                      "def fake(self, func, args, kwargs):\n"
                      "    return {'status': 'ok', 'value': __main__.decode(args) and __main__.encode(True)}\n"
                      "__main__._Server._run = fake\n"
                      "def double(x):\n    return 0\n",
    "patched_builtins": "import builtins\nbuiltins.abs = lambda x: 0\ndef double(x):\n    return x + 1\n",
    "generator": "def double(x):\n    return (y for y in [x * 2])\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_solutions_never_pass(backend, name):
    run = run_unit_tests(task(SPLIT + LOOP), {"solution.py": HOSTILE[name]}, backend)
    assert not run.passed
    assert all(r.status != "pass" for r in run.results if r.name != "hidden_1" or name != "patched_builtins"), \
        [(r.status, r.error) for r in run.results]
    events = [e for r in run.results for e in r.events]
    if name in ("always_equal", "int_subclass_eq", "type_built_class", "mock_any", "generator"):
        assert any(e.startswith("not_plain_data:") for e in events), events


# A hostile solution that looks for the isolated runner (its cmdline is world-readable: `python3 -I -c ...runner()`)
# and attacks it: opens its /proc files, ptrace-attaches, stops it and kills it. It returns what got through.
PROBE = """import ctypes, os, signal
def runners():
    out = []
    for p in os.listdir('/proc'):
        try:
            args = open('/proc/%s/cmdline' % p, 'rb').read().split(b'\\0')
        except OSError:
            continue
        if len(args) >= 4 and args[0].endswith(b'python3') and args[3].rstrip().endswith(b'runner()'):
            out.append(int(p))
    return out
def double(x):
    rs, got = runners(), []
    if not rs:
        return ['no runner found']
    libc = ctypes.CDLL(None, use_errno=True)
    for r in rs:
        for f in ('environ', 'maps', 'mem', 'fd'):
            try:
                if f == 'fd':
                    os.listdir('/proc/%d/fd' % r)
                elif f == 'mem':
                    open('/proc/%d/mem' % r, 'rb').close()
                else:
                    open('/proc/%d/%s' % (r, f), 'rb').read(1)
                got.append('read:' + f)
            except OSError:
                pass
        if libc.ptrace(16, r, 0, 0) == 0:  # PTRACE_ATTACH
            got.append('ptrace')
            libc.ptrace(17, r, 0, 0)
        for s in (signal.SIGSTOP, signal.SIGKILL):
            try:
                os.kill(r, s)
                got.append('kill:%d' % s)
            except PermissionError:
                pass
    return got
def triple(x):
    return 3 * x
"""
PROBE_TESTS = ["for _ in range(1):\n    assert double(0) == []",  # nothing of the runner was reached
               "for x in range(3):\n    assert triple(x) == 3 * x"]  # an honest test of the same run


def test_the_runner_is_out_of_the_solutions_reach(backend):
    """From inside the solution: on Docker (runner and solution as different users) every attack on the runner
    gets EPERM/EACCES and the run's honest tests pass; on the local backend (one uid) the runner's /proc files and
    ptrace are closed (non-dumpable) but a signal reaches it, and a killed runner gives no pass."""
    run = run_unit_tests(task(PROBE_TESTS), {"solution.py": PROBE}, backend)
    if backend.name == "docker":
        assert run.passed, [(r.status, r.error) for r in run.results]
        assert [r.isolation for r in run.results] == ["uid_split", "uid_split"]
    else:
        assert not run.passed and all(r.status in ("no_result", "error", "timeout") for r in run.results), \
            [(r.status, r.error) for r in run.results]
        probe = PROBE.replace("os.kill(r, s)", "raise PermissionError")  # no signals: the /proc files and ptrace alone
        run = run_unit_tests(task(PROBE_TESTS), {"solution.py": probe}, backend)
        assert run.passed, [(r.status, r.error) for r in run.results]
        assert [r.isolation for r in run.results] == ["same_uid", "same_uid"]


@pytest.mark.docker
def test_without_the_uid_split_the_probe_reaches_the_runner(monkeypatch):
    """The check above can fail: with the runner on the solution's uid (the split removed), the same probe
    stops and kills it, and nothing passes."""
    from tasks.judge import unittests

    monkeypatch.setattr(unittests, "RUNNER_USER", "65534:65534")
    be = open_backend(SandboxConfig(backend="docker"))
    try:
        run = run_unit_tests(task(PROBE_TESTS), {"solution.py": PROBE}, be)
    finally:
        be.shutdown()
    assert not run.passed and all(r.status in ("no_result", "error", "timeout") for r in run.results), \
        [(r.status, r.error) for r in run.results]
