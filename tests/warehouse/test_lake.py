"""The lake's write and read guarantees, on real Parquet files and a real DuckDB."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from warehouse import lake as lake_mod
from warehouse.lake import LakeError, existing_ids, write_manifest, write_rows, write_trajectories
from warehouse.query import QueryError, connect, query, read_trajectories, scan
from warehouse.record import MESSAGE_TYPE, TRAJECTORY_SCHEMA


def count(root: str, view: str = "trajectories") -> int:
    return query(root, f"SELECT count(*) AS n FROM {view}").column("n")[0].as_py()


def parquet_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "trajectories").rglob("*.parquet"))


def test_write_then_read_back_equal(tmp_path, traj):
    rows = [traj(i) for i in range(6)] + [traj(i, round=1) for i in range(4)]
    res = write_trajectories(str(tmp_path), rows)
    assert (res.written, res.skipped, len(res.paths)) == (10, 0, 2)
    assert all("/trajectories/run=run-a/round=" in p for p in res.paths)
    back = {t.trajectory_id: t for t in read_trajectories(str(tmp_path))}
    assert back == {t.trajectory_id: t for t in rows}
    assert len(read_trajectories(str(tmp_path), "round = 1 AND verdict = 'pass'")) == 2


def test_rewrite_is_idempotent(tmp_path, traj):
    root = str(tmp_path)
    rows = [traj(i) for i in range(5)]
    write_trajectories(root, rows)
    files_before = parquet_files(tmp_path)
    again = write_trajectories(root, rows + rows[:2])  # a retried batch, with repeats inside it
    assert (again.written, again.skipped, again.paths) == (0, 7, [])
    assert parquet_files(tmp_path) == files_before
    more = write_trajectories(root, rows + [traj(5), traj(6)])
    assert (more.written, more.skipped) == (2, 5)
    assert count(root) == 7 and count(root, "trajectories_raw") == 7
    assert existing_ids(root, "run-a", 0) == {t.trajectory_id for t in rows + [traj(5), traj(6)]}
    assert existing_ids(root, "run-a", 3) == set()


def test_reads_deduplicate_two_files_with_the_same_id(tmp_path, traj):
    """Two writers that raced: both files land, the view keeps one row per id (the earliest-written file)."""
    root = str(tmp_path)
    first = [traj(i) for i in range(3)]
    write_trajectories(root, first)
    racer = [traj(1, verdict="hack"), traj(9)]  # same id as traj(1), different content
    lk = lake_mod.open_lake(root)
    lk.write_parquet_atomic(lake_mod.trajectories_to_file_table(racer),
                            str(tmp_path / "trajectories/run=run-a/round=0" / lake_mod._new_part_name()))
    assert count(root, "trajectories_raw") == 5
    assert count(root) == 4
    assert count(root, "messages") == 4 * 5
    # Only the partition a racer touched is de-duplicated on read; the others are read as they are.
    write_trajectories(root, [traj(i, round=2) for i in range(3)])
    write_trajectories(root, [traj(i, round=2) for i in range(6)])
    sr = scan(root)
    assert all("/round=0/" in u for u in sr.suspect) and len(sr.suspect) == 2
    assert len(sr.clean) == 2 and all("/round=2/" in u for u in sr.clean)
    row = query(root, f"SELECT verdict FROM trajectories WHERE trajectory_id = '{first[1].trajectory_id}'")
    assert row.column("verdict").to_pylist() == [first[1].verdict]


def test_no_temp_file_is_ever_visible(tmp_path, traj, monkeypatch):
    root = str(tmp_path)
    write_trajectories(root, [traj(0)])
    part = tmp_path / "trajectories/run=run-a/round=0"
    # What a writer killed mid-write leaves behind: a hidden, half-written temp file.
    (part / ".part-0123.parquet.abcd1234.tmp").write_bytes(b"PAR1 half a file")
    assert count(root) == 1
    assert not (tmp_path / "quarantine").exists()

    # Fault injection: the Parquet writer dies half way. No final file, and the temp file is removed.
    real = pq.write_table

    def dying_write_table(table, where, **kw):  # test double: injects a crash mid-write
        real(table.slice(0, 0), where, **kw)
        raise OSError("disk full (injected)")

    monkeypatch.setattr(lake_mod.pq, "write_table", dying_write_table)
    with pytest.raises(OSError, match="injected"):
        write_trajectories(root, [traj(1)])
    monkeypatch.undo()
    names = sorted(p.name for p in part.iterdir())
    assert len([n for n in names if n.endswith(".parquet")]) == 1
    assert [n for n in names if n.endswith(".tmp")] == [".part-0123.parquet.abcd1234.tmp"]
    assert count(root) == 1
    assert lake_mod.sweep_temp_files(root, older_than_s=0) == [str(part / ".part-0123.parquet.abcd1234.tmp")]


@pytest.mark.parametrize("damage", ["footer", "truncated", "pages"])
def test_corrupt_file_is_quarantined_and_queries_keep_working(tmp_path, traj, damage, caplog):
    root = str(tmp_path)
    write_trajectories(root, [traj(i) for i in range(4)])
    bad = write_trajectories(root, [traj(i, round=1) for i in range(40)]).paths[0]
    data = bytearray(Path(bad).read_bytes())
    if damage == "footer":  # keep the magic bytes and the footer length, scramble the footer itself
        n = int.from_bytes(data[-8:-4], "little")
        for k in range(len(data) - 8 - n, len(data) - 8):
            data[k] ^= 0x5A
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:  # data pages: the footer is fine, the compressed column chunks are not
        n = int.from_bytes(data[-8:-4], "little")
        for k in range(4, len(data) - 8 - n):
            data[k] = 0x55
    Path(bad).write_bytes(bytes(data))

    with caplog.at_level(logging.WARNING, logger="warehouse.query"):
        out = query(root, "SELECT round, count(*) AS n, sum(len(messages)) AS m FROM trajectories GROUP BY round")
    assert out.to_pylist() == [{"round": 0, "n": 4, "m": 20}]
    assert not Path(bad).exists()
    moved = tmp_path / "quarantine" / ("trajectories__run=run-a__round=1__" + Path(bad).name)
    assert moved.exists()
    reason = Path(str(moved) + ".reason.txt").read_text()
    assert bad in reason and "reason:" in reason
    assert any(bad in r.getMessage() and "quarantined" in r.getMessage() for r in caplog.records)
    # Every view keeps working, and the writer now treats the lost rows as missing (a re-run restores them).
    for view in ("trajectories", "messages", "tool_calls", "datasets"):
        query(root, f"SELECT * FROM {view}")
    assert existing_ids(root, "run-a", 1) == set()
    assert write_trajectories(root, [traj(i, round=1) for i in range(40)]).written == 40


def test_schema_evolution_old_file_beside_new(tmp_path, traj):
    """An old file lacks an optional column and a message field; a newer one has an extra column."""
    root = str(tmp_path)
    lk = lake_mod.open_lake(root)
    old = lake_mod.trajectories_to_file_table([traj(i, run_id="old") for i in range(3)])
    old = old.drop_columns(["endpoint", "completion_logprobs"])
    old_msg = pa.struct([f for f in MESSAGE_TYPE if f.name != "name"])
    msgs = [[{k: v for k, v in m.items() if k != "name"} for m in ms] for ms in old.column("messages").to_pylist()]
    old = old.set_column(old.schema.get_field_index("messages"), "messages", pa.array(msgs, pa.list_(old_msg)))
    lk.write_parquet_atomic(old, str(tmp_path / "trajectories/run=old/round=0/part-old.parquet"))

    # All files old: the view still has every column of the current schema.
    cols = query(root, "SELECT * FROM trajectories LIMIT 0").column_names
    assert set(TRAJECTORY_SCHEMA.names) <= set(cols)
    assert count(root) == 3

    write_trajectories(root, [traj(i, run_id="new", endpoint="http://x/v1") for i in range(2)])
    newer = lake_mod.trajectories_to_file_table([traj(7, run_id="newer")])
    newer = newer.append_column("judge_score", pa.array([0.75]))
    lk.write_parquet_atomic(newer, str(tmp_path / "trajectories/run=newer/round=0/part-newer.parquet"))

    out = query(root, "SELECT run_id, count(*) AS n, count(endpoint) AS e, max(judge_score) AS j "
                      "FROM trajectories GROUP BY run_id ORDER BY run_id").to_pylist()
    assert out == [{"run_id": "new", "n": 2, "e": 2, "j": None}, {"run_id": "newer", "n": 1, "e": 0, "j": 0.75},
                   {"run_id": "old", "n": 3, "e": 0, "j": None}]
    names = query(root, "SELECT t.run_id, m.name FROM messages m JOIN trajectories t USING (trajectory_id) "
                        "WHERE m.role = 'tool' ORDER BY 1").to_pylist()
    assert [(r["run_id"], r["name"]) for r in names] == [("new", "python")] * 2 + [("newer", "python")] + [
        ("old", None)] * 3
    back = read_trajectories(root)
    assert len(back) == 6 and {t.run_id for t in back} == {"old", "new", "newer"}


def test_a_schema_2_file_reads_with_the_schema_3_fields(tmp_path, traj):
    """A file written before schema 3 (no stage, GRPO, prompt-id or template columns, no message reasoning)."""
    root = str(tmp_path)
    lk = lake_mod.open_lake(root)
    v3 = {"prompt_token_ids", "chat_template_hash", "model_version", "stage", "grpo_step", "group_id", "advantage"}
    old = lake_mod.trajectories_to_file_table([traj(i, run_id="v2") for i in range(2)]).drop_columns(list(v3))
    old_msg = pa.struct([f for f in MESSAGE_TYPE if f.name != "reasoning"])
    msgs = [[{k: v for k, v in m.items() if k != "reasoning"} for m in ms] for ms in old.column("messages").to_pylist()]
    old = old.set_column(old.schema.get_field_index("messages"), "messages", pa.array(msgs, pa.list_(old_msg)))
    lk.write_parquet_atomic(old, str(tmp_path / "trajectories/run=v2/round=0/part-v2.parquet"))
    new = traj(5, run_id="v3").model_copy(update={"stage": "grpo", "grpo_step": 3, "group_id": "g1", "advantage": 0.5})
    new.messages[2] = new.messages[2].model_copy(update={"reasoning": "add them"})
    write_trajectories(root, [new])
    out = query(root, "SELECT run_id, stage, grpo_step, advantage FROM trajectories ORDER BY run_id, grpo_step")
    assert out.to_pylist() == [{"run_id": "v2", "stage": None, "grpo_step": None, "advantage": None}] * 2 + [
        {"run_id": "v3", "stage": "grpo", "grpo_step": 3, "advantage": 0.5}]
    r = query(root, "SELECT count(reasoning) AS n FROM messages").to_pylist()
    assert r == [{"n": 1}]
    back = {t.run_id: t for t in read_trajectories(root)}
    assert back["v2"].stage == "rollout" and back["v2"].messages[2].reasoning is None
    assert back["v3"].stage == "grpo" and back["v3"].messages[2].reasoning == "add them"


def test_file_url_root_and_local_path_see_the_same_lake(tmp_path, traj):
    url = "file://" + str(tmp_path)
    write_trajectories(url, [traj(i) for i in range(3)])
    write_trajectories(str(tmp_path), [traj(i) for i in range(5)])  # idempotent across both spellings
    assert count(url) == 5 and count(str(tmp_path)) == 5
    assert {t.trajectory_id for t in read_trajectories(url)} == {traj(i).trajectory_id for i in range(5)}


def test_fsspec_url_root(traj):
    """A non-local root (fsspec's in-memory filesystem stands in for an object store)."""
    root = "memory://fw-test-lake"
    write_trajectories(root, [traj(i) for i in range(4)])
    assert write_trajectories(root, [traj(i) for i in range(4)]).written == 0
    assert count(root) == 4 and count(root, "tool_calls") == 4
    write_rows(root, "rounds", [{"run_id": "run-a", "round": 0, "metric": "pass_rate", "value": 0.5}])
    assert count(root, "rounds") == 1


def test_messages_and_tool_calls_views(tmp_path, traj):
    root = str(tmp_path)
    t = traj(3)
    write_trajectories(root, [t, traj(4)])
    msgs = query(root, f"SELECT * FROM messages WHERE trajectory_id = '{t.trajectory_id}' ORDER BY idx").to_pylist()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    assert [m["idx"] for m in msgs] == [0, 1, 2, 3, 4]
    assert [m["n_tool_calls"] for m in msgs] == [0, 0, 1, 0, 0]
    assert msgs[3]["tool_call_id"] == "c3" and msgs[3]["name"] == "python" and msgs[3]["content"] == "4\n"
    assert set(msgs[0]) == {"trajectory_id", "idx", "role", "content", "tool_call_id", "name", "reasoning",
                            "n_tool_calls"}
    calls = query(root, f"SELECT * FROM tool_calls WHERE trajectory_id = '{t.trajectory_id}'").to_pylist()
    assert calls == [{"trajectory_id": t.trajectory_id, "message_idx": 2, "call_idx": 0, "id": "c3",
                      "name": "python", "arguments": json.dumps({"code": "print(3 + 1)"})}]


def test_empty_lake_has_every_view(tmp_path):
    con = connect(str(tmp_path / "nothing-yet"))
    for view in ("trajectories", "trajectories_raw", "messages", "tool_calls", "datasets", "manifests", "rounds",
                 "checkpoints"):
        assert con.sql(f"SELECT count(*) FROM {view}").fetchall() == [(0,)]
    assert set(TRAJECTORY_SCHEMA.names) <= {d[0] for d in con.sql("SELECT * FROM trajectories").description}
    with pytest.raises(QueryError, match="views: trajectories"):
        query(str(tmp_path), "SELECT nope FROM trajectories")


def test_side_tables_and_manifests(tmp_path):
    root = str(tmp_path)
    write_rows(root, "datasets", [{"snapshot_id": "s1", "run_id": "r", "round": 0, "n_rows": 10}])
    write_rows(root, "datasets", [{"snapshot_id": "s1", "run_id": "r", "round": 0, "n_rows": 12}])  # retried
    write_rows(root, "rounds", [
        {"run_id": "r", "round": 0, "stage": "eval", "subject": "student", "split": "heldout", "suite": "a",
         "metric": "pass_rate", "value": v} for v in (0.1, 0.2)])
    write_rows(root, "checkpoints", [{"checkpoint_id": "c1", "run_id": "r", "round": 0, "stage": "sft",
                                      "path": "models/c1", "snapshot_id": "s1"}])
    path = write_manifest(root, "s1", [{"trajectory_id": f"t{i}", "source": "teacher", "weight": 1.0}
                                       for i in range(3)])
    assert path == str(tmp_path / "snapshots/s1/manifest.parquet")
    assert query(root, "SELECT n_rows FROM datasets").column(0).to_pylist() == [12]  # latest row per key
    assert count(root, "rounds") == 1 and count(root, "checkpoints") == 1
    assert query(root, "SELECT DISTINCT snapshot_id FROM manifests").column(0).to_pylist() == ["s1"]
    assert count(root, "manifests") == 3
    with pytest.raises(LakeError, match="unknown columns"):
        write_rows(root, "rounds", [{"run_id": "r", "round": 0, "metric": "m", "value": 1, "vlaue": 2}])
    with pytest.raises(LakeError, match="unknown side table"):
        write_rows(root, "trajectories", [{}])
    with pytest.raises(LakeError, match="lacks required columns"):
        write_rows(root, "checkpoints", [{"checkpoint_id": "c2"}])


def test_bad_inputs_are_refused_with_a_clear_error(tmp_path, traj):
    with pytest.raises(LakeError, match="cannot name a lake partition"):
        write_trajectories(str(tmp_path), [traj(0, run_id="a/b")])
    with pytest.raises(LakeError, match="Trajectory objects"):
        write_trajectories(str(tmp_path), [{"trajectory_id": "x"}])
    with pytest.raises(LakeError, match="three slashes"):
        write_trajectories("file://tmp/x", [traj(0)])
    assert not (tmp_path / "trajectories").exists()


def test_file_table_conversion_matches_record_to_table(traj):
    from warehouse.lakefs import FILE_SCHEMA
    from warehouse.record import to_table

    rows = [traj(i, endpoint="e", hack_flags=["a", "b"], completion_token_ids=[[1, 2], [3]],
                 completion_logprobs=[[-0.5, -0.25]], error_class=None) for i in range(5)]
    from warehouse.record import Message

    rows.append(traj(9, messages=[Message(role="assistant", content="x", tool_calls=[])]))  # [] is not null
    rows.append(traj(10, messages=[]))
    fast = lake_mod.trajectories_to_file_table(rows)
    slow = to_table(rows).select(FILE_SCHEMA.names).cast(FILE_SCHEMA)
    assert fast.equals(slow)
    assert fast.column("messages").to_pylist()[-2][0]["tool_calls"] == []
    odd = [traj(0, completion_logprobs=[[float("-inf"), -1.0]], latency_ms=float("nan"))]  # JSON cannot carry these
    t = lake_mod.trajectories_to_file_table(odd)
    assert t.column("completion_logprobs").to_pylist() == [[[float("-inf"), -1.0]]]
    assert math.isnan(t.column("latency_ms")[0].as_py())


def test_many_files_validated_once(tmp_path, traj, monkeypatch):
    """The footer parse runs once per file; later connects only re-check magic bytes."""
    root = str(tmp_path)
    for r in range(5):
        write_trajectories(root, [traj(i, round=r) for i in range(3)])
    calls = []
    import warehouse.integrity as q

    real = q.deep_check
    monkeypatch.setattr(q, "deep_check", lambda *a, **k: calls.append(a[1].path) or real(*a, **k))
    connect(root)
    n_first = len(calls)
    connect(root)
    q._CHECKED.clear()  # a fresh process: the on-disk cache still knows the files
    connect(root)
    assert len(calls) == n_first <= 5
    assert os.listdir(os.environ["FLYWHEEL_CACHE_DIR"] + "/lake-footers")


def test_compact_merges_partitions_and_drops_duplicates(tmp_path, traj):
    root = str(tmp_path)
    for k in range(4):
        write_trajectories(root, [traj(i) for i in range(3 * k, 3 * k + 3)])
    write_trajectories(root, [traj(0, round=1)])
    lk = lake_mod.open_lake(root)
    lk.write_parquet_atomic(lake_mod.trajectories_to_file_table([traj(1, verdict="hack")]),  # a racer's copy
                            str(tmp_path / "trajectories/run=run-a/round=0" / lake_mod._new_part_name()))
    before = query(root, "SELECT * EXCLUDE (created_at) FROM trajectories ORDER BY trajectory_id")
    res = lake_mod.compact(root)
    assert (res.partitions, res.files_before, res.files_after, res.rows, res.duplicates_dropped) == (1, 6, 2, 12, 1)
    assert len(parquet_files(tmp_path)) == 2
    assert query(root, "SELECT * EXCLUDE (created_at) FROM trajectories ORDER BY trajectory_id").equals(before)
    assert count(root, "trajectories_raw") == 13
    assert existing_ids(root, "run-a", 0) == {traj(i).trajectory_id for i in range(12)}
    assert lake_mod.compact(root).partitions == 0  # nothing left to merge
    sr = scan(root)
    assert sr.suspect == [] and len(sr.clean) == 2  # the merged file holds distinct ids: no read-side dedup


def test_racing_writers_are_detected_and_deduplicated(tmp_path, traj, monkeypatch):
    """Writer B listed the partition before writer A's file landed: both write the same ids. B's file records
    that it saw no file, so readers know the partition needs de-duplication."""
    root = str(tmp_path)
    rows = [traj(i) for i in range(4)]
    write_trajectories(root, rows[:3])  # writer A
    stale = (set(), [])
    monkeypatch.setattr(lake_mod, "_partition_state", lambda lake, top: stale)  # test double: B's stale listing
    assert write_trajectories(root, rows).written == 4  # writer B
    monkeypatch.undo()
    sr = scan(root)
    assert sr.clean == [] and len(sr.suspect) == 2
    assert count(root, "trajectories_raw") == 7 and count(root) == 4
    assert sorted(read_trajectories(root), key=lambda t: t.trajectory_id) == sorted(rows, key=lambda t: t.trajectory_id)
