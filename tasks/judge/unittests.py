"""Run a task's unit tests fail-closed in a FRESH sandbox, where the judge never runs beside the solution.

`run_unit_tests` judges the agent's solution files (never its test files) against the task's pristine visible and
hidden tests on one of two paths, chosen per test, each path in a fresh sandbox of its own (the first closed, every
process of it killed, before the second is acquired; each path's census refuses to judge beside a process an
earlier command left):
- data (tasks/judge/testsplit.py): a test made of asserts over calls with constant arguments is split on the host; the
  sandbox only evaluates the calls (tasks/judge/guest/callserver.py, a fork per call after one import) and sends
  each result back in plaindata's strict encoding; the host decodes plain values and evaluates the asserts. The
  expected values never enter the sandbox, so there is nothing in it to forge.
- isolated: any other test runs in the judge's runner (tasks/judge/guest/runner.py), a non-dumpable process that never imports the solution and
  reaches it only through proxies to a call server; the tests see the real builtins, the task's own code and, of
  the solution, only the functions they are meant to call (tasks/judge/testnames.py); its report counts only with the
  per-run secret the host gave it and exit status 0. On Docker the runner runs as another uid than the server and
  the solution (RUNNER_USER), so they cannot signal, ptrace or read it; the local backend has one uid (each
  result's `isolation` says which).
Anything short of one result per test (no report, a bad token or secret, an empty test list, a harness timeout)
is a failure, never a pass. Infrastructure failures raise VerifierUnavailable. `replay_workspace` rebuilds an
agent's final workspace from its tool calls when only the messages are at hand: on the host when the episode only
wrote and read files, else in a fresh sandbox. This module computes no reward and no forensics.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import posixpath
import secrets
from collections.abc import Callable
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from sandbox.result import Backend, Sandbox, SandboxError
from tasks.judge import testnames, testsplit
from tasks.judge.guest import plaindata
from tasks.judge.errors import VerifierUnavailable
from tasks.spec import Task
from tasks.tools import (
    ToolArgumentError,
    WorkspaceSnapshot,
    parse_arguments,
    prepare_workspace,
    pristine_snapshot,
    run_tool,
    workspace_path,
    workspace_snapshot,
)
from warehouse.record import Message

CONFTEST_NAMES = frozenset({"conftest.py", "sitecustomize.py", "usercustomize.py", "pytest.ini", "tox.ini",
                            "setup.cfg", "pyproject.toml"})


class TestResult(BaseModel):
    __test__ = False  # not a pytest class
    name: str
    hidden: bool
    status: str = Field(description="pass, fail, error, timeout or no_result.")
    error: str | None = None
    events: list[str] = Field(default_factory=list,
                              description="Runtime evidence: system_exit, builtins_patched, not_plain_data…")
    strength: str = Field(default="data", description="data: the host compared plain results; isolated: the "
                                                       "runner judged apart from the solution.")
    expected: str | None = Field(default=None, description="Short repr of the expected value (data path).")
    got: str | None = Field(default=None, description="Short repr of the value the call returned (data path).")
    isolation: str | None = Field(default=None, description="Isolated path only: uid_split (runner and solution "
                                                            "ran as different users: Docker) or same_uid (the local "
                                                            "backend maps one uid, see RUNNER_USER).")


class TestRun(BaseModel):
    """One fail-closed run of a task's tests. `passed` only when every expected test reported a pass."""

    __test__ = False  # not a pytest class

    expected: int
    results: list[TestResult] = Field(default_factory=list)
    harness_error: str | None = None

    @property
    def passed(self) -> bool:
        return (self.harness_error is None and self.expected > 0 and len(self.results) == self.expected
                and all(r.status == "pass" for r in self.results))

    @property
    def strength(self) -> str:
        """The weakest path that judged a test: "isolated" if any test ran there, else "data"."""
        return "isolated" if any(r.strength == "isolated" for r in self.results) else "data"

    def counts(self) -> dict[str, int]:
        vis = [r for r in self.results if not r.hidden]
        hid = [r for r in self.results if r.hidden]
        return {"visible_total": sum(1 for r in self.results if not r.hidden),
                "visible_passed": sum(r.status == "pass" for r in vis),
                "hidden_total": len(hid), "hidden_passed": sum(r.status == "pass" for r in hid)}


def is_test_path(path: str) -> bool:
    base = posixpath.basename(path)
    return base.endswith(".py") and (base.startswith("test_") or base.endswith("_test.py"))


def solution_files(task: Task, workspace: WorkspaceSnapshot) -> dict[str, str]:
    """What the verifier copies: the workspace's text files except test files and conftest-like files.

    Data files the task ships or the agent wrote travel too (a solution may read them); test files never do, so
    the pristine tests are the only ones that judge.
    """
    out = {}
    for path, st in workspace.files.items():
        if is_test_path(path) or posixpath.basename(path) in CONFTEST_NAMES or path.endswith((".pyc", ".pyo")):
            continue
        if st.text is not None:
            out[path] = st.text
    return out


def _module_name(solution_path: str) -> str:
    return solution_path[:-3].replace("/", ".") if solution_path.endswith(".py") else solution_path


@cache
def guest_program(role: str) -> str:
    """The judge's in-sandbox program that starts `role` (serve, launch or runner), as one source for `python3 -I -c`:
    tasks/judge/guest/plaindata.py, callserver.py and, for the runner, runner.py (the sandbox compiles it on every
    verdict, so the call server's roles leave the runner out)."""
    guest = Path(__file__).parent / "guest"
    parts = ["plaindata.py", "callserver.py"] + (["runner.py"] if role == "runner" else [])
    return "\n".join([*((guest / p).read_text() for p in parts), f"{role}()\n"])


JUDGE_MARKER = "__FLYWHEEL_JUDGE__"
# The isolated runner's user where the backend can run a command as a second uid (Docker exec's `user`): not the
# sandbox user (nobody, 65534) the solution runs as, and unprivileged like it (no capability, no-new-privileges).
# bubblewrap (the local backend) maps a single uid into the sandbox's user namespace, so there the runner and the
# solution share nobody's uid: the solution can signal the runner (no report then: never a pass) and read its
# cmdline and status, and only the runner's non-dumpability keeps its memory, environment and descriptors closed.
RUNNER_USER = "65533:65533"
UID_SPLIT_BACKENDS = frozenset({"docker"})


def _replies(stdout: str, token: str) -> list[dict[str, Any]]:
    out = []
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict) and msg.get("token") == token:
            out.append(msg)
    return out


def _exec(sandbox: Sandbox, role: str, request: dict[str, Any], budget: float, user: str | None = None):
    extra = {"user": user} if user is not None else {}
    try:
        res = sandbox.exec(["python3", "-I", "-c", guest_program(role)], stdin=(json.dumps(request) + "\n").encode(),
                           timeout_s=budget, **extra)
    except SandboxError as e:
        raise VerifierUnavailable(f"the test sandbox failed: {type(e).__name__}: {e}") from e
    if res.verdict == "infra_error":
        raise VerifierUnavailable(f"the test sandbox failed: {res.error}")
    return res


@lru_cache(maxsize=4096)
def _cached_plan(code: str, module: str, entries: tuple[str, ...]) -> testsplit.Plan | None:
    return testsplit.plan(code, module=module, entry_points=entries)


def _plan(code: str, module: str, entries: tuple[str, ...]) -> testsplit.Plan | None:
    """testsplit's plan of a test, parsed once per (test, module, entry points): a task's tests judge many episodes.
    The plan is read-only here but for its constants, which a check's expression could mutate: those are copied."""
    pl = _cached_plan(code, module, entries)
    return dataclasses.replace(pl, env=copy.deepcopy(pl.env)) if pl is not None and pl.env else pl


def _data_path(sandbox: Sandbox, task: Task, files: dict[str, str], plans: dict[int, testsplit.Plan],
               tests: list[tuple[str, str, bool]]) -> dict[int, TestResult]:
    """Tests whose plans split: the calls run in the sandbox, the checks on the host."""
    calls: list[dict[str, Any]] = []
    offset: dict[int, int] = {}
    for ti, pl in plans.items():
        offset[ti] = len(calls)
        calls += [{"func": c.func, "args": plaindata.encode(c.args), "kwargs": plaindata.encode(c.kwargs),
                   "test": ti} for c in pl.calls]
    token = secrets.token_hex(16)
    timeout = task.verifier.timeout_s
    req = {"mode": "batch", "token": token, "files": files, "module": _module_name(task.verifier.solution_path),
           "timeout_s": timeout, "calls": calls}
    res = _exec(sandbox, "serve", req, len(calls) * (timeout + 1.0) + 10.0)
    replies = _replies(res.stdout, token)
    ready = [m for m in replies if m.get("kind") == "ready"]
    by_call: dict[int, list[dict[str, Any]]] = {}
    for m in replies:
        if m.get("kind") == "call" and isinstance(m.get("i"), int):
            by_call.setdefault(m["i"], []).append(m)
    out: dict[int, TestResult] = {}
    for ti, pl in plans.items():
        name, _, hidden = tests[ti]
        r = TestResult(name=name, hidden=hidden, status="pass", strength="data")
        if len(ready) != 1:
            r.status, r.error = "no_result", (f"the call server gave no start report (verdict {res.verdict}, exit "
                                              f"{res.exit_code}): {(res.stderr or '')[-300:]}")
            out[ti] = r
            continue
        if ready[0].get("strays"):  # a fresh sandbox has none: something is wrong with the sandbox, never a pass
            r.status, r.error = "no_result", ("processes of an earlier command were alive when the data path "
                                              f"started: {str(ready[0]['strays'])[:300]}")
            r.events.append("process_alive")
            out[ti] = r
            continue
        results: dict[int, Any] = {}
        for k in range(len(pl.calls)):
            got = by_call.get(offset[ti] + k, [])
            if len(got) != 1:
                r.status = "no_result" if not got else "error"
                r.error = (f"no result for call {k + 1} ({pl.calls[k].func}) from the call server (verdict "
                           f"{res.verdict})" if not got else f"call {k + 1} was answered {len(got)} times")
                if got:
                    r.events.append("result_forged")
                break
            m = got[0]
            r.events.extend(str(e) for e in m.get("events") or [] if str(e) not in r.events)
            if m.get("status") == "ok":
                try:
                    results[k] = plaindata.decode(m.get("value"))
                    continue
                except (ValueError, TypeError, OverflowError) as e:
                    r.status, r.error = "error", f"call {k + 1} returned a malformed encoding: {e}"
                    break
            status = m.get("status")
            r.status = {"not_plain": "fail", "timeout": "timeout", "no_result": "no_result"}.get(status, "error")
            r.error = f"{pl.calls[k].func}(...): {str(m.get('error'))[-600:]}"
            break
        if r.status == "pass":
            _evaluate(r, pl, results, tolerance=task.verifier.float_tolerance)
        out[ti] = r
    return out


def _evaluate(r: TestResult, pl: testsplit.Plan, results: dict[int, Any], tolerance: float) -> None:
    for ch in pl.checks:
        try:
            ok = testsplit.evaluate(ch, results, pl.env, tolerance)
        except Exception as e:  # noqa: BLE001 - the assert's own error on plain values is the test's error
            r.status, r.error = "error", f"assert {ch.source}: {type(e).__name__}: {e}"
            return
        if not ok:
            r.status, r.error = "fail", f"assert {ch.source} failed"
            if ch.compare is not None:
                r.expected = plaindata.short(ch.compare[1])
                r.got = plaindata.short(results[ch.compare[0]])
            return


def _isolated_path(sandbox: Sandbox, task: Task, files: dict[str, str], which: list[int],
                   tests: list[tuple[str, str, bool]]) -> dict[int, TestResult]:
    """Tests that do not split: the judge's runner (guest/runner.py), apart from the solution, reports with the run's secret."""
    token, secret = secrets.token_hex(16), secrets.token_hex(32)
    timeout = task.verifier.timeout_s
    budget = len(which) * (4 * timeout + 5.0) + 15.0
    module = _module_name(task.verifier.solution_path)
    own = task.files.get(task.verifier.solution_path, "")
    entries = tuple(sorted(set(_entry_points(task)) | set(testnames.stubs(own))))
    req: dict[str, Any] = {"token": token, "secret": secret, "files": files, "module": module, "timeout_s": timeout,
                           "tests": [{"name": tests[i][0], "code": tests[i][1]} for i in which],
                           # the tests see the task's own code (the pristine file) and, of the solution, only
                           # proxies of the functions they are meant to call (tasks/judge/testnames.py)
                           "own_source": own,
                           "entry_points": list(entries),
                           "call_names": testnames.call_names([tests[i][1] for i in which], module, entries)}
    split = sandbox.backend in UID_SPLIT_BACKENDS
    if split:  # the server starts detached as the sandbox user; the runner connects to it as RUNNER_USER
        folder = f"/tmp/fwjudge-{token}"
        launched = _replies(_exec(sandbox, "launch", {"token": token, "folder": folder, "wait_s": budget},
                                  15.0).stdout, token)
        req["connect"] = folder + "/s"  # a server that did not start: the runner says so, every test errors
        if launched and isinstance(launched[0].get("pid"), int):
            req["server_pid"] = launched[0]["pid"]  # the one orphan the runner's census expects
    else:
        req["server_source"] = guest_program("serve")
    res = _exec(sandbox, "runner", req, budget, user=RUNNER_USER if split else None)
    report = None
    for line in reversed(res.stdout.splitlines()):
        if line.startswith(JUDGE_MARKER + " "):
            try:
                report = json.loads(line[len(JUDGE_MARKER) + 1:])
            except ValueError:
                report = None
            break
    ok = (isinstance(report, dict) and secrets.compare_digest(str(report.get("secret")), secret)
          and report.get("token") == token and res.exit_code == 0 and isinstance(report.get("results"), list)
          and len(report["results"]) == len(which))
    alive = ok and bool(report.get("strays"))
    if alive:  # the runner refuses to judge then; the host does not take its word for it either
        ok, res = False, res.model_copy(update={"stderr": "processes of an earlier command were alive when the "
                                                           f"isolated path started: {str(report['strays'])[:300]}"})
    out: dict[int, TestResult] = {}
    for k, ti in enumerate(which):
        name, _, hidden = tests[ti]
        if not ok:
            out[ti] = TestResult(name=name, hidden=hidden, status="no_result", strength="isolated",
                                 error=f"no valid report from the isolated runner (verdict {res.verdict}, exit "
                                       f"{res.exit_code}): {(res.stderr or '')[-300:]}",
                                 events=["process_alive"] if alive else [])
            continue
        raw = report["results"][k]
        status = str(raw.get("status")) if isinstance(raw, dict) else "error"
        if status not in ("pass", "fail", "error", "timeout", "no_result"):
            status = "error"
        out[ti] = TestResult(name=name, hidden=hidden, status=status, strength="isolated",
                             isolation="uid_split" if report.get("uid_split") is True else "same_uid",
                             error=raw.get("error") if isinstance(raw, dict) else "malformed result",
                             events=[str(e) for e in (raw.get("events") or [])] if isinstance(raw, dict) else [])
        if not report.get("guarded"):
            out[ti].events.append("runner_not_guarded")
    return out


def run_unit_tests(task: Task, files: dict[str, str], backend: Backend) -> TestRun:
    """Visible then hidden tests of `task` against `files` (the agent's code): each judging path (data, isolated)
    in a fresh sandbox of its own, the first closed before the second starts."""
    tests = ([(f"visible_{i}", c, False) for i, c in enumerate(task.visible_tests, 1)]
             + [(f"hidden_{i}", c, True) for i, c in enumerate(task.hidden_tests, 1)])
    if not tests:
        return TestRun(expected=0, harness_error="the task has no tests; an empty test list never passes")
    if task.verifier.solution_path not in files:
        return TestRun(expected=len(tests), harness_error=f"{task.verifier.solution_path} is missing from the "
                                                          "workspace")
    module = _module_name(task.verifier.solution_path)
    entries = _entry_points(task)
    plans = {}
    for i, (_, code, _) in enumerate(tests):
        pl = _plan(code, module, entries)
        if pl is not None:
            plans[i] = pl
    isolated = [i for i in range(len(tests)) if i not in plans]
    done: dict[int, TestResult] = {}
    # one fresh sandbox per judging path, the first closed before the second is acquired: no process the data
    # path's import of the solution left (a daemon) is alive when the isolated runner starts; each path's census
    # checks it (callserver.census)
    if plans:
        done.update(_in_fresh_sandbox(backend, lambda sb: _data_path(sb, task, files, plans, tests)))
    if isolated:
        done.update(_in_fresh_sandbox(backend, lambda sb: _isolated_path(sb, task, files, isolated, tests)))
    return TestRun(expected=len(tests), results=[done[i] for i in range(len(tests))])


def _entry_points(task: Task) -> tuple[str, ...]:
    entry = task.metadata.get("entry_point")
    return (entry,) if isinstance(entry, str) and entry else ()


def _in_fresh_sandbox(backend: Backend, path: Callable[[Sandbox], dict[int, TestResult]]) -> dict[int, TestResult]:
    """One judging path in a sandbox of its own, closed (every process of it killed) before this returns."""
    try:
        sandbox = backend.acquire()
    except SandboxError as e:
        raise VerifierUnavailable(f"cannot acquire a sandbox for the tests: {type(e).__name__}: {e}") from e
    try:
        return path(sandbox)
    finally:
        try:
            sandbox.close()
        except SandboxError:
            pass


_FILE_ONLY_TOOLS = frozenset({"write_file", "read_file"})


def _replay_on_host(task: Task, messages: list[Message]) -> WorkspaceSnapshot | None:
    """The final workspace of an episode that only wrote and read files, computed here; None if it ran code."""
    files = dict(task.files)
    for m in messages:
        if m.role != "assistant" or not m.tool_calls:
            continue
        for tc in m.tool_calls:
            name = tc.function.name
            if name not in task.tools or name == "run_tests":
                continue
            if name not in _FILE_ONLY_TOOLS:
                return None
            try:
                args = parse_arguments(name, tc.function.arguments)
            except ToolArgumentError:
                continue
            rel = workspace_path(args["path"])
            if name == "write_file" and rel is not None:
                if any(rel == p or rel.startswith(p + "/") or p.startswith(rel + "/") for p in files if p != rel):
                    return None  # a file where a folder is (or the reverse): let a real sandbox say what happens
                files[rel] = args["content"]
    return pristine_snapshot(files)


def replay_workspace(task: Task, messages: list[Message], backend: Backend) -> WorkspaceSnapshot:
    """The episode's final workspace: on the host when it only wrote/read files, else by re-running its
    well-formed tool calls (except run_tests) in a fresh sandbox and taking a snapshot."""
    host = _replay_on_host(task, messages)
    if host is not None:
        return host
    try:
        sandbox = backend.acquire()
    except SandboxError as e:
        raise VerifierUnavailable(f"cannot acquire a sandbox to replay the episode: {type(e).__name__}: {e}") from e
    try:
        prepare_workspace(sandbox, task.files)
        for m in messages:
            if m.role != "assistant" or not m.tool_calls:
                continue
            for tc in m.tool_calls:
                if tc.function.name not in task.tools or tc.function.name == "run_tests":
                    continue
                try:
                    args = parse_arguments(tc.function.name, tc.function.arguments)
                except ToolArgumentError:
                    continue
                res = run_tool(sandbox, tc.function.name, args)
                if res.verdict == "infra_error":
                    raise VerifierUnavailable(f"replay failed in the sandbox: {res.error}")
        return workspace_snapshot(sandbox)
    except SandboxError as e:
        raise VerifierUnavailable(f"replay failed: {type(e).__name__}: {e}") from e
    finally:
        try:
            sandbox.close()
        except SandboxError:
            pass
