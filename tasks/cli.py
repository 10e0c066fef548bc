"""Plain functions behind `flywheel verify --trajectories FILE.jsonl [--tasks FILE]` and `flywheel tasks ...`.

flows/cli.py wires them to the command line; they print nothing themselves except `verify_trajectories`, which
writes one JSON line per trajectory to `out` (trajectory_id, verdict, reward, hack_flags; plus `error` on a line it
could not judge). A trajectory line is a record in the warehouse's format (at least `messages` and `task_id`);
its task comes from --tasks (by id) or from a `task` object embedded in the line; an optional `workspace` object
(a tasks.tools.WorkspaceSnapshot) spares the replay of a code episode. This module holds no verification logic.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from sandbox.result import Backend
from tasks.loaders import ValidationReport, load_tasks, validate_file, write_tasks
from tasks.spec import Task
from tasks.suites import SuiteInfo, list_suites, load_suite
from tasks.tools import WorkspaceSnapshot
from tasks.unittests import VerifierUnavailable
from tasks.verify import verify
from warehouse.record import Message


def tasks_list() -> list[SuiteInfo]:
    """`flywheel tasks list`: the built-in suites."""
    return list_suites()


def tasks_show(source: str, *, n: int = 3, split: str = "train", seed: int = 0, difficulty: int = 1,
               format: str = "auto") -> list[Task]:
    """`flywheel tasks show SUITE|FILE`: the first n tasks of a built-in suite or of a task file."""
    if Path(source).exists():
        return load_tasks(source, format=format, split=split)[:n]
    return load_suite(source, n, split=split, seed=seed, difficulty=difficulty)


def tasks_export(source: str, out_path: str, *, n: int, split: str = "train", seed: int = 0,
                 difficulty: int = 1) -> Path:
    """`flywheel tasks export SUITE OUT.jsonl|OUT.parquet`: tasks as a spec file (e.g. for `verify --tasks`)."""
    return write_tasks(load_suite(source, n, split=split, seed=seed, difficulty=difficulty), out_path)


def tasks_validate(path: str, *, format: str = "auto") -> ValidationReport:
    """`flywheel tasks validate FILE`: every problem with file, line and field (report.ok when none)."""
    return validate_file(path, format=format)


def _line_result(tid: str, verdict: str, reward: float | None, flags: list[str], error: str | None = None) -> dict:
    out: dict[str, Any] = {"trajectory_id": tid, "verdict": verdict, "reward": reward, "hack_flags": flags}
    if error:
        out["error"] = error
    return out


def verify_trajectories(path: str, *, tasks_path: str | None = None, backend: Backend | None = None,
                        out: TextIO | None = None) -> list[dict[str, Any]]:
    """Re-judge each trajectory of a JSONL file; write and return one result dict per line.

    verdict is pass/fail/hack, or `infra_error` (the verifier could not run: no backend for a code task, sandbox
    down) or `invalid` (the line cannot be judged: bad JSON, unknown task, malformed messages), with `error` set.
    """
    out = out if out is not None else sys.stdout
    tasks = {t.id: t for t in load_tasks(tasks_path)} if tasks_path else {}
    results = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
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
        except (ValueError, ValidationError) as e:
            res = _line_result(tid, "invalid", None, [], f"{path}:{n}: {e}")
        else:
            try:
                o = verify(task, msgs, backend=backend, workspace=ws)
                res = _line_result(tid, o.verdict, o.reward, o.hack_flags)
            except VerifierUnavailable as e:
                res = _line_result(tid, "infra_error", None, [], str(e))
        out.write(json.dumps(res) + "\n")
        out.flush()
        results.append(res)
    return results
