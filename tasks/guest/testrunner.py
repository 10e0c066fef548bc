"""The harness of the agent's `run_tests` tool, run INSIDE the episode's sandbox (standard library only; sent as
`python3 -I -c SOURCE`).

It reads one JSON request on stdin and prints one line `__FLYWHEEL_TESTS__ {json}` carrying the request's token.
`test_*.py` files in the current folder are parsed (not imported) for top-level `test_*` functions; the harness
starts one worker interpreter that imports the test modules once, then forks one process per test (own process
group, wall-clock limit, killed as a group afterwards), so a crash, exit or hang of one test cannot report for
another. A test reports through a private pipe, exactly once; the worker reports how each test process ended. A
file that does not parse is one failing test. No report, two reports, a SystemExit or a changed `builtins` are
recorded as events and never count as a pass.
The worker is testworker.py beside this file: the host puts its source in this program as `WORKER = '...'` ahead
of this file's text (tasks.tools.runner_source), so the sandbox needs no file. This is feedback for the agent only:
verdicts come from tasks/judge/unittests.py (the judge's data and isolated paths), which never uses this harness.
"""

import ast
import json
import os
import signal
import subprocess
import sys
import time

MARKER = "__FLYWHEEL_TESTS__"

SIGNALS = {getattr(signal, n): n for n in ("SIGTERM", "SIGINT", "SIGQUIT", "SIGABRT", "SIGALRM", "SIGHUP",
                                            "SIGUSR1", "SIGUSR2", "SIGKILL", "SIGSEGV", "SIGBUS", "SIGFPE")
           if hasattr(signal, n)}


def _drain(fd, proc, deadline, ready_deadline, token):
    """Everything written to fd until every writer closed it, the worker exited, or a deadline passed.

    The worker must say `ready` (the code under test imported) before ready_deadline. Returns (text, why_stopped)
    where why_stopped is None, "import_timeout" or "timeout".
    """
    chunks = []
    total = 0
    ready = False
    ready_probe = '"token": %s, "index": -1, "kind": "ready"' % json.dumps(token)
    os.set_blocking(fd, False)
    why = None
    while total < 4 * 1024 * 1024:
        try:
            b = os.read(fd, 65536)
        except BlockingIOError:
            now = time.monotonic()
            if not ready and now > ready_deadline:
                why = "import_timeout"
                break
            if now > deadline:
                why = "timeout"
                break
            if proc.poll() is not None:
                try:
                    b = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not b:
                    break
            else:
                time.sleep(0.002)
                continue
        if not b:
            break
        chunks.append(b)
        total += len(b)
        if not ready and ready_probe in b"".join(chunks).decode("utf-8", "replace"):
            ready = True
    os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace"), why


def run_tests(workdir, tests, token, timeout_s):
    """tests: [{"name", "module", "func"}] -> one result dict per test."""
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-I", "-c", WORKER, workdir, str(w)],  # noqa: F821 - the host's
                            stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(w,),
                            start_new_session=True, cwd=workdir)
    os.close(w)
    try:
        proc.stdin.write(json.dumps({"token": token, "tests": tests, "timeout_s": timeout_s}).encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    start = time.monotonic()
    out, why = _drain(r, proc, start + timeout_s * (len(tests) + 1) + 5, start + timeout_s + 3, token)
    worker_timed_out = why is not None
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    per = [{"results": [], "exits": []} for _ in tests]
    for line in out.splitlines():
        try:
            rep = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rep, dict) or rep.get("token") != token:
            continue
        i = rep.get("index")
        if isinstance(i, int) and 0 <= i < len(tests):
            per[i]["results" if rep.get("kind") == "result" else "exits"].append(rep)
    results = []
    for t, p in zip(tests, per):
        res = {"name": t["name"], "status": None, "error": None, "events": [], "returncode": None}
        ex = p["exits"][-1] if p["exits"] else None
        if ex is not None:
            res["returncode"] = ex.get("returncode")
        if len(p["results"]) > 1:
            res.update(status="error", error="the test reported %d results; a test reports once" % len(p["results"]))
            res["events"].append("result_forged")
        elif ex is not None and ex.get("timed_out"):
            res.update(status="timeout", error="the test ran past %.1f s" % timeout_s)
        elif p["results"]:
            rep = p["results"][0]
            res.update(status=rep.get("status"), error=rep.get("error"))
            res["events"].extend(str(e) for e in rep.get("events") or [])
            if res["status"] not in ("pass", "fail", "error"):
                res.update(status="error", error="unknown status %r" % (res["status"],))
        elif ex is None:
            how = ("importing the code under test ran past %.1f s" % (timeout_s + 3) if why == "import_timeout" else
                   "the test harness worker ran past its time" if worker_timed_out else
                   "the test harness worker ended (exit %s) before running it" % (proc.returncode,))
            res.update(status="timeout" if worker_timed_out else "no_result", error=how)
            if not worker_timed_out and (proc.returncode == 0 or (proc.returncode < 0 and
                                                                   -proc.returncode != signal.SIGKILL)):
                res["events"].append("process_exit:worker %s" % _describe(proc.returncode))
        else:
            rc = ex.get("returncode")
            rc = rc if isinstance(rc, int) else 0
            res.update(status="no_result", error="the test process %s before reporting a result" % _describe(rc))
            if rc == 0 or (rc < 0 and -rc != signal.SIGKILL):
                res["events"].append("process_exit:%s" % _describe(rc))
        results.append(res)
    return results


def _describe(rc):
    return ("killed by %s" % SIGNALS.get(-rc, "signal %d" % -rc)) if rc < 0 else "exited with code %d" % rc


def discover(workdir):
    """[(name, module, func) or (name, None, error)] for top-level test_* functions of test files in workdir."""
    found = []
    for fn in sorted(os.listdir(workdir)):
        if not fn.endswith(".py") or not (fn.startswith("test_") or fn.endswith("_test.py")):
            continue
        try:
            with open(os.path.join(workdir, fn), encoding="utf-8") as f:
                tree = ast.parse(f.read(), filename=fn)
        except (SyntaxError, UnicodeDecodeError, OSError) as e:
            found.append((fn, None, "%s does not parse: %s" % (fn, e)))
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                found.append(("%s::%s" % (fn, node.name), fn[:-3], node.name))
    return found


def main():
    req = json.loads(sys.stdin.read())
    token = req["token"]
    timeout_s = float(req.get("timeout_s", 5.0))
    workdir = os.getcwd()
    found = discover(workdir)
    runnable = [{"name": n, "module": m, "func": f} for n, m, f in found if m is not None]
    ran = iter(run_tests(workdir, runnable, token, timeout_s) if runnable else [])
    results = [next(ran) if m is not None else
               {"name": n, "status": "error", "error": f, "events": [], "returncode": None}
               for n, m, f in found]
    sys.stdout.write(MARKER + " " + json.dumps({"token": token, "n_tests": len(results), "results": results}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
