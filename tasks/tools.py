"""Tools a task can expose to a policy: their JSON schemas (OpenAI function format) and how a call runs.

Tools: `python` (run code; the sandbox may keep interpreter state across calls), `write_file`, `read_file`,
`run_tests` (the workspace's visible tests through tasks/guest/testrunner.py) and `shell`; a task may add tools of its
own (Task.tool_specs: their schemas are read here, their calls run by the task's module, e.g. tasks/bfcl.py). Every
call runs inside the episode's sandbox through the `Sandbox` protocol (exec, run_python, write_files); its
observation is the text handed back to the model. Also here: `prepare_workspace` (the loop calls it once before
the first turn) and `workspace_snapshot` (the loop calls it after the last turn, before closing the sandbox;
forensics and the unit-test verifier read it). This module does not talk to policies or verify anything.
"""

from __future__ import annotations

import json
import posixpath
import secrets
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from sandbox.result import ExecResult, Sandbox, SandboxError


def _fn(name: str, description: str, props: dict[str, str], required: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {"type": "object",
                              "properties": {k: {"type": "string", "description": d} for k, d in props.items()}}
    if required:  # omitted when empty, exactly as TRL derives it from a no-argument method (same prompt in GRPO)
        params["required"] = required
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


PYTHON_TOOL = _fn("python", "Run Python 3 code in a sandbox and return what it prints.",
                  {"code": "Python source to run."}, ["code"])
WRITE_FILE_TOOL = _fn("write_file", "Create or overwrite a text file in the workspace.",
                      {"path": "Path relative to the workspace, e.g. 'solution.py'.", "content": "Full file text."},
                      ["path", "content"])
READ_FILE_TOOL = _fn("read_file", "Return the text of a file in the workspace.",
                     {"path": "Path relative to the workspace."}, ["path"])
RUN_TESTS_TOOL = _fn("run_tests", "Run the visible tests (test_*.py in the workspace) and report each result.",
                     {}, [])
SHELL_TOOL = _fn("shell", "Run a shell command in the workspace and return its output.",
                 {"command": "The command line, run with sh -c."}, ["command"])

TOOLS: dict[str, dict[str, Any]] = {"python": PYTHON_TOOL, "write_file": WRITE_FILE_TOOL,
                                    "read_file": READ_FILE_TOOL, "run_tests": RUN_TESTS_TOOL, "shell": SHELL_TOOL}
CODE_TOOLS = ["write_file", "read_file", "run_tests", "python"]

OBSERVATION_LIMIT = 2000  # characters of tool output shown to the model
SNAPSHOT_TEXT_LIMIT = 65536  # bytes of one file's text kept in a workspace snapshot
# bytes of a Python source file's text kept: the judge copies the solution's modules from the snapshot, so a helper
# module of the solution must travel whole (a 64 KB cut made a correct solution fail with ModuleNotFoundError)
SOURCE_TEXT_LIMIT = 4 * 1024 * 1024
RUNNER_MARKER = "__FLYWHEEL_TESTS__"


class ToolArgumentError(ValueError):
    """The model called a tool with a name or arguments that cannot run (a model_error, not a crash)."""


GUEST = Path(__file__).with_name("guest")  # the in-sandbox programs of the tools, shipped as source


@cache
def runner_source() -> str:
    """The `run_tests` harness sent to the sandbox as `python3 -I -c SOURCE`: tasks/guest/testrunner.py, with the
    source of its worker (tasks/guest/testworker.py) bound to WORKER ahead of it."""
    worker = (GUEST / "testworker.py").read_text()
    return f"WORKER = {worker!r}\n" + (GUEST / "testrunner.py").read_text()


@cache
def snapshot_source() -> str:
    """The workspace snapshot program (tasks/guest/snapshot.py), sent as `python3 -I -c SOURCE TEXT_LIMIT
    SOURCE_LIMIT`."""
    return (GUEST / "snapshot.py").read_text()


def _known(specs: list[dict[str, Any]] | tuple = ()) -> dict[str, dict[str, Any]]:
    """The built-in tools, and a task's own (Task.tool_specs) by name."""
    return {**TOOLS, **{s["function"]["name"]: s for s in specs}}


def tool_schemas(names: list[str], specs: list[dict[str, Any]] | tuple = ()) -> list[dict[str, Any]]:
    """The schemas of `names`: built-in tools, or the task's own from `specs` (Task.tool_specs)."""
    known = _known(specs)
    try:
        return [known[n] for n in names]
    except KeyError as e:
        raise ValueError(f"unknown tool {e.args[0]!r}; known tools: {sorted(known)}") from None


def parse_arguments(name: str, arguments: str, specs: list[dict[str, Any]] | tuple = ()) -> dict[str, Any]:
    """Decode a tool call's JSON arguments and check them against the tool's required fields (and string-typed
    fields against strings); `specs` adds a task's own tools (Task.tool_specs)."""
    known = _known(specs)
    if name not in known:
        raise ToolArgumentError(f"unknown tool {name!r}")
    try:
        args = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError as e:
        raise ToolArgumentError(f"arguments of {name!r} are not valid JSON: {e}") from None
    if not isinstance(args, dict):
        raise ToolArgumentError(f"arguments of {name!r} must be a JSON object")
    params = known[name]["function"]["parameters"]
    missing = [k for k in params.get("required", []) if k not in args]
    if missing:
        raise ToolArgumentError(f"tool {name!r} is missing argument(s) {missing}")
    for k, v in args.items():
        if params["properties"].get(k, {}).get("type") == "string" and not isinstance(v, str):
            raise ToolArgumentError(f"argument {k!r} of {name!r} must be a string")
    return args


def workspace_path(path: str) -> str | None:
    """A model-given path as a path relative to the workspace, or None when it leaves the workspace."""
    p = path.strip()
    for prefix in ("/workspace/", "./"):
        if p.startswith(prefix):
            p = p[len(prefix):]
    norm = posixpath.normpath(p) if p else ""
    if not norm or norm == "." or norm.startswith("/") or norm.split("/")[0] == "..":
        return None
    return norm


def _refused(msg: str) -> ExecResult:
    return ExecResult(exit_code=1, stderr=msg, verdict="error")


_WRITE = ("import os,sys\np=sys.argv[1]\nd=os.path.dirname(p)\nd and os.makedirs(d,exist_ok=True)\n"
          "open(p,'w',encoding='utf-8').write(sys.stdin.read())\nprint('wrote %d characters to %s' % "
          "(os.path.getsize(p), p))")


def run_tool(sandbox: Sandbox, name: str, args: dict[str, Any], *, timeout_s: float | None = None) -> ExecResult:
    """Run one parsed tool call in the sandbox. Refusals (a path outside the workspace) come back as an error."""
    if name == "python":
        return sandbox.run_python(args["code"], timeout_s=timeout_s)
    if name == "shell":
        return sandbox.exec(["sh", "-c", args["command"]], timeout_s=timeout_s)
    if name in ("write_file", "read_file"):
        rel = workspace_path(args["path"])
        if rel is None:
            return _refused(f"{name}: path {args['path']!r} is outside the workspace; use a relative path")
        if name == "read_file":
            return sandbox.exec(["cat", "--", rel], timeout_s=timeout_s)
        return sandbox.exec(["python3", "-I", "-c", _WRITE, rel], stdin=args["content"].encode(),
                            timeout_s=timeout_s)
    if name == "run_tests":
        return run_visible_tests(sandbox, timeout_s=timeout_s)
    raise ToolArgumentError(f"unknown tool {name!r}")


def run_visible_tests(sandbox: Sandbox, *, per_test_timeout_s: float = 5.0,
                      timeout_s: float | None = None) -> ExecResult:
    """The `run_tests` tool: the workspace's test_*.py through the harness; stdout becomes a short summary."""
    token = secrets.token_hex(8)
    req = json.dumps({"mode": "workspace", "token": token, "timeout_s": per_test_timeout_s})
    res = sandbox.exec(["python3", "-I", "-c", runner_source()], stdin=req.encode(),
                       timeout_s=timeout_s if timeout_s is not None else max(30.0, 4 * per_test_timeout_s))
    report = parse_runner_output(res.stdout, token)
    if report is None:
        return res.model_copy(update={"stdout": "", "stderr": (res.stderr or "")[-1000:] + "\n[the test harness "
                                      "gave no result: counts as a failure]", "verdict": "error"})
    lines = []
    results = report.get("results", [])
    n_pass = sum(r.get("status") == "pass" for r in results)
    if not results:
        lines.append("no tests found (test_*.py with test_* functions); this counts as a failure")
    for r in results:
        if r.get("status") != "pass":
            lines.append(f"{r.get('status', '?').upper()} {r.get('name')}: {r.get('error')}")
    lines.insert(0, f"{n_pass} passed, {len(results) - n_pass} failed")
    return res.model_copy(update={"stdout": "\n".join(lines) + "\n", "stderr": "",
                                  "exit_code": 0 if results and n_pass == len(results) else 1})


def parse_runner_output(stdout: str, token: str) -> dict[str, Any] | None:
    """The harness's report carrying `token`, or None (no marker, wrong token, bad JSON, wrong shape)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RUNNER_MARKER + " "):
            try:
                rep = json.loads(line[len(RUNNER_MARKER) + 1:])
            except ValueError:
                return None
            if not isinstance(rep, dict) or rep.get("token") != token or not isinstance(rep.get("results"), list):
                return None
            return rep
    return None


def observation(result: ExecResult) -> str:
    """The text the model sees after a tool call."""
    if result.verdict == "timeout":
        text = result.stdout + result.stderr + "\n[timed out]"
    elif result.verdict == "resource_limit":
        text = result.stdout + result.stderr + "\n[killed: resource limit]"
    else:
        text = result.stdout + result.stderr
    text = text.strip()
    if len(text) > OBSERVATION_LIMIT or result.truncated:
        text = text[:OBSERVATION_LIMIT] + "\n[output truncated]"
    return text


# ---------------------------------------------------------------------------------------------- workspace


class FileState(BaseModel):
    sha256: str | None = Field(default=None, description="Hash of the bytes; None for a symlink or unreadable.")
    size: int = 0
    text: str | None = Field(default=None, description="UTF-8 text when small enough, else None.")
    symlink: str | None = Field(default=None, description="Link target when the path is a symlink (not followed).")


class WorkspaceSnapshot(BaseModel):
    """The agent's workspace after the last turn: relative path -> state. `error` says why it is incomplete."""

    files: dict[str, FileState] = Field(default_factory=dict)
    error: str | None = None


def prepare_workspace(sandbox: Sandbox, files: dict[str, str]) -> None:
    """Place a task's starting files (Task.files) in the sandbox's workspace. The loop calls it before turn one."""
    if files:
        sandbox.write_files(files)


def workspace_snapshot(sandbox: Sandbox) -> WorkspaceSnapshot:
    """Hash (and keep small texts of) every file in the workspace, symlinks not followed.

    The episode loop calls this after the last turn and before closing the sandbox, and hands it to
    `tasks.judge.verify.verify(..., workspace=...)`. A sandbox failure yields a snapshot with `error` set (verification
    then fails closed) rather than an exception.
    """
    try:
        res = sandbox.exec(["python3", "-I", "-c", snapshot_source(), str(SNAPSHOT_TEXT_LIMIT), str(SOURCE_TEXT_LIMIT)],
                           timeout_s=30.0)
    except SandboxError as e:
        return WorkspaceSnapshot(error=f"snapshot failed: {type(e).__name__}: {e}")
    for line in reversed(res.stdout.splitlines()):
        if line.startswith("__FLYWHEEL_SNAPSHOT__ "):
            try:
                raw = json.loads(line[len("__FLYWHEEL_SNAPSHOT__ "):])
                return WorkspaceSnapshot(files={k: FileState(**v) for k, v in raw.items()})
            except (ValueError, TypeError) as e:
                return WorkspaceSnapshot(error=f"snapshot output unreadable: {e}")
    return WorkspaceSnapshot(error=f"snapshot gave no result (verdict {res.verdict}, exit {res.exit_code}): "
                                   f"{(res.stderr or res.error or '')[-300:]}")


def text_limit(path: str) -> int:
    """Bytes of a file's text a snapshot keeps: SOURCE_TEXT_LIMIT for Python sources, else SNAPSHOT_TEXT_LIMIT."""
    return SOURCE_TEXT_LIMIT if path.endswith(".py") else SNAPSHOT_TEXT_LIMIT


def pristine_snapshot(files: dict[str, str]) -> WorkspaceSnapshot:
    """The snapshot a workspace would give right after `prepare_workspace(files)`."""
    import hashlib

    out = {}
    for k, v in files.items():
        b = v.encode()
        out[k] = FileState(sha256=hashlib.sha256(b).hexdigest(), size=len(b),
                           text=v if len(b) <= text_limit(k) else None)
    return WorkspaceSnapshot(files=out)
