"""Human demonstrations: the shipped demo file, malformed records named by file/line/field, Parquet and datasets
folder inputs, idempotent import into a real lake."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from curate.demos import DemoImportError, import_demos, load_demos
from warehouse.lake import existing_ids
from warehouse.query import connect

DEMOS = str(Path(__file__).resolve().parents[2] / "data" / "demos" / "arithmetic_demos.jsonl")


def good(i: int, answer: int = 5, *, with_ids: bool = True, arguments: object = None) -> dict:
    cid = f"c{i}" if with_ids else None
    call = {"type": "function", "function": {"name": "python",
                                             "arguments": arguments if arguments is not None
                                             else json.dumps({"code": f"print(2 + {answer - 2})"})}}
    tool = {"role": "tool", "content": str(answer)}
    if with_ids:
        call["id"] = cid
        tool["tool_call_id"] = cid
    return {"messages": [{"role": "user", "content": f"Demo {i}: what is 2 + {answer - 2}?"},
                         {"role": "assistant", "content": "Checking.", "tool_calls": [call]},
                         tool,
                         {"role": "assistant", "content": f"Answer: {answer}"}],
            "tools": ["python"], "expected_answer": str(answer), "suite": "arithmetic", "difficulty": 1}


def test_demos_are_judged_like_episodes_and_a_hack_never_enters_a_snapshot_as_a_pass(tmp_path):
    """One judge for every row: a demo is verified and examined by the same verifier and forensics as an episode of
    its suite. A tool-free answer on a tool suite, and a tool call that prints the answer as a literal (nothing
    computed from the problem), are stored as hacks with their reason code and reward 0, whether or not an expected
    answer was given; the honest tool-using demo passes; curation never selects the hacks."""
    from curate.config import CurateConfig
    from curate.stage import curate

    honest = good(1, 85)
    from_memory = {"messages": [{"role": "user", "content": "What is 37 + 74?"},
                                {"role": "assistant", "content": "Answer: 111"}],
                   "tools": ["python"], "suite": "arithmetic", "expected_answer": "111"}
    unchecked = {k: v for k, v in from_memory.items() if k != "expected_answer"}
    unchecked["messages"] = [{"role": "user", "content": "What is 12 + 30?"},
                             {"role": "assistant", "content": "Answer: 42"}]
    literal = good(2, 7, arguments=json.dumps({"code": "print(7)"}))
    no_tool_suite = {"messages": [{"role": "user", "content": "What is 40 + 71?"},
                                  {"role": "assistant", "content": "Answer: 111"}],
                     "tools": ["python"], "suite": "my-notes", "expected_answer": "111"}
    path = tmp_path / "demos.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (honest, from_memory, unchecked, literal, no_tool_suite)))
    rows, errors = load_demos([str(path)], run_id="r", round=0)
    assert errors == []
    got = [(r.verdict, r.hack_flags, r.reward) for r in rows]
    assert got == [("pass", [], 1.0), ("hack", ["no_tool_use"], 0.0), ("hack", ["no_tool_use"], 0.0),
                   ("hack", ["no_tool_use"], 0.0), ("pass", [], 1.0)]  # my-notes is no built-in suite: no tool due
    assert json.loads(rows[1].verifier_details_json)["forensics"][0]["code"] == "no_tool_use"

    root = str(tmp_path / "lake")
    res = curate(root, CurateConfig(demo_paths=[str(path)]), run_id="r", round=1, heldout_tasks=[])
    hacks = {r.trajectory_id for r in rows if r.verdict == "hack"}
    assert {res.outcomes[h] for h in hacks} == {"verdict_hack"}
    assert res.selected_by_source == {"human": 2}


def test_the_shipped_default_demos_all_pass_the_judge():
    """No shipped demo carries a label the judge would contradict (the from-memory demos that answered a tool suite
    without the tool were removed: the judge calls that a hack)."""
    from flows.config import _shipped_demos

    rows, errors = load_demos(_shipped_demos(), run_id="r", round=0)
    assert errors == [] and rows and {(r.verdict, tuple(r.hack_flags)) for r in rows} == {("pass", ())}
    assert all(m.tool_calls for r in rows for m in r.messages[1:2])


def test_shipped_demo_file_is_valid_and_verified():
    rows, errors = load_demos([DEMOS], run_id="r", round=0)
    assert errors == []
    assert len(rows) == 8
    assert {r.source for r in rows} == {"human"} and {r.verdict for r in rows} == {"pass"}
    assert all(json.loads(r.verifier_details_json)["verified"] for r in rows)
    again, _ = load_demos([DEMOS], run_id="r", round=0)
    assert [r.trajectory_id for r in again] == [r.trajectory_id for r in rows]  # deterministic ids
    other_run, _ = load_demos([DEMOS], run_id="r2", round=0)
    assert not {r.trajectory_id for r in other_run} & {r.trajectory_id for r in rows}


def test_malformed_demos_are_each_named_and_clean_ones_kept(tmp_path):
    bad_role = good(2)
    bad_role["messages"][0]["role"] = "human"
    unmatched = good(3)
    unmatched["messages"][2]["tool_call_id"] = "zzz"
    bad_json = good(4, arguments="{'code': 'print(5)'}")
    undeclared = good(5)
    undeclared["messages"][1]["tool_calls"][0]["function"]["name"] = "shell"
    no_tools = good(6)
    del no_tools["tools"]
    ends_in_call = good(7)
    ends_in_call["messages"] = ends_in_call["messages"][:2]
    wrong_answer = good(8)
    wrong_answer["messages"][3]["content"] = "Answer: 6"
    lines = [json.dumps(good(1)), "{not json", json.dumps(bad_role), json.dumps(unmatched), json.dumps(bad_json),
             json.dumps(undeclared), json.dumps(no_tools), json.dumps(ends_in_call), json.dumps(good(9)),
             json.dumps(wrong_answer)]
    path = tmp_path / "demos.jsonl"
    path.write_text("\n".join(lines) + "\n")
    rows, errors = load_demos([str(path)], run_id="r")
    where = {(e.where, e.field) for e in errors}
    assert ("line 2", "record") in where
    assert ("line 3", "messages[0].role") in where
    assert ("line 4", "messages[2].tool_call_id") in where
    assert ("line 5", "messages[1].tool_calls[0].function.arguments") in where
    assert ("line 6", "messages[1].tool_calls[0].function.name") in where
    assert ("line 7", "tools") in where
    assert any(w == "line 8" for w, _ in where)
    assert {e.where for e in errors} == {f"line {n}" for n in range(2, 9)}
    assert all(str(path) in str(e) for e in errors)
    # the clean records survive; the wrong answer is a valid demo judged fail (the filters drop it later)
    assert [(r.task_id.startswith("human-"), r.verdict) for r in rows] == [(True, "pass"), (True, "pass"),
                                                                          (True, "fail")]
    # tools given by the importer make the tool-less record valid
    rows2, errors2 = load_demos([str(path)], run_id="r", default_tools=["python"])
    assert "line 7" not in {e.where for e in errors2} and len(rows2) == 4


def test_parquet_and_datasets_folder_inputs(tmp_path):
    import datasets

    recs = [good(i, answer=10 + i) for i in range(3)]
    pq_recs = [{**r, "tools": json.dumps(["python"])} for r in recs]
    pq.write_table(pa.Table.from_pylist(pq_recs), tmp_path / "demos.parquet")
    rows, errors = load_demos([str(tmp_path / "demos.parquet")], run_id="r")
    assert errors == [] and len(rows) == 3

    # TRL-style: argument objects instead of strings, no ids on calls or tool replies (paired in order)
    trl = [good(i, answer=20 + i, with_ids=False, arguments={"code": f"print({20 + i})"}) for i in range(3)]
    broken = good(9, with_ids=False, arguments={"code": "print(5)"})
    broken["messages"][2]["tool_call_id"] = "only-the-reply-has-an-id"
    datasets.Dataset.from_list(trl + [broken]).save_to_disk(str(tmp_path / "ds"))
    rows, errors = load_demos([str(tmp_path / "ds")], run_id="r")
    assert len(rows) == 3
    assert {e.where for e in errors} == {"row 3"}
    assert json.loads(rows[0].messages[1].tool_calls[0].function.arguments) == {"code": "print(20)"}
    assert rows[0].messages[2].tool_call_id == rows[0].messages[1].tool_calls[0].id

    (tmp_path / "demos.csv").write_text("messages\n")
    with pytest.raises(DemoImportError, match="unknown demo format"):
        load_demos([str(tmp_path / "demos.csv")], run_id="r")
    with pytest.raises(DemoImportError, match="no such file"):
        load_demos([str(tmp_path / "missing.jsonl")], run_id="r")


def test_import_is_idempotent_and_strict_mode_writes_nothing(tmp_path):
    root = str(tmp_path / "lake")
    first = import_demos(root, [DEMOS], run_id="run1")
    second = import_demos(root, [DEMOS], run_id="run1")
    assert (first.written, second.written, second.skipped) == (8, 0, 8)
    assert len(existing_ids(root, "run1", 0)) == 8
    con = connect(root)
    try:
        assert con.execute("SELECT source, count(*) FROM trajectories GROUP BY 1").fetchall() == [("human", 8)]
    finally:
        con.close()

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(good(1)) + "\n" + "[]\n")
    with pytest.raises(DemoImportError, match=r"bad.jsonl line 2: record: must be an object") as e:
        import_demos(root, [str(bad)], run_id="run2", strict=True)
    assert len(e.value.errors) == 1
    assert existing_ids(root, "run2") == set()



def test_a_bad_role_is_one_problem():
    rec = good(1)
    rec["messages"][0]["role"] = "human"
    _, errors = load_demos_from(rec)
    assert [(e.field, e.problem.split(" is ")[0]) for e in errors] == [("messages[0].role", "'human'")]


def load_demos_from(*records):
    import tempfile

    path = Path(tempfile.mkdtemp()) / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return load_demos([str(path)], run_id="r")


def test_demos_import_through_the_console_script(tmp_path):
    """Exit codes, one error line, records counted (not problems), nothing half-written, and where demos went."""
    import subprocess

    from tests.conftest import FLYWHEEL

    bad = good(2)
    bad["messages"][0]["role"] = "human"
    bad["messages"][2]["tool_call_id"] = "zzz"  # a second problem of the same record
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps(good(1)) + "\n" + json.dumps(bad) + "\n" + "[]\n")
    root = str(tmp_path / "lake")

    def run(*extra):
        return subprocess.run([FLYWHEEL, "demos", "import", str(path), "--root", root, *extra], capture_output=True,
                              text=True, timeout=120)

    r = run()
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "2 invalid record(s), nothing imported" in errors[0] and "line 2" in errors[0]
    assert sum(ln.startswith("invalid:") for ln in r.stderr.splitlines()) == 2  # every problem listed
    assert not (tmp_path / "lake" / "trajectories").exists()  # nothing half-written
    r = run("--strict")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error:"), r.stderr
    r = run("--strict", "--allow-partial")
    assert r.returncode == 2 and "contradict" in r.stderr
    r = run("--allow-partial")
    assert r.returncode == 0, r.stderr
    assert "imported 1, already present 0, skipped 2 invalid record(s); run 'demos'" in r.stdout
    assert "--run-id RUN" in r.stdout and "flywheel curate --demos FILE" in r.stdout
    assert existing_ids(root, "demos")
