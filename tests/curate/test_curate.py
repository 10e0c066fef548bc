"""Curation: filters, de-duplication, decontamination, mixing, curriculum and the whole `curate` on a real lake.

Rows are built like the reference teacher's episodes of the arithmetic suite; planted faults (duplicates,
near-duplicates, contaminated rows, hacks, malformed tool calls) must each be caught and counted, and no clean
row may be lost.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tasks import arithmetic
from tasks.tools import PYTHON_TOOL
from curate.stage import SELECTED, curate
from curate.config import (
    CurateConfig,
    CurriculumConfig,
    DecontamConfig,
    DedupConfig,
    FilterConfig,
    MixConfig,
    config_hash,
)
from curate.curriculum import (ALWAYS_FAILED, ALWAYS_PASSED, LOW_SIGNAL, PassRecord, choose_tasks, group_signal,
                              pass_at_k, plan_curriculum)
from curate.decontam import CONTAMINATED, HELDOUT_TASK, Decontaminator, decontaminate
from curate.dedup import DUP_EXACT, DUP_NEAR, content_hash, dedup_rows
from curate.filters import filter_rows
from warehouse.lake import write_trajectories
from curate.mixing import (
    CAP_SUITE,
    CAP_TASK,
    SOURCE_SHARE,
    UNWEIGHTED,
    SnapshotError,
    manifest_rows,
    mix,
    quotas,
    read_snapshot,
)
from warehouse.query import connect
from warehouse.record import FunctionCall, Message, ToolCall, Trajectory, trajectory_id

SYSTEM = "You can call tools. Use the python tool to compute, then reply 'Answer: N'."


def row(task, *, run_id="run1", round=0, source="teacher", policy="ref-teacher", sample=0, verdict="pass",
        final=None, code=None, call_id=None, hack_flags=(), arguments=None, tool_name="python", split=None,
        user=None) -> Trajectory:
    """One episode of `task` shaped like the reference teacher's: tool call, tool output, final answer."""
    expr, ans = task.metadata["expression"], task.verifier.answer
    cid = call_id or f"call_{sample}"
    args = arguments if arguments is not None else json.dumps({"code": code or f"print({expr})"})
    msgs = [
        Message(role="system", content=SYSTEM),
        Message(role="user", content=user or task.prompt),
        Message(role="assistant", content=None,
                tool_calls=[ToolCall(id=cid, function=FunctionCall(name=tool_name, arguments=args))]),
        Message(role="tool", content=str(ans), tool_call_id=cid, name=tool_name),
        Message(role="assistant", content=final or f"Answer: {ans}"),
    ]
    return Trajectory(
        trajectory_id=trajectory_id(run_id, round, task.id, policy, sample), run_id=run_id, round=round,
        source=source, policy=policy, sample_index=sample, task_id=task.id, suite=task.suite,
        split=split or task.split, task_version=task.version, difficulty=task.difficulty, verifier="numeric",
        verifier_version="1", messages=msgs, tools_json=json.dumps([PYTHON_TOOL]), answer=ans,
        reward=1.0 if verdict == "pass" else 0.0, success=verdict == "pass", verdict=verdict,
        hack_flags=list(hack_flags), turns=2, n_tool_calls=1,
    )


@pytest.fixture(scope="module")
def train():
    return arithmetic.generate(30, split="train", seed=0, difficulty=1) + \
        arithmetic.generate(30, split="train", seed=0, difficulty=2)


@pytest.fixture(scope="module")
def heldout():
    return arithmetic.generate(20, split="heldout", seed=0, difficulty=1) + \
        arithmetic.generate(20, split="heldout", seed=0, difficulty=2)


# ---------------------------------------------------------------- filters

def test_filters_drop_each_fault_with_its_reason_and_keep_clean_rows(train):
    t = train
    clean = [row(x) for x in t[:10]]
    faults = [
        (row(t[10], verdict="fail"), "verdict_fail"),
        (row(t[11], verdict="infra_error"), "verdict_infra_error"),
        (row(t[12], hack_flags=["printed_answer_only"]), "hack_flags"),
        (row(t[13], arguments="{code: print(1)}"), "invalid_tool_call"),              # arguments not JSON
        (row(t[14], tool_name="bash"), "invalid_tool_call"),                          # tool not declared
        (row(t[15], arguments=json.dumps({"src": "print(1)"})), "invalid_tool_call"),  # required argument missing
        (row(t[16], code="x" * 20000), "too_long"),
        (row(t[17], split="heldout"), "heldout_split"),
        (row(t[18]).model_copy(update={"turns": 40}), "too_many_turns"),
        (row(t[19]).model_copy(update={"n_tool_calls": 40}), "too_many_tool_calls"),
    ]
    cfg = FilterConfig(max_completion_tokens=100)
    faults.append((row(t[20]).model_copy(update={"completion_tokens": 101}), "too_many_tokens"))
    kept, dropped = filter_rows(clean + [r for r, _ in faults], cfg)
    assert [r.trajectory_id for r in kept] == [r.trajectory_id for r in clean]
    assert dropped == {r.trajectory_id: reason for r, reason in faults}


def test_tool_reply_to_unknown_call_is_invalid(train):
    r = row(train[0])
    msgs = list(r.messages)
    msgs[3] = msgs[3].model_copy(update={"tool_call_id": "nope"})
    kept, dropped = filter_rows([r.model_copy(update={"messages": msgs})], FilterConfig())
    assert not kept and dropped == {r.trajectory_id: "invalid_tool_call"}


# ---------------------------------------------------------------- dedup

def test_exact_and_near_duplicates_are_caught_and_distinct_problems_kept(train):
    clean = [row(x) for x in train]  # 60 distinct problems, many sharing a template
    t0, t1 = train[0], train[1]
    # exact: same episode re-sampled, different call id, extra whitespace and JSON spacing
    exact = row(t0, sample=1, call_id="zz9", arguments='{ "code":  "print(' + t0.metadata["expression"] + ')" }')
    # near: same solution with a remark added to the final message
    near = row(t1, sample=1, final=f"The result is {t1.verifier.answer}. Answer: {t1.verifier.answer}")
    kept, dropped, dup_of = dedup_rows(clean + [exact, near], DedupConfig())
    assert dropped == {exact.trajectory_id: DUP_EXACT, near.trajectory_id: DUP_NEAR}
    assert dup_of == {exact.trajectory_id: clean[0].trajectory_id, near.trajectory_id: clean[1].trajectory_id}
    assert {r.trajectory_id for r in kept} == {r.trajectory_id for r in clean}
    assert content_hash(exact) == content_hash(clean[0])


def test_dedup_prefers_human_copy_and_checks_prior_rows(train):
    t = train[2]
    teacher = row(t)
    human = row(t, source="human", policy="human")
    kept, dropped, _ = dedup_rows([teacher, human], DedupConfig())
    assert [r.trajectory_id for r in kept] == [human.trajectory_id]
    later = row(t, round=1, sample=3)
    kept, dropped, dup_of = dedup_rows([later], DedupConfig(), prior=[teacher])
    assert not kept and dropped == {later.trajectory_id: "dup_exact_earlier_snapshot"}
    assert dup_of[later.trajectory_id] == teacher.trajectory_id


# ---------------------------------------------------------------- decontamination

def test_decontamination_drops_leaks_but_not_same_template_train_tasks(train, heldout):
    clean = [row(x) for x in train]
    h0, h1, h2 = heldout[0], heldout[25], heldout[3]
    leaked_prompt = row(train[0], user=h0.prompt, sample=7)                       # held-out prompt in a train row
    leaked_wrapped = row(train[1], user=f"Please solve this: {h1.prompt} Thanks!", sample=7)
    leaked_task = row(h2, split="train", sample=7)                                # held-out task id, relabelled
    rows = clean + [leaked_prompt, leaked_wrapped, leaked_task]
    kept, dropped, by = decontaminate(rows, heldout, DecontamConfig())
    assert dropped == {leaked_prompt.trajectory_id: CONTAMINATED, leaked_wrapped.trajectory_id: CONTAMINATED,
                       leaked_task.trajectory_id: HELDOUT_TASK}
    assert by[leaked_prompt.trajectory_id] == h0.id and by[leaked_wrapped.trajectory_id] == h1.id
    assert [r.trajectory_id for r in kept] == [r.trajectory_id for r in clean]


def test_template_sharing_scores_stay_far_below_threshold():
    """Over 1,200 train tasks (all three difficulties) against 300 held-out ones, a train task of the same template
    but another problem stays well under the threshold, and every leaked held-out problem scores 1.0.
    (A train task that repeats a held-out problem's numbers with only the name changed is a paraphrase of it, and
    may be dropped: the suite's split hash includes the name.)"""
    worst, leak_min = 0.0, 1.0
    for d in (1, 2, 3):
        tr = arithmetic.generate(400, split="train", seed=1, difficulty=d)
        ho = arithmetic.generate(100, split="heldout", seed=1, difficulty=d)
        held_exprs = {h.metadata["expression"] for h in ho}
        dec = Decontaminator(ho, DecontamConfig(), [t.prompt for t in tr])
        worst = max(worst, max(dec.score(row(t))[0] for t in tr if t.metadata["expression"] not in held_exprs))
        leak_min = min(leak_min, min(dec.score(row(tr[0], user=h.prompt))[0] for h in ho))
    assert worst < 0.65 < DecontamConfig().threshold
    assert leak_min == pytest.approx(1.0)


# ---------------------------------------------------------------- mixing

def test_quotas_meet_shares_without_repeating_rows():
    assert quotas({"teacher": 100, "human": 5}, {"teacher": 0.8, "human": 0.2}) == {"teacher": 20, "human": 5}
    assert quotas({"teacher": 100, "human": 50}, {"teacher": 0.5, "human": 0.5}, limit=10) == \
        {"teacher": 5, "human": 5}
    assert quotas({"teacher": 10, "student": 3}, {"teacher": 1.0}) == {"teacher": 10, "student": 0}


def test_mix_caps_shares_weights_and_determinism(train):
    rows = [row(x, sample=s) for x in train[:10] for s in range(3)]                    # 30 teacher rows
    rows += [row(x, source="student", policy="student-r0", sample=s) for x in train[10:20] for s in range(2)]
    rows += [row(x, source="human", policy="human") for x in train[20:24]]
    cfg = MixConfig(max_per_task=2, source_weights={"teacher": 1.0, "human": 3.0, "student": 0.5})
    res = mix(rows, cfg)
    got = {r.trajectory_id: w for r, w in res.selected}
    assert sum(1 for r, _ in res.selected if r.source == "teacher") == 20
    assert sum(1 for v in res.left_out.values() if v == CAP_TASK) == 10
    assert {w for r, w in res.selected if r.source == "human"} == {3.0}
    # same rows in another order -> same selection; another seed -> another choice under the cap
    assert {r.trajectory_id for r, _ in mix(list(reversed(rows)), cfg).selected} == set(got)
    assert {r.trajectory_id for r, _ in mix(rows, cfg.model_copy(update={"seed": 5})).selected} != set(got)

    shares = mix(rows, MixConfig(max_per_task=None, source_ratios={"teacher": 0.5, "human": 0.25, "student": 0.25}))
    n = {s: sum(1 for r, _ in shares.selected if r.source == s) for s in ("teacher", "human", "student")}
    assert n == {"teacher": 8, "human": 4, "student": 4}
    assert sum(1 for v in shares.left_out.values() if v == SOURCE_SHARE) == 30 + 20 + 4 - 16

    unweighted = mix(rows, MixConfig(source_weights={"teacher": 1.0}, max_per_task=None, max_per_suite=7))
    assert len(unweighted.selected) == 7
    assert sum(1 for v in unweighted.left_out.values() if v == UNWEIGHTED) == 24
    assert sum(1 for v in unweighted.left_out.values() if v == CAP_SUITE) == 23


def test_mix_balances_difficulty(train):
    rows = [row(x) for x in train[:30]] + [row(x) for x in train[30:35]]  # 30 at difficulty 1, 5 at 2
    res = mix(rows, MixConfig(difficulty_ratios={1: 0.5, 2: 0.5}))
    assert sorted(r.difficulty for r, _ in res.selected) == [1] * 5 + [2] * 5


def test_config_hash_is_stable_and_sensitive():
    assert config_hash(CurateConfig()) == config_hash(CurateConfig.model_validate_json(CurateConfig().model_dump_json()))
    assert config_hash(CurateConfig()) != config_hash(CurateConfig(mix=MixConfig(seed=1)))


def test_config_rejects_bad_shares():
    with pytest.raises(ValueError, match="source_ratios"):
        CurateConfig(mix=MixConfig(source_ratios={"teacher": 0.0}))


# ---------------------------------------------------------------- curriculum

def test_pass_at_k_estimator():
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(1, 1, 4) is None


def test_choose_tasks_drops_zero_advantage_tasks_from_grpo():
    def rec(t, r, src, n, c):
        return PassRecord(t, "arithmetic", r, src, n, c, c / n, pass_at_k(n, c, 2))

    hist = [rec("a", 0, "teacher", 4, 4), rec("a", 1, "student", 4, 4), rec("a", 2, "student", 4, 4),  # mastered
            rec("b", 1, "student", 4, 0), rec("b", 2, "student", 4, 0),                                # hopeless
            rec("c", 1, "student", 4, 4), rec("c", 2, "student", 4, 1),                                # mixed
            rec("d", 0, "teacher", 4, 3)]                                                              # unseen
    plan = choose_tasks(hist, CurriculumConfig(), task_ids=["a", "b", "c", "d"])
    assert plan.grpo_tasks == ["c", "d"]
    assert plan.grpo_dropped == {"a": ALWAYS_PASSED, "b": ALWAYS_FAILED}
    assert plan.teacher_tasks == ["b", "c", "d"]
    windowed = choose_tasks(hist, CurriculumConfig(grpo_window=1), task_ids=["c"])
    assert windowed.grpo_tasks == ["c"]


def test_grpo_tasks_at_the_group_size():
    """A task with a group's worth of samples is judged by the chance that a group of G is mixed (pass@G - pass^G)."""
    assert group_signal(4, 2, 2) == pytest.approx(1 - 1 / 6 - 1 / 6)  # C(2,2)/C(4,2) all-pass, as many all-fail
    assert group_signal(8, 8, 4) == 0.0 and group_signal(8, 0, 4) == 0.0
    assert group_signal(2, 1, 4) is None  # fewer samples than a group: no estimate
    hist = [PassRecord("hi", "arithmetic", 1, "student", 8, 7, 7 / 8, None),     # 1 - 0 - C(7,4)/C(8,4) = 0.5
            PassRecord("mid", "arithmetic", 1, "student", 8, 4, 0.5, None),      # 1 - 1/70 - 1/70
            PassRecord("few", "arithmetic", 1, "student", 2, 1, 0.5, None),      # judged on its 2 samples: mixed
            PassRecord("all", "arithmetic", 1, "student", 8, 8, 1.0, None)]
    plan = choose_tasks(hist, CurriculumConfig(grpo_min_signal=0.6), group_size=4)
    assert plan.grpo_tasks == ["mid", "few"]
    assert plan.grpo_dropped == {"hi": LOW_SIGNAL, "all": ALWAYS_PASSED}
    assert plan.grpo_signal == {"hi": pytest.approx(0.5), "mid": pytest.approx(68 / 70)}
    assert plan.dropped_counts() == {ALWAYS_PASSED: 1, LOW_SIGNAL: 1}
    assert choose_tasks(hist, CurriculumConfig(), group_size=4).grpo_tasks == ["hi", "mid", "few"]


# ---------------------------------------------------------------- the whole curate on a real lake

def _seed_lake(root, train, heldout):
    """Round 0: teacher rows with planted faults. Returns {fault name: trajectory id}."""
    clean = [row(x, sample=0) for x in train[:40]]
    planted = {
        "exact": row(train[0], sample=1, call_id="other", arguments=json.dumps(
            {"code": f"print({train[0].metadata['expression']})"}, indent=1)),
        "near": row(train[1], sample=1, final=f"So the total is {train[1].verifier.answer}. "
                                              f"Answer: {train[1].verifier.answer}"),
        "contaminated": row(train[2], sample=1, user=heldout[5].prompt),
        "hack": row(train[3], sample=1, hack_flags=["answer_without_tool"]),
        "fail": row(train[4], sample=1, verdict="fail", final="Answer: 0"),
        "bad_json": row(train[5], sample=1, arguments="{'code': 'print(1)'}"),
        "heldout_eval": row(heldout[0], sample=0, source="student", policy="student-r0"),
    }
    student = [row(x, source="student", policy="student-r0", sample=0) for x in train[40:50]]
    w = write_trajectories(root, clean + list(planted.values()) + student)
    assert w.written == 40 + 7 + 10
    return clean + student, {k: v.trajectory_id for k, v in planted.items()}


def test_curate_end_to_end_counts_every_fault_and_manifest_answers_provenance(tmp_path, train, heldout):
    root = str(tmp_path / "lake")
    clean, planted = _seed_lake(root, train, heldout)
    cfg = CurateConfig(demo_paths=["data/demos/arithmetic_demos.jsonl"], mix=MixConfig(max_per_task=4))
    res = curate(root, cfg, run_id="run1", round=0, heldout_tasks=heldout)

    expected = {"exact": "dup_exact", "near": "dup_near", "contaminated": "contaminated", "hack": "hack_flags",
                "fail": "verdict_fail", "bad_json": "invalid_tool_call", "heldout_eval": "heldout_split"}
    assert {k: res.outcomes[v] for k, v in planted.items()} == expected
    assert all(res.outcomes[r.trajectory_id] == SELECTED for r in clean)          # nothing clean lost
    assert res.selected_by_source == {"human": 8, "student": 10, "teacher": 40}
    assert res.demos_written == 8 and res.demo_errors == []
    assert res.dropped_by_reason == {v: 1 for v in expected.values()}
    assert sum(c.n for c in res.counts) == res.n_candidates == 40 + 7 + 10 + 8
    assert {(c.source, c.verdict, c.outcome) for c in res.counts if c.outcome == "verdict_fail"} == \
        {("teacher", "fail", "verdict_fail")}

    con = connect(root)
    try:
        # which teacher (policy), round and task did every training example of the snapshot come from
        prov = con.execute(
            "SELECT m.trajectory_id, t.source, t.policy, t.round, t.task_id, m.weight FROM manifests m "
            "JOIN trajectories t USING (trajectory_id) WHERE m.snapshot_id = ? ORDER BY 1", [res.snapshot_id]
        ).fetchall()
        ds = con.execute("SELECT n_rows, config_hash, round, parent_snapshot_id FROM datasets "
                         "WHERE snapshot_id = ?", [res.snapshot_id]).fetchall()
    finally:
        con.close()
    assert len(prov) == res.n_selected == 58
    assert {p[1:3] for p in prov if p[1] == "teacher"} == {("teacher", "ref-teacher")}
    assert {(p[1], p[5]) for p in prov} == {("teacher", 1.0), ("student", 0.5), ("human", 2.0)}
    assert {p[4] for p in prov if p[1] == "teacher"} == {t.id for t in train[:40]}
    assert ds == [(58, config_hash(cfg), 0, None)]

    # SFT reads the snapshot back, rows and weights in manifest order
    back = read_snapshot(root, res.snapshot_id)
    manifest = pq.read_table(res.manifest_path).to_pylist()
    assert [(r.trajectory_id, w) for r, w in back] == [(m["trajectory_id"], m["weight"]) for m in manifest]
    assert manifest_rows(back) == [{k: v for k, v in m.items() if k != "snapshot_id"} for m in manifest]
    assert len(back) == 58 and all(res.outcomes[r.trajectory_id] == SELECTED for r, _ in back)
    with pytest.raises(SnapshotError, match="not in the datasets table"):
        read_snapshot(root, "no-such-snapshot")

    # deterministic: the same inputs give the same snapshot id (demo import is idempotent)
    again = curate(root, cfg, run_id="run1", round=0, heldout_tasks=heldout)
    assert again.snapshot_id == res.snapshot_id and again.demos_written == 0

    # round 1: new teacher rows, one an exact copy of a round-0 trained row, one new; earlier rows are not
    # selected again as new rows, human demos are reused; without replay that is all
    copy = row(train[6], round=1, sample=5, policy="ref-teacher")
    fresh = row(train[55], round=1, sample=0)
    write_trajectories(root, [copy, fresh])
    r1 = curate(root, cfg.model_copy(update={"replay_share": 0.0}), run_id="run1", round=1, heldout_tasks=heldout)
    assert r1.outcomes[copy.trajectory_id] == "dup_exact_earlier_snapshot"
    assert r1.outcomes[fresh.trajectory_id] == SELECTED
    assert r1.selected_by_source == {"human": 8, "teacher": 1} and r1.n_replayed == 0
    assert r1.dropped_by_reason["in_earlier_snapshot"] == 50
    assert r1.parent_snapshot_id == res.snapshot_id

    # with the default replay share (0.5), as many of the earlier snapshot's rows rejoin as there are new ones,
    # with their source weights, chosen in the seeded order; the rest stay out
    replay = curate(root, cfg, run_id="run1", round=1, heldout_tasks=heldout)
    assert cfg.replay_share == 0.5 and replay.n_replayed == 9
    replayed = [k for k, v in replay.outcomes.items() if v == "replayed"]
    assert len(replayed) == 9 and replay.dropped_by_reason["in_earlier_snapshot"] == 41
    assert set(replayed) <= {r.trajectory_id for r, _ in back if r.source != "human"}
    assert {r.trajectory_id: w for r, w in read_snapshot(root, replay.snapshot_id)}.keys() >= set(replayed)
    assert replay.n_selected == 9 + 9 and replay.manifest_hash != r1.manifest_hash


def test_the_same_rows_under_another_run_id_make_the_same_snapshot(tmp_path, train, heldout):
    """What enters a snapshot depends on the rows and the config, never on the run's id (which every trajectory id
    holds): two runs whose rows are the same episodes, written in another order, with a size cap that makes the mix
    choose and a near-duplicate pair that makes dedup choose, give the same manifest hash and the same examples in
    the same order, over two rounds with replay."""
    from warehouse.record import example_key

    def lake(run_id: str, reverse: bool) -> tuple[str, list]:
        root = str(tmp_path / run_id)
        rows = [row(x, run_id=run_id, sample=0) for x in train[:30]]
        rows.append(row(train[1], run_id=run_id, sample=7, final=f"So the total is {train[1].verifier.answer}. "
                                                               f"Answer: {train[1].verifier.answer}"))
        rows += [row(x, run_id=run_id, round=1, sample=0) for x in train[30:45]]
        write_trajectories(root, rows[::-1] if reverse else rows)
        cfg = CurateConfig(mix=MixConfig(max_examples=20))
        return root, [curate(root, cfg, run_id=run_id, round=r, heldout_tasks=heldout) for r in (0, 1)]

    (root_a, a), (root_b, b) = lake("run-a", False), lake("run-b", True)
    assert [x.manifest_hash for x in a] == [x.manifest_hash for x in b]
    assert a[0].dropped_by_reason == b[0].dropped_by_reason
    assert a[0].dropped_by_reason["max_examples"] == 10 and a[0].dropped_by_reason["dup_near"] == 1
    assert a[1].n_replayed == b[1].n_replayed > 0
    for x, y in zip(a, b):
        ka = [example_key(r) for r, _ in read_snapshot(root_a, x.snapshot_id)]
        kb = [example_key(r) for r, _ in read_snapshot(root_b, y.snapshot_id)]
        assert ka == kb and len(ka) == x.n_selected
    assert not {r.trajectory_id for r, _ in read_snapshot(root_a, a[0].snapshot_id)} & \
        {r.trajectory_id for r, _ in read_snapshot(root_b, b[0].snapshot_id)}
    from warehouse.query import query

    assert query(root_a, "SELECT manifest_hash FROM datasets ORDER BY round").to_pylist() == \
        [{"manifest_hash": x.manifest_hash} for x in a]


def test_curriculum_from_lake(tmp_path, train):
    root = str(tmp_path / "lake")
    rows = []
    for r in (1, 2):
        for s in range(4):
            rows.append(row(train[0], round=r, source="student", policy="st", sample=s))            # always passes
            rows.append(row(train[1], round=r, source="student", policy="st", sample=s, verdict="fail"))
            rows.append(row(train[2], round=r, source="student", policy="st", sample=s,
                            verdict="pass" if s < 2 else "fail"))
    rows.append(row(train[3], round=0, sample=0))
    rows.append(row(train[1], round=2, source="student", policy="st", sample=9, verdict="infra_error"))
    write_trajectories(root, rows)
    plan = plan_curriculum(root, CurriculumConfig(k=2), run_id="run1", task_ids=[t.id for t in train[:4]])
    assert plan.grpo_tasks == [train[2].id, train[3].id]
    assert plan.grpo_dropped == {train[0].id: ALWAYS_PASSED, train[1].id: ALWAYS_FAILED}
    assert plan.teacher_tasks == [train[1].id, train[3].id]
    rec = next(h for h in plan.history if h.task_id == train[2].id and h.round == 2)
    assert (rec.n, rec.successes, rec.pass_at_k) == (4, 2, pytest.approx(1 - 1 / 6))
    assert next(h for h in plan.history if h.task_id == train[1].id and h.round == 2).n == 4  # infra_error ignored


def test_curate_on_an_empty_run_writes_an_empty_snapshot(tmp_path, heldout):
    root = str(tmp_path / "lake")
    res = curate(root, CurateConfig(), run_id="empty", round=0, heldout_tasks=heldout)
    assert (res.n_candidates, res.n_selected, res.counts) == (0, 0, [])
    con = connect(root)
    try:
        assert con.execute("SELECT n_rows FROM datasets WHERE snapshot_id = ?", [res.snapshot_id]).fetchall() == \
            [(0,)]
    finally:
        con.close()


def _harbor_row(task, *, sample=0, final="Done.", user=None) -> Trajectory:
    """An episode of a Harbor task shaped like the reference teacher's: its one shell call, an empty output, a close."""
    cid = f"call_{sample}"
    args = json.dumps(task.reference.steps[0].arguments)
    msgs = [Message(role="system", content=SYSTEM), Message(role="user", content=user or task.prompt),
            Message(role="assistant", content=None,
                    tool_calls=[ToolCall(id=cid, function=FunctionCall(name="shell", arguments=args))]),
            Message(role="tool", content="", tool_call_id=cid, name="shell"),
            Message(role="assistant", content=final)]
    return Trajectory(
        trajectory_id=trajectory_id("run1", 0, task.id, "ref", sample), run_id="run1", round=0, source="teacher",
        policy="ref", sample_index=sample, task_id=task.id, suite=task.suite, split="train",
        task_version=task.version, difficulty=1, verifier="harbor", verifier_version="2", messages=msgs,
        tools_json="[]", reward=1.0, success=True, verdict="pass", turns=2, n_tool_calls=1)


def test_harbor_tasks_of_one_template_are_distinct_problems_but_a_resample_or_a_leak_is_not(tmp_path):
    """The ledger suite's instructions are one template and its reference call is one program: two tasks whose
    instructions name the same folder and output (their data differ) are two problems, kept; a second episode of one
    task is a near-duplicate; decontamination keeps every train task against the held-out ones (new names) and
    drops a train row that carries a held-out instruction."""
    from tasks.factory.draft import write_folder
    from tasks.factory.ledger import ledger_suite_drafts
    from tasks.harbor import load_harbor

    def tasks(split: str, n: int) -> list:
        for d in ledger_suite_drafts(n, split=split, seed=0):
            write_folder(d, tmp_path / split / d.name)
        return load_harbor(tmp_path / split)

    train, held = tasks("train", 120), tasks("heldout", 20)
    paths = {}
    twins = next((paths[k], t) for t in train
                 if (k := (t.reference.steps[0].arguments["command"].split('"')[1], t.prompt.split("`")[-2]))
                 in paths or paths.setdefault(k, t) is None)
    assert twins[0].prompt != twins[1].prompt  # the same folder and output, another problem
    clean = [_harbor_row(t) for t in train]
    again = _harbor_row(twins[1], sample=1, final="Done: the output file is written.")
    kept, dropped, dup_of = dedup_rows(clean + [again], DedupConfig())
    assert dropped == {again.trajectory_id: DUP_NEAR} and dup_of[again.trajectory_id] == clean[
        train.index(twins[1])].trajectory_id
    leak = _harbor_row(train[0], sample=2, user=held[0].prompt)
    kept, dropped, by = decontaminate(clean + [leak], held, DecontamConfig())
    assert dropped == {leak.trajectory_id: CONTAMINATED} and by[leak.trajectory_id] == held[0].id
