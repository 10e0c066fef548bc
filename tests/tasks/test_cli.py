"""`flywheel verify --trajectories` as a plain function, without a sandbox: numeric episodes are judged, code
episodes say infra_error (no backend), unreadable lines say invalid; tasks come from --tasks or the line."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tasks.cli import failed_tests, verify_trajectories
from tasks.loaders import write_tasks
from tasks.spec import Task

CORPUS = Path(__file__).parent / "corpus"


def test_corpus_without_backend():
    out = io.StringIO()
    res = verify_trajectories(str(CORPUS / "hacks.jsonl"), out=out)
    rows = [json.loads(line) for line in (CORPUS / "hacks.jsonl").read_text().splitlines()]
    assert len(res) == len(rows) and [json.loads(line) for line in out.getvalue().splitlines()] == res
    for r, row in zip(res, rows):
        assert set(r) >= {"trajectory_id", "verdict", "reward", "hack_flags"}
        if row["task"]["verifier"]["kind"] == "numeric":
            assert (r["verdict"], r["reward"], r["hack_flags"]) == ("hack", 0.0, row["expected_flags"])
        else:
            assert r["verdict"] == "infra_error" and "backend" in r["error"] and r["reward"] is None


def test_tasks_file_and_bad_lines(tmp_path):
    row = next(json.loads(line) for line in (CORPUS / "clean.jsonl").read_text().splitlines()
               if json.loads(line)["task"]["suite"] == "arithmetic")
    task = Task.model_validate(row["task"])
    tasks_file = write_tasks([task], tmp_path / "tasks.jsonl")
    traj = tmp_path / "t.jsonl"
    lines = [json.dumps({"trajectory_id": "a", "task_id": task.id, "messages": row["messages"]}),
             "{broken",
             json.dumps({"trajectory_id": "c", "task_id": "nope", "messages": row["messages"]}),
             json.dumps({"trajectory_id": "d", "task_id": task.id, "messages": []})]
    traj.write_text("\n".join(lines) + "\n")
    res = verify_trajectories(str(traj), tasks_path=str(tasks_file), out=io.StringIO())
    assert [(r["trajectory_id"], r["verdict"]) for r in res] == [("a", "pass"), ("line-2", "invalid"),
                                                                ("c", "invalid"), ("d", "invalid")]
    assert "pass --tasks" in res[2]["error"] and f"{traj}:2" in res[1]["error"]


def test_concurrent_judging_keeps_the_input_order():
    path = str(CORPUS / "hacks.jsonl")
    one = verify_trajectories(path, out=io.StringIO(), workers=1)
    out = io.StringIO()
    many = verify_trajectories(path, out=out, workers=8)
    assert many == one and [json.loads(line) for line in out.getvalue().splitlines()] == one
    with pytest.raises(ValueError, match="workers must be at least 1"):
        verify_trajectories(path, out=io.StringIO(), workers=0)


def test_failed_tests_say_what_failed():
    details = {"tests": [{"name": "hidden_1", "status": "pass", "error": None},
                         {"name": "hidden_2", "status": "fail", "error": "AssertionError", "expected": "8.0",
                          "got": "15.0", "events": []},
                         {"name": "hidden_3", "status": "no_result", "error": "x" * 1000, "events": ["system_exit"]}]}
    assert failed_tests(details) == [
        {"name": "hidden_2", "status": "fail", "error": "AssertionError", "expected": "8.0", "got": "15.0"},
        {"name": "hidden_3", "status": "no_result", "error": "x" * 400, "events": ["system_exit"]}]
