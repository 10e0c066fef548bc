"""flywheel.synthesize (flows/synthesize.py) on Docker: round 1's failures ask for tasks near them, admitted by
verifier health, with their lineage; they join the train pool from round 2 on; a candidate that copies a held-out
task of the run is refused; the stage is deterministic, so a re-run writes the same rows.

The student's round-1 train rollouts are PLANTED rows (a test double of a student that fails most ledger tasks and
one arithmetic task: training one to fail in a given way costs minutes); the tasks, the frontier, the writer, the
admission (real containers, the oracle, the null agent, perturbed oracles), the lake and the SQL are real."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

RUN = "fw-synth"


def _plant(tmp: Path, extra: tuple[str, ...] = ()):
    """The run's config and its planted history: 4 ledger train tasks (a Harbor folder) beside arithmetic, the
    student's round-1 train rollouts (3 of 4 ledger tasks and 1 arithmetic task failed), and a held-out ledger task
    that is a copy of the first candidate the frontier asks for. Returns (cfg, the failed episodes by trajectory
    id, the id of the candidate the held-out task copies)."""
    from curate.frontier import Episode, failure_frontier, frontier_candidates
    from flows.config import load_config
    from flows.rollouts import schedule_train_tasks
    from tasks.factory.draft import write_folder
    from tasks.factory.ledger import ledger_draft
    from warehouse.lake import write_trajectories
    from warehouse.record import Message, Trajectory, trajectory_id

    pool = tmp / "ledger-pool"
    for i in range(4):
        write_folder(ledger_draft(5, i), pool / f"ledger-5-{i}")
    root = tmp / "lake"
    cfg = load_config(None, [
        f'run.out="{root}"', f'run.run_id="{RUN}"', "flywheel.rounds=2",
        (f'flywheel.suites=[{{suite="{pool}",train_tasks=4,heldout_tasks=1}},'
         '{suite="arithmetic",train_tasks=2,heldout_tasks=2}]'),
        "flywheel.synthesize.enabled=true", "flywheel.synthesize.candidates=3", "flywheel.synthesize.admission.k=1",
        'flywheel.synthesize.admission.heldout=["arithmetic"]', "flywheel.synthesize.admission.heldout_n=5",
        "flywheel.grpo=false", "flywheel.teacher_ahead=false", "mismatch.enabled=false", "flywheel.pass_k=1",
        *extra])
    from tasks.harbor import load_harbor

    rows, episodes = [], []
    ledger_train = load_harbor(pool)
    train = [t for t in schedule_train_tasks(cfg) if t.suite == "arithmetic"]
    for i, t in enumerate(ledger_train + train):
        ok = i in (0, 5)  # the first ledger task and the second arithmetic task pass
        tid = trajectory_id(RUN, 1, t.id, "student-r1-train", 0)
        episodes.append(Episode(tid, t.id, ok, "pass" if ok else "fail"))
        rows.append(Trajectory(
            trajectory_id=tid, run_id=RUN, round=1, source="student", policy="student-r1-train", task_id=t.id,
            suite=t.suite, split="train", task_version=t.version, verifier=t.verifier.kind, verifier_version="planted",
            messages=[Message(role="user", content=t.prompt), Message(role="assistant", content="done")],
            reward=float(ok), success=ok, verdict="pass" if ok else "fail"))
    write_trajectories(str(root), rows)
    first, _ = frontier_candidates(failure_frontier(episodes, ledger_train + train), 3, seed=0, round=1)[0]
    copy = first.draft.model_copy(update={"name": "heldout-copy", "metadata": {**first.draft.metadata,
                                                                                "split": "heldout"}})
    write_folder(copy, pool / "heldout-copy")  # the held-out task: the frontier's first candidate, renamed
    return cfg, {e.trajectory_id: e for e in episodes if not e.success}, first.candidate_id


@pytest.mark.docker
def test_failures_ask_for_tasks_near_them_with_lineage_and_the_pool_grows_next_round(tmp_path):
    from flows.rollouts import heldout_tasks, synthesized_folder, synthesized_tasks, train_pool
    from flows.synthesize import synthesize_round
    from warehouse.query import query

    cfg, failed, copied = _plant(tmp_path)
    assert [t.id for t in heldout_tasks(cfg) if t.suite == "ledger-pool"] == ["synth/heldout-copy"]
    assert synthesized_tasks(cfg, RUN, lambda joins: True) == []
    out = synthesize_round(cfg, RUN, 1)
    assert (out.candidates, out.failures, out.outside) == (3, 4, 1)
    assert out.admitted == 2, out.funnel  # every ledger candidate is sound; the held-out copy is refused

    rows = query(str(cfg.run.out), "SELECT * FROM task_synthesis WHERE run_id = ? ORDER BY candidate_id",
                 [RUN]).to_pylist()
    assert len(rows) == 3 and {r["round"] for r in rows} == {1}
    refused = [r for r in rows if r["decision"] == "refused"]
    assert [(r["candidate_id"], r["reason_codes"]) for r in refused] == [(copied, ["heldout_copy"])]
    assert "synth/heldout-copy" in refused[0]["detail"]
    dest = synthesized_folder(cfg, RUN, 1)
    assert not dest.with_name(dest.name + ".partial").exists()
    for r in rows:
        # lineage: every failure it names is a failed ledger episode of this round, of a task with the cell's knobs
        assert r["asked_by"] and set(r["asked_by"]) <= set(failed)
        family, difficulty, knobs = r["frontier"].split("/")
        assert family == "ledger" and difficulty.startswith("d")
        if r["decision"] == "admitted":
            meta = tomllib.loads((Path(r["folder"]) / "task.toml").read_text())["metadata"]
            assert Path(r["folder"]).parent == dest
            assert (meta["lineage_run"], meta["lineage_round"], meta["lineage_cell"]) == (RUN, 1, r["frontier"])
            assert ",".join(f"{k}={meta[k]}" for k in ("aggregate", "format", "group_by")) == knobs
            assert f"d{meta['difficulty']}" == difficulty
    asked = {x for r in rows for x in r["asked_by"]}
    assert asked == {tid for tid, e in failed.items() if e.task_id.startswith("synth/")}  # not the arithmetic one

    # the pool grows from round 2 on: the admitted tasks, suite "synthesized"
    assert [t for t in train_pool(cfg, RUN, lambda joins: joins <= 1) if t.suite == "synthesized"] == []
    grown = train_pool(cfg, RUN, lambda joins: joins <= 2)
    new = [t.id for t in grown if t.suite == "synthesized"]
    assert sorted(new) == sorted(f"synth/{r['candidate_id']}" for r in rows if r["decision"] == "admitted")
    assert [t.id for t in grown[-len(new):]] == new  # after the schedule's
    assert [t.id for t in synthesized_tasks(cfg, RUN, lambda joins: joins == 2)] == new

    metrics = {r["metric"]: r["value"] for r in query(
        str(cfg.run.out), "SELECT metric, value FROM rounds WHERE run_id = ? AND stage = 'synthesize'",
        [RUN]).to_pylist()}
    assert metrics["candidates"] == 3 and metrics["admitted"] == 2 and metrics["failures_outside_families"] == 1

    from warehouse.report import build_report

    md = build_report(str(cfg.run.out), RUN).markdown
    assert "## Tasks grown from the student's failures (flywheel.synthesize)" in md
    assert all(r["frontier"] in md for r in rows)

    # a re-run (a resumed stage) writes the same candidates, folders and rows: nothing duplicated
    before = {p.name: (p / "instruction.md").read_text() for p in dest.iterdir()}
    again = synthesize_round(cfg, RUN, 1)
    assert (again.candidates, again.admitted) == (3, 2)
    assert {p.name: (p / "instruction.md").read_text() for p in dest.iterdir()} == before
    n = query(str(cfg.run.out), "SELECT count(*) AS n FROM task_synthesis WHERE run_id = ?", [RUN]).to_pylist()
    assert n == [{"n": 3}], json.dumps(n)
    # the files hold each attempt's rows (6), the table one row per candidate: the same keys, the latest wins
    import pyarrow.parquet as pq

    files = sorted(Path(cfg.run.out).rglob("task_synthesis/**/*.parquet")) or sorted(
        p for p in Path(cfg.run.out).rglob("*.parquet") if "task_synthesis" in str(p))
    raw = [r for f in files for r in pq.read_table(f).to_pylist()]
    assert len(raw) == 6 and len({(r["synthesis_id"], r["candidate_id"]) for r in raw}) == 3


def test_no_failure_on_a_factory_family_writes_nothing(tmp_path):
    """Failures only on tasks no family makes (arithmetic): zero candidates, said in the rounds table. No Docker:
    nothing is built."""
    from flows.config import load_config
    from flows.rollouts import synthesized_folder
    from flows.synthesize import synthesize_round
    from warehouse.query import query

    root = tmp_path / "lake"
    cfg = load_config(None, [f'run.out="{root}"', f'run.run_id="{RUN}"', "flywheel.rounds=2",
                             'flywheel.suites=[{suite="arithmetic",train_tasks=2,heldout_tasks=2}]',
                             "flywheel.synthesize.enabled=true"])
    from flows.rollouts import schedule_train_tasks
    from warehouse.lake import write_trajectories
    from warehouse.record import Message, Trajectory, trajectory_id

    write_trajectories(str(root), [Trajectory(
        trajectory_id=trajectory_id(RUN, 1, t.id, "student-r1-train", 0), run_id=RUN, round=1, source="student",
        policy="student-r1-train", task_id=t.id, suite=t.suite, split="train", task_version=t.version,
        verifier=t.verifier.kind, verifier_version="planted", messages=[Message(role="user", content=t.prompt)],
        verdict="fail") for t in schedule_train_tasks(cfg)])
    out = synthesize_round(cfg, RUN, 1)
    assert (out.candidates, out.admitted, out.failures, out.outside) == (0, 0, 2, 2)
    assert not synthesized_folder(cfg, RUN, 1).exists()
    got = query(str(root), "SELECT value FROM rounds WHERE stage = 'synthesize' AND metric = 'candidates'").to_pylist()
    assert got == [{"value": 0.0}]


@pytest.mark.docker
@pytest.mark.e2e
def test_the_flywheel_runs_the_stage_and_the_next_teacher_covers_its_tasks(tmp_path):
    """Through the console script: `flywheel run --resume` of a planted history in which every stage is done but
    round 1's synthesize stage and round 2's teacher (the other stages' ledger entries are planted: no model is
    trained). The stage runs in the flow and admits its tasks; round 2's teacher rolls out on them (suite
    synthesized, the reference teacher in their containers, judged by their own tests)."""
    import subprocess

    from flows.config import save_config
    from flows.stages import Ledger
    from tests.conftest import FLYWHEEL
    from warehouse.query import query

    cfg, _, _ = _plant(tmp_path)
    root = str(cfg.run.out)
    save_config(cfg, root, RUN)
    ledger = Ledger(root, RUN)
    model = {"checkpoint_id": "planted-base", "path": str(tmp_path / "no-model")}
    ledger.done(0, "base", model)
    ledger.done(0, "baseline", {})
    control = {"promoted": "incumbent", "incumbent_code": "planted", "incumbent_reason": "planted history",
               "student_metrics": []}
    for r, stages in ((1, ("teacher", "curate", "control", "student")), (2, ("curate", "control", "student"))):
        for name in stages:
            ledger.done(r, name, {"curate": {"snapshot_id": f"planted-{r}", "n_selected": 0},
                                  "control": control}.get(name, {}))
    p = subprocess.run([FLYWHEEL, "run", "--resume", RUN, "--out", root], check=False, capture_output=True,
                       text=True, timeout=900)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-4000:]
    assert "round 1 synthesize: 3 candidate(s) near" in log and "2 admitted" in log, log[-4000:]
    assert ledger.get(1, "synthesize")["admitted"] == 2 and ledger.get(2, "teacher") is not None
    admitted = {f"synth/{r['candidate_id']}" for r in query(
        root, "SELECT candidate_id FROM task_synthesis WHERE run_id = ? AND decision = 'admitted'",
        [RUN]).to_pylist()}
    got = query(root, "SELECT task_id, verdict, verifier FROM trajectories WHERE run_id = ? AND round = 2 AND "
                      "source = 'teacher' AND suite = 'synthesized' ORDER BY task_id", [RUN]).to_pylist()
    assert {r["task_id"] for r in got} == admitted and len(admitted) == 2
    assert all(r["verifier"] == "harbor" and r["verdict"] == "pass" for r in got), got


@pytest.mark.docker
def test_the_openai_writer_is_shown_the_failed_tasks_and_its_candidates_are_judged(tmp_path):
    """writer = 'openai' against a loopback endpoint with planted replies (tests/tasks/planted_writer.py, a TEST
    DOUBLE of an LLM): one request per candidate, each showing the failed tasks of its cell as seeds; the replies are
    admitted or refused by the same admission (a sound task, one whose oracle fails, one whose null agent passes),
    each row with its lineage."""
    from flows.synthesize import synthesize_round
    from tests.tasks.planted_writer import PlantedWriter, proposals
    from warehouse.query import query

    held = Path(__file__).resolve().parents[2] / "data" / "harbor" / "csv-sum"
    with PlantedWriter(proposals(held)) as server:
        cfg, failed, _ = _plant(tmp_path, (
            'flywheel.synthesize.writer="openai"',
            (f'flywheel.synthesize.writer_policy={{kind="openai",name="task-writer",base_url="{server.url}",'
             'model="planted"}')))
        out = synthesize_round(cfg, RUN, 1)
    assert (out.candidates, out.admitted) == (3, 1), out.funnel
    assert len(server.requests) == 3 and sorted(int(b["seed"]) for b in server.requests) == [0, 1, 2]
    failed_tasks = {e.task_id for e in failed.values()}
    passed = next(t for t in cfg_tasks(cfg) if t.id == "synth/ledger-5-0")
    instructions = {tid: next(t for t in cfg_tasks(cfg) if t.id == tid).prompt for tid in failed_tasks}
    for body in server.requests:  # every request shows failed tasks of the run as its seeds, and only those
        content = body["messages"][1]["content"]
        shown = [tid for tid, text in instructions.items() if json.dumps(text)[1:40] in content]
        assert shown and all(tid.startswith("synth/ledger-5-") for tid in shown), content[:300]
        assert json.dumps(passed.prompt)[1:40] not in content  # the task the student passed is no seed
    rows = {r["candidate_id"]: r for r in query(
        str(cfg.run.out), "SELECT * FROM task_synthesis WHERE run_id = ?", [RUN]).to_pylist()}
    assert rows["openai-r1-0"]["decision"] == "admitted" and rows["openai-r1-0"]["writer"] == "openai"
    assert rows["openai-r1-1"]["reason_codes"] == ["oracle_fails"]
    assert rows["openai-r1-2"]["reason_codes"][0] == "null_passes"
    for r in rows.values():
        assert r["round"] == 1 and r["frontier"].startswith("ledger/") and set(r["asked_by"]) <= set(failed)
        assert r["seed_tasks"] and set(r["seed_tasks"]) <= failed_tasks  # the failed tasks it was shown


def cfg_tasks(cfg) -> list:
    from flows.rollouts import schedule_train_tasks

    return schedule_train_tasks(cfg)
