"""Run a task's unit tests fail-closed in a FRESH sandbox, and rebuild an agent's workspace by replay.

`run_unit_tests` acquires a new sandbox from the backend, sends the agent's solution files (never its test files)
plus the pristine visible and hidden tests from the Task to tasks/testrunner.py on stdin, and reads the one report
line carrying a random token. Anything short of one result per test (no report, a bad token, fewer results, an
empty test list, a harness timeout) is a failure, never a pass. Infrastructure failures raise VerifierUnavailable.
`replay_workspace` re-runs an episode's tool calls in a fresh sandbox to recover its final workspace when only the
messages are at hand (re-judging stored trajectories). This module computes no reward and no forensics.
"""

from __future__ import annotations

import json
import posixpath
import secrets
from typing import Any

from pydantic import BaseModel, Field

from sandbox.result import Backend, SandboxError
from tasks.spec import Task
from tasks.tools import (
    ToolArgumentError,
    WorkspaceSnapshot,
    parse_arguments,
    parse_runner_output,
    prepare_workspace,
    run_tool,
    runner_source,
    workspace_snapshot,
)
from warehouse.record import Message

CONFTEST_NAMES = frozenset({"conftest.py", "sitecustomize.py", "usercustomize.py", "pytest.ini", "tox.ini",
                            "setup.cfg", "pyproject.toml"})


class VerifierError(Exception):
    """Base of verifier errors that are not the episode's fault."""


class VerifierUnavailable(VerifierError):
    """The verifier cannot judge now (no sandbox backend, sandbox infrastructure failed): infra_error, retry."""


class TestResult(BaseModel):
    __test__ = False  # not a pytest class
    name: str
    hidden: bool
    status: str = Field(description="pass, fail, error, timeout or no_result.")
    error: str | None = None
    events: list[str] = Field(default_factory=list, description="Runtime evidence: system_exit, builtins_patched…")


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

    def counts(self) -> dict[str, int]:
        vis = [r for r in self.results if not r.hidden]
        hid = [r for r in self.results if r.hidden]
        return {"visible_total": sum(1 for r in self.results if not r.hidden),
                "visible_passed": sum(r.status == "pass" for r in vis),
                "hidden_total": len(hid), "hidden_passed": sum(r.status == "pass" for r in hid)}


def is_test_path(path: str) -> bool:
    base = posixpath.basename(path)
    return base.endswith(".py") and (base.startswith("test_") or base.endswith("_test.py"))


def pristine_test_paths(task: Task) -> list[str]:
    return [p for p in task.files if is_test_path(p)]


def solution_files(task: Task, workspace: WorkspaceSnapshot) -> dict[str, str]:
    """The agent's code the verifier copies: .py files of the workspace except test files and conftest-like files."""
    out = {}
    for path, st in workspace.files.items():
        if not path.endswith(".py") or is_test_path(path) or posixpath.basename(path) in CONFTEST_NAMES:
            continue
        if st.text is not None:
            out[path] = st.text
    return out


def _module_name(solution_path: str) -> str:
    return solution_path[:-3].replace("/", ".") if solution_path.endswith(".py") else solution_path


def run_unit_tests(task: Task, files: dict[str, str], backend: Backend) -> TestRun:
    """Visible then hidden tests of `task` against `files` (the agent's code) in a fresh sandbox."""
    tests = ([{"name": f"visible_{i}", "code": c} for i, c in enumerate(task.visible_tests, 1)]
             + [{"name": f"hidden_{i}", "code": c} for i, c in enumerate(task.hidden_tests, 1)])
    n_visible = len(task.visible_tests)
    if not tests:
        return TestRun(expected=0, harness_error="the task has no tests; an empty test list never passes")
    if task.verifier.solution_path not in files:
        return TestRun(expected=len(tests), harness_error=f"{task.verifier.solution_path} is missing from the "
                                                          "workspace")
    token = secrets.token_hex(16)
    payload = {"mode": "payload", "token": token, "files": files, "tests": tests,
               "module": _module_name(task.verifier.solution_path), "timeout_s": task.verifier.timeout_s}
    budget = len(tests) * (task.verifier.timeout_s + 1.0) + 10.0
    try:
        sandbox = backend.acquire()
    except SandboxError as e:
        raise VerifierUnavailable(f"cannot acquire a sandbox for the tests: {type(e).__name__}: {e}") from e
    try:
        res = sandbox.exec(["python3", "-I", "-c", runner_source()], stdin=json.dumps(payload).encode(),
                           timeout_s=budget)
    except SandboxError as e:
        raise VerifierUnavailable(f"the test sandbox failed: {type(e).__name__}: {e}") from e
    finally:
        try:
            sandbox.close()
        except SandboxError:
            pass
    if res.verdict == "infra_error":
        raise VerifierUnavailable(f"the test sandbox failed: {res.error}")
    report = parse_runner_output(res.stdout, token)
    if report is None:
        return TestRun(expected=len(tests), harness_error=f"no valid report from the test harness (verdict "
                       f"{res.verdict}, exit {res.exit_code}): {(res.stderr or '')[-300:]}")
    run = TestRun(expected=len(tests))
    raw: list[dict[str, Any]] = report["results"]
    if report.get("n_tests") != len(tests) or len(raw) != len(tests):
        run.harness_error = f"expected {len(tests)} results, got {len(raw)}"
    for i, r in enumerate(raw[:len(tests)]):
        if not isinstance(r, dict):
            run.harness_error = f"result {i} is not an object"
            continue
        run.results.append(TestResult(name=str(r.get("name")), hidden=i >= n_visible, status=str(r.get("status")),
                                      error=r.get("error"), events=[str(e) for e in r.get("events") or []]))
    return run


def replay_workspace(task: Task, messages: list[Message], backend: Backend) -> WorkspaceSnapshot:
    """Re-run the episode's well-formed tool calls (except run_tests) in a fresh sandbox; snapshot the workspace."""
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
