"""Exports (datasets folder, TRL JSONL), stats and the `flywheel sql` output formats, on a real lake."""

from __future__ import annotations

import json

import datasets
import pyarrow.parquet as pq
import pytest

from warehouse.export import ExportError, build_where, export_command, export_datasets, export_jsonl
from warehouse.lake import write_trajectories
from warehouse.query import QueryError, sql_command
from warehouse.stats import StatsError, compute_stats, stats_command


@pytest.fixture
def lake(tmp_path, traj):
    root = str(tmp_path / "lake")
    rows = [traj(i) for i in range(6)]  # verdicts: fail, pass, pass, fail, pass, pass
    rows += [traj(i, round=1, source="student", policy="student-r1", suite="code", split="heldout",
                  verdict="hack", hack_flags=["printed_expected"]) for i in range(2)]
    rows += [traj(9, round=1, verdict="infra_error", source="student", policy="student-r1")]
    write_trajectories(root, rows)
    return root, rows


def test_jsonl_export_is_trl_messages_plus_tools(lake, tmp_path):
    root, rows = lake
    out = tmp_path / "sft.jsonl"
    res = export_jsonl(root, str(out), verdict="pass")
    assert res.n_rows == 4
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 4 and set(lines[0]) == {"messages", "tools"}
    by_id = {r.trajectory_id: r for r in rows}
    ids = [r.trajectory_id for r in rows if r.verdict == "pass"]
    for ex, tid in zip(lines, sorted(ids, key=lambda t: (by_id[t].created_at, t)), strict=True):
        assert ex["messages"] == [m.to_openai() for m in by_id[tid].messages]  # round trip, arguments verbatim
        assert ex["tools"] == json.loads(by_id[tid].tools_json)
    call = lines[0]["messages"][2]["tool_calls"][0]
    assert isinstance(call["function"]["arguments"], str) and "tool_call_id" not in lines[0]["messages"][2]

    obj = export_jsonl(root, str(tmp_path / "obj.jsonl"), "round = 1", arguments_as="object", metadata=True)
    first = json.loads((tmp_path / "obj.jsonl").read_text().splitlines()[0])
    assert obj.n_rows == 3 and first["round"] == 1 and first["source"] == "student"
    assert isinstance(first["messages"][2]["tool_calls"][0]["function"]["arguments"], dict)
    with pytest.raises(ExportError, match="already exists"):
        export_jsonl(root, str(out))


def test_datasets_export_round_trips_through_load_from_disk(lake, tmp_path):
    root, rows = lake
    out = tmp_path / "ds"
    res = export_command(root, str(out), fmt="datasets", suite=["arithmetic"], round=[0])
    assert res.n_rows == 6
    ds = datasets.load_from_disk(str(out))
    assert ds.num_rows == 6 and {"messages", "tools", "trajectory_id", "verdict", "reward"} <= set(ds.column_names)
    by_id = {r.trajectory_id: r for r in rows}
    for ex in ds:
        want = by_id[ex["trajectory_id"]]
        got = [{k: v for k, v in m.items() if v is not None or k == "content"} for m in ex["messages"]]
        assert got == [m.to_openai() for m in want.messages]
        assert json.loads(ex["tools"]) == json.loads(want.tools_json)
    with pytest.raises(ExportError, match="already exists"):
        export_datasets(root, str(out))
    assert export_datasets(root, str(out), verdict=["hack"], overwrite=True).n_rows == 2
    assert datasets.load_from_disk(str(out)).num_rows == 2


def test_export_filters_and_bad_where(lake, tmp_path):
    root, _ = lake
    assert build_where(None) == (None, [])
    assert build_where("reward > 0", verdict=["pass", "hack"], suite="it's", round=[1, 2]) == (
        "(reward > 0) AND \"verdict\" IN (?, ?) AND \"suite\" IN (?) AND round IN (?, ?)",
        ["pass", "hack", "it's", 1, 2])
    res = export_command(root, str(tmp_path / "x.jsonl"), where="reward < 1", source=["student"], split=["heldout"])
    assert res.n_rows == 2
    with pytest.raises(ExportError, match="cannot select"):
        export_command(root, str(tmp_path / "y.jsonl"), where="no_such_column = 1")
    assert not (tmp_path / "y.jsonl").exists() and not list(tmp_path.glob(".y.jsonl*"))


def test_stats_numbers(lake, capsys):
    root, _ = lake
    st = compute_stats(root)
    overall = st["overall"].as_dicts()[0]
    assert (overall["n"], overall["scored"], overall["pass"], overall["hack"], overall["infra_error"]) == (9, 8, 4, 2, 1)
    assert overall["pass_rate"] == 0.5  # infra_error is not scored
    by_source = {r["source"]: r for r in st["by_source"].as_dicts()}
    assert by_source["teacher"]["pass_rate"] == round(4 / 6, 4) and by_source["student"]["pass_rate"] == 0.0
    assert [r["round"] for r in st["by_round"].as_dicts()] == [0, 1]
    assert st["hack_codes"].as_dicts() == [{"code": "printed_expected", "n": 2, "share": round(2 / 9, 4)}]
    stats_command(root, by=["suite"])
    text = capsys.readouterr().out
    assert "By suite" in text and "arithmetic" in text and "printed_expected" in text
    stats_command(root, by=["policy"], fmt="json")
    data = json.loads(capsys.readouterr().out)
    assert {r["policy"] for r in data["by_policy"]} == {"ref-teacher", "student-r1"}
    with pytest.raises(StatsError, match="unknown stats dimension"):
        compute_stats(root, by=["colour"])


def test_sql_command_formats(lake, tmp_path, capsys):
    root, _ = lake
    q = "SELECT verdict, count(*) AS n, list(task_id ORDER BY task_id)[1:1] AS t FROM trajectories " \
        "GROUP BY verdict ORDER BY verdict"
    sql_command(root, q, "table")
    out = capsys.readouterr().out
    assert "verdict" in out and "infra_error" in out and "4 rows" in out
    sql_command(root, q, "json")
    rows = json.loads(capsys.readouterr().out)
    assert rows[0] == {"verdict": "fail", "n": 2, "t": ["arith-000"]}
    sql_command(root, q, "jsonl")
    assert len(capsys.readouterr().out.strip().splitlines()) == 4
    sql_command(root, q, "csv")
    csv_lines = capsys.readouterr().out.strip().splitlines()
    assert csv_lines[0] == '"verdict","n","t"' and len(csv_lines) == 5
    sql_command(root, "SELECT * FROM trajectories", "parquet", str(tmp_path / "out.parquet"))
    assert pq.read_table(tmp_path / "out.parquet").num_rows == 9
    sql_command(root, q, "csv", str(tmp_path / "out.csv"))
    assert (tmp_path / "out.csv").read_text().splitlines()[0] == '"verdict","n","t"'
    with pytest.raises(QueryError, match="--output"):
        sql_command(root, q, "parquet")
    with pytest.raises(QueryError, match="Catalog|views"):
        sql_command(root, "SELECT * FROM nope", "csv", str(tmp_path / "bad.csv"))
    assert not (tmp_path / "bad.csv").exists()
