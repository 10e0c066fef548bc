"""Values reach the lake's SQL as parameters: ids with quotes round-trip through every reader, a lake folder
with a quote in its path still reads, and placeholders that do not match their values are a QueryError."""

from __future__ import annotations

import json

import pytest

from warehouse.export import export_jsonl
from warehouse.lake import write_rows, write_trajectories
from warehouse.query import QueryError, iter_trajectories, query, read_trajectories
from warehouse.report import heldout_table

QUOTED = ["it's", "o''neil", "x' OR '1'='1"]


def test_quoted_task_ids_round_trip(tmp_path, traj):
    root = str(tmp_path)
    rows = [traj(i, task_id=tid, suite=tid) for i, tid in enumerate(QUOTED)] + [traj(9)]
    write_trajectories(root, rows)
    for tid in QUOTED:
        assert [r.task_id for r in read_trajectories(root, "task_id = ?", [tid])] == [tid]
        got = [b.to_pylist() for b in iter_trajectories(root, "task_id = $t", {"t": tid})]
        assert [r["task_id"] for batch in got for r in batch] == [tid]
    assert query(root, "SELECT count(*) AS n FROM trajectories WHERE list_contains(?, task_id)",
                 [QUOTED]).column("n").to_pylist() == [3]


def test_params_that_do_not_match_are_a_query_error(tmp_path, traj):
    root = str(tmp_path)
    write_trajectories(root, [traj(0)])
    with pytest.raises(QueryError, match="params"):
        query(root, "SELECT * FROM trajectories WHERE task_id = ? AND round = ?", ["a"])
    with pytest.raises(QueryError, match="params"):
        query(root, "SELECT * FROM trajectories WHERE task_id = ?", ["a", 1])
    assert (tmp_path / "quarantine").exists() is False  # a caller's mistake never moves a file


def test_export_filters_take_quoted_values(tmp_path, traj):
    root = str(tmp_path)
    write_trajectories(root, [traj(i, task_id=tid, suite=tid) for i, tid in enumerate(QUOTED)])
    out = tmp_path / "x.jsonl"
    res = export_jsonl(root, str(out), "task_id <> 'none'", suite=["it's", "o''neil"], metadata=True)
    assert res.n_rows == 2
    assert sorted(json.loads(line)["suite"] for line in out.read_text().splitlines()) == ["it's", "o''neil"]


def test_lake_folder_with_a_quote_in_its_path(tmp_path, traj):
    root = str(tmp_path / "it's a lake")
    write_trajectories(root, [traj(i) for i in range(3)] + [traj(i, round=1) for i in range(2)])
    write_rows(root, "rounds", [{"run_id": "r'1", "round": 1, "stage": "eval", "subject": "student",
                                 "split": "heldout", "suite": "arithmetic", "metric": "pass@1", "value": 0.5}])
    assert query(root, "SELECT count(*) AS n FROM trajectories").column("n").to_pylist() == [5]
    assert [r["pass@1"] for r in heldout_table(root, "r'1")] == [0.5]
    assert heldout_table(root, "r") == []
