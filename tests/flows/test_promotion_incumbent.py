"""Promotion against the incumbent in the flywheel's round wiring (issue 29), through the installed console script:
a planted bad round is refused with its reason, and the next round starts from the incumbent.

The run is resumed (`flywheel run --resume`) from a planted history: round 0 left an incumbent whose held-out
scores are 1.0 on every suite (rows planted in the rounds table: a TEST DOUBLE of a good student, since training a
tiny student that good costs minutes), and round 1's snapshot is planted too: teacher-shaped rows whose answers are
all wrong yet labelled pass (a bad snapshot that got past the judge). Everything after that is real: round 1's SFT
trains on the bad snapshot, the promotion stage scores the candidate on the held-out split in real sandboxes and
refuses it (`candidate_worse_on_suite`), the round's student is the incumbent (its scores and its train rollouts),
and round 2 (where a second suite joins, so its teacher writes new rows) starts its SFT from the incumbent's
checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))
RUN = "fw-bad-round"


def _plant(root: Path, *, empty: bool = False) -> tuple[str, list]:
    """The planted history; returns the incumbent's model folder and the held-out tasks. `empty`: round 1's
    snapshot holds no row (every new row was filtered out)."""
    from curate.mixing import write_snapshot
    from flows.config import load_config, save_config
    from flows.rollouts import heldout_tasks, schedule_train_tasks
    from flows.stages import Ledger, metric
    from tasks.tools import TOOLS
    from training.tiny import build_tiny_model, task_corpus
    from warehouse.lake import write_rows, write_trajectories
    from warehouse.record import FunctionCall, Message, ToolCall, Trajectory, trajectory_id

    cfg = load_config(None, [
        f'run.out="{root}"', f'run.run_id="{RUN}"', "flywheel.rounds=2",
        ('flywheel.suites=[{suite="arithmetic",train_tasks=12,heldout_tasks=4},'
         '{suite="arithmetic",difficulty=2,from_round=2,train_tasks=8,heldout_tasks=4}]'), "flywheel.grpo=false",
        "flywheel.pass_k=1", "flywheel.student_train_tasks=4", "flywheel.teacher_ahead=false",
        "sft.max_steps=20", "flywheel.later_sft_steps=20", "mismatch.enabled=false", 'sandbox.backend="local"',
        "curate.demo_paths=[]"])
    save_config(cfg, str(root), RUN)
    train = schedule_train_tasks(cfg, lambda from_round: from_round == 1)
    incumbent = build_tiny_model(root / "models" / "incumbent", task_corpus(train, family="tiny"), family="tiny",
                                 hidden=32, layers=1, heads=2, kv_heads=1, vocab_size=400)
    ledger = Ledger(str(root), RUN)
    ledger.done(0, "base", {"checkpoint_id": "incumbent-r0", "path": str(incumbent)})
    ledger.done(0, "baseline", {})
    write_rows(str(root), "rounds", [metric(RUN, 0, "eval", "base", "heldout", s, m, v)
                                     for s in ("all", "arithmetic-d1", "arithmetic-d2")
                                     for m, v in (("pass@1", 1.0), ("episodes", 4.0))])
    # round 1: a snapshot of wrong answers labelled pass
    bad = []
    for t in train:
        wrong = str(int(t.verifier.answer) + 7)
        call = ToolCall(id="call_0", function=FunctionCall(name="python", arguments=json.dumps(
            {"code": f"print({t.metadata['expression']} + 7)"})))
        msgs = [Message(role="user", content=t.prompt), Message(role="assistant", content=None, tool_calls=[call]),
                Message(role="tool", content=wrong, tool_call_id="call_0", name="python"),
                Message(role="assistant", content=f"Answer: {wrong}")]
        bad.append(Trajectory(
            trajectory_id=trajectory_id(RUN, 1, t.id, "planted", 0), run_id=RUN, round=1, source="teacher",
            policy="planted", task_id=t.id, suite=t.suite, split="train", task_version=t.version,
            difficulty=t.difficulty, verifier="numeric", verifier_version="planted", messages=msgs,
            tools_json=json.dumps([TOOLS["python"]]), answer=wrong, reward=1.0, success=True, verdict="pass"))
    write_trajectories(str(root), bad)
    selected = [] if empty else [(r, 1.0) for r in bad]
    sid, _ = write_snapshot(str(root), run_id=RUN, round=1, selected=selected, cfg_hash="planted",
                            config_json="{}", counts={}, parent_snapshot_id=None)
    ledger.done(1, "teacher", {})
    ledger.done(1, "curate", {"snapshot_id": sid, "n_selected": len(selected)})
    return str(incumbent), heldout_tasks(cfg)


def test_a_planted_bad_round_is_refused_and_the_next_round_starts_from_the_incumbent(tmp_path):
    root = tmp_path / "lake"
    incumbent, heldout = _plant(root)
    p = subprocess.run([FLYWHEEL, "run", "--resume", RUN, "--out", str(root)], check=False,
                       capture_output=True, text=True, timeout=900)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-4000:]

    stages = root / "runs" / RUN / "stages"
    ctrl = json.loads((stages / "001-control.json").read_text())
    assert ctrl["promoted"] == "incumbent" and ctrl["incumbent_code"] == "candidate_worse_on_suite"
    assert ctrl["path"] == incumbent and ctrl["checkpoint_id"] == "incumbent-r0"
    assert "arithmetic-d1" in ctrl["incumbent_reason"]
    d1 = next(d for d in ctrl["deltas"] if d["suite"] == "arithmetic-d1")
    assert d1["worse"] and d1["greedy_delta"] < 0
    assert "round 1 candidate_worse_on_suite: sft's checkpoint" in log and "does NOT replace the incumbent" in log

    from warehouse.query import query

    def rows(sql: str, params: list) -> list[dict]:
        return query(str(root), sql, params).to_pylist()

    decision = {r["metric"]: r["value"] for r in rows(
        "SELECT metric, value FROM rounds WHERE run_id = ? AND round = 1 AND subject = 'promotion' "
        "AND suite = 'all'", [RUN])}
    assert decision["incumbent_promoted"] == 0.0 and decision["incumbent_reason:candidate_worse_on_suite"] == 1.0
    # the candidate was really scored (its own held-out episodes), and the round's student is the incumbent
    sft_eps = rows("SELECT count(*) AS n FROM trajectories WHERE run_id = ? AND round = 1 AND policy = ?",
                   [RUN, "student-r1-sft"])
    assert sft_eps == [{"n": len(heldout)}]
    student = {r["suite"]: r["value"] for r in rows(
        "SELECT suite, value FROM rounds WHERE run_id = ? AND round = 1 AND subject = 'student' "
        "AND metric = 'pass@1' AND split = 'heldout'", [RUN])}
    assert student == {"all": 1.0, "arithmetic-d1": 1.0, "arithmetic-d2": 1.0}
    explored = rows("SELECT DISTINCT json_extract_string(sampling_json, '$.model_path') AS m FROM trajectories "
                    "WHERE run_id = ? AND round = 1 AND policy = 'student-r1-train'", [RUN])
    assert explored == [{"m": incumbent}]
    # round 2 starts from the incumbent
    parents = rows("SELECT round, parent_id FROM checkpoints WHERE run_id = ? AND stage = 'sft' ORDER BY round",
                   [RUN])
    assert [(r["round"], r["parent_id"]) for r in parents] == [(1, "incumbent-r0"), (2, "incumbent-r0")]
    assert "promotion.png" in {p.name for p in (root / "runs" / RUN / "report").glob("*.png")}


def test_an_empty_snapshot_trains_no_candidate_and_the_incumbent_goes_on(tmp_path):
    """A round whose snapshot holds no example (all of its new rows filtered out) is not a crash: no SFT or GRPO
    runs, the promotion stage keeps the incumbent with code no_candidate, and the next round starts from it."""
    root = tmp_path / "lake"
    incumbent, _ = _plant(root, empty=True)
    p = subprocess.run([FLYWHEEL, "run", "--resume", RUN, "--out", str(root)], check=False,
                       capture_output=True, text=True, timeout=900)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-4000:]
    stages = root / "runs" / RUN / "stages"
    ctrl = json.loads((stages / "001-control.json").read_text())
    assert ctrl["promoted"] == "incumbent" and ctrl["incumbent_code"] == "no_candidate"
    assert ctrl["candidate"] is None and ctrl["path"] == incumbent
    assert not (stages / "001-sft.json").exists()
    assert "round 1: snapshot" in log and "holds no example" in log

    from warehouse.query import query

    decision = {r["metric"]: r["value"] for r in query(str(root), (
        "SELECT metric, value FROM rounds WHERE run_id = ? AND round = 1 AND subject = 'promotion'"), [RUN]
        ).to_pylist()}
    assert decision == {"incumbent_promoted": 0.0, "incumbent_z": 2.0, "incumbent_reason:no_candidate": 1.0}
    student = {r["suite"]: r["value"] for r in query(str(root), (
        "SELECT suite, value FROM rounds WHERE run_id = ? AND round = 1 AND subject = 'student' "
        "AND metric = 'pass@1' AND split = 'heldout'"), [RUN]).to_pylist()}
    assert student == {"all": 1.0, "arithmetic-d1": 1.0, "arithmetic-d2": 1.0}
    parents = query(str(root), "SELECT round, parent_id FROM checkpoints WHERE run_id = ? AND stage = 'sft'",
                    [RUN]).to_pylist()
    assert [(r["round"], r["parent_id"]) for r in parents] == [(2, "incumbent-r0")]
