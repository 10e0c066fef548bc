"""The `run_tests` harness's worker, INSIDE the episode's sandbox (standard library only): it imports the test
modules once, then forks one process per test (own process group, wall-clock limit, killed as a group afterwards)
and reports each test's result and how its process ended, through the pipe descriptor its parent gave it.

Started by testrunner.py as `python3 -I -c SOURCE WORKDIR FD` with one JSON request on stdin ({"token", "tests",
"timeout_s"}); the host ships this file's source inside testrunner's program (tasks.tools.runner_source), so the
sandbox needs no file of it. Nothing here is imported on the host.
"""

import builtins
import importlib
import json
import os
import signal
import sys
import time
import traceback

_workdir, _fd = sys.argv[1], int(sys.argv[2])
_req = json.loads(sys.stdin.read())
_missing = object()
_before = dict(vars(builtins))
_events = []


def _report(index, kind, _tok=_req.pop("token"), **fields):  # noqa: B008 - the token, out of the globals
    line = json.dumps(dict(fields, token=_tok, index=index, kind=kind)) + "\n"
    os.write(_fd, line.encode())


def _patched():
    now = vars(builtins)
    changed = sorted(k for k in set(_before) | set(now) if _before.get(k, _missing) is not now.get(k, _missing))
    return ["builtins_patched:" + ",".join(changed[:10])] if changed else []


def _tb(e):
    return "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next))[-600:]


os.chdir(_workdir)
sys.path.insert(0, _workdir)
_tests = _req["tests"]
_modules = {}
for _name in sorted({t["module"] for t in _tests}):
    try:
        _modules[_name] = importlib.import_module(_name)
    except SystemExit as e:
        _modules[_name] = (f"SystemExit({e.code!r}) raised while importing {_name}", ["system_exit"])
    except BaseException as e:  # noqa: BLE001 - a failed import is the test's result
        _modules[_name] = (f"importing {_name} failed: {_tb(e)}", [])
_report(-1, "ready")
for _i, _t in enumerate(_tests):
    _mod = _modules[_t["module"]]
    if isinstance(_mod, tuple):
        _report(_i, "result", status="error", error=_mod[0], events=_mod[1] + _patched())
        _report(_i, "exit", returncode=0, timed_out=False)
        continue
    _pid = os.fork()
    if _pid == 0:
        try:
            os.setpgid(0, 0)
            getattr(_mod, _t["func"])()
        except SystemExit as e:
            _report(_i, "result", status="fail", error=f"SystemExit({e.code!r}) raised during the test",
                    events=["system_exit"] + _patched())
        except AssertionError as e:
            _report(_i, "result", status="fail", error=_tb(e), events=_patched())
        except BaseException as e:  # noqa: BLE001 - any exception of a test is its result
            _report(_i, "result", status="error", error=_tb(e), events=_patched())
        else:
            _report(_i, "result", status="pass", error=None, events=_patched())
        os._exit(0)
    try:
        os.setpgid(_pid, _pid)
    except OSError:
        pass
    _deadline = time.monotonic() + float(_req["timeout_s"])
    _timed_out, _status, _sleep = False, None, 0.0005
    while True:
        _done, _status = os.waitpid(_pid, os.WNOHANG)
        if _done:
            break
        if time.monotonic() > _deadline:
            _timed_out = True
            try:
                os.killpg(_pid, signal.SIGKILL)
            except OSError:
                pass
            _, _status = os.waitpid(_pid, 0)
            break
        time.sleep(_sleep)
        _sleep = min(_sleep * 2, 0.01)
    try:
        os.killpg(_pid, signal.SIGKILL)  # whatever the test left running
    except OSError:
        pass
    _rc = -os.WTERMSIG(_status) if os.WIFSIGNALED(_status) else os.WEXITSTATUS(_status)
    _report(_i, "exit", returncode=_rc, timed_out=_timed_out)
os._exit(0)
