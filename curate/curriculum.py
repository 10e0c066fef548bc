"""Curriculum: pass@k history per task across rounds, and the next round's teacher and GRPO tasks.

History comes from the lake's trajectories view (train split, rollouts only -- not GRPO's own episodes --, scored
verdicts only: an infra_error says nothing about the model), per task, round and source. The next round's teacher
tasks are those the student fails (its success rate in the latest round it attempted the task is below a
threshold, or it never attempted it); GRPO tasks are those whose student outcomes were mixed, since a task always
passed or always failed gives every sample the same reward and so zero advantage; and GRPO leaves out tasks whose
latest `flywheel tasks audit` row is unhealthy by cfg.verifier_health (grpo_dropped: "unhealthy_verifier:
REASON"), since a broken verifier's reward teaches the wrong thing. This module writes nothing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from curate.config import CurriculumConfig
from curate.health import UNHEALTHY_VERIFIER, latest_by_task
from warehouse.record import SCORED_VERDICTS
from warehouse.score import pass_at_k  # the one scorer

ALWAYS_PASSED = "always_passed"
ALWAYS_FAILED = "always_failed"
UNSEEN = "unseen"


@dataclass(frozen=True)
class PassRecord:
    task_id: str
    suite: str
    round: int
    source: str
    n: int
    successes: int
    pass_at_1: float
    pass_at_k: float | None


@dataclass
class CurriculumPlan:
    """Next round's tasks, why the others were left out of GRPO, and the history they were chosen from."""

    teacher_tasks: list[str] = field(default_factory=list)
    grpo_tasks: list[str] = field(default_factory=list)
    grpo_dropped: dict[str, str] = field(default_factory=dict)
    history: list[PassRecord] = field(default_factory=list)


def pass_history(root: str, *, run_id: str, k: int = 4, upto_round: int | None = None) -> list[PassRecord]:
    """pass@1 and pass@k per (task, round, source) of the run's train-split rows, sorted."""
    from warehouse.query import connect

    con = connect(root)
    try:
        sql = (
            "SELECT task_id, suite, CAST(round AS INTEGER) AS round, source, COUNT(*) AS n, "
            "SUM(CASE WHEN verdict = 'pass' THEN 1 ELSE 0 END) AS c FROM trajectories "
            "WHERE run_id = ? AND split = 'train' AND list_contains(?::VARCHAR[], verdict) "
            "AND coalesce(stage, 'rollout') = 'rollout'"
            + (" AND CAST(round AS INTEGER) <= ?" if upto_round is not None else "")
            + " GROUP BY ALL ORDER BY task_id, round, source"
        )
        params: list[object] = [run_id, list(SCORED_VERDICTS)] + ([upto_round] if upto_round is not None else [])
        rows = con.execute(sql, params).fetchall()
    finally:
        con.close()
    return [PassRecord(t, s, int(r), src, int(n), int(c), pass_at_k(int(n), int(c), 1),
                       pass_at_k(int(n), int(c), k)) for t, s, r, src, n, c in rows]


def choose_tasks(history: list[PassRecord], cfg: CurriculumConfig,
                 task_ids: list[str] | None = None) -> CurriculumPlan:
    """Pick teacher and GRPO tasks from a history; task_ids (the train tasks, in order) default to those seen."""
    student: dict[str, list[PassRecord]] = defaultdict(list)
    seen: list[str] = []
    for rec in history:
        if rec.task_id not in seen:
            seen.append(rec.task_id)
        if rec.source == "student":
            student[rec.task_id].append(rec)
    universe = list(dict.fromkeys(task_ids)) if task_ids is not None else seen
    plan = CurriculumPlan(history=list(history))
    for tid in universe:
        recs = sorted(student.get(tid, []), key=lambda r: r.round)
        if not recs:
            if cfg.unseen_to_teacher:
                plan.teacher_tasks.append(tid)
            if cfg.unseen_to_grpo:
                plan.grpo_tasks.append(tid)
            else:
                plan.grpo_dropped[tid] = UNSEEN
            continue
        if recs[-1].pass_at_1 < cfg.teacher_below:
            plan.teacher_tasks.append(tid)
        rounds = sorted({r.round for r in recs})
        if cfg.grpo_window is not None:
            keep = set(rounds[-cfg.grpo_window :])
            recs = [r for r in recs if r.round in keep]
        n, c = sum(r.n for r in recs), sum(r.successes for r in recs)
        if c == n:
            plan.grpo_dropped[tid] = ALWAYS_PASSED
        elif c == 0:
            plan.grpo_dropped[tid] = ALWAYS_FAILED
        else:
            plan.grpo_tasks.append(tid)
    return plan


def plan_curriculum(root: str, cfg: CurriculumConfig, *, run_id: str, upto_round: int | None = None,
                    task_ids: list[str] | None = None) -> CurriculumPlan:
    """The next round's teacher and GRPO tasks from the run's history up to upto_round (all rounds: None), GRPO's
    without the tasks whose verifier is unhealthy."""
    plan = choose_tasks(pass_history(root, run_id=run_id, k=cfg.k, upto_round=upto_round), cfg, task_ids)
    if cfg.verifier_health.enabled and plan.grpo_tasks:
        health = latest_by_task(root, plan.grpo_tasks, cfg.verifier_health)
        for tid in list(plan.grpo_tasks):
            why = health.get(tid, "never audited (verifier_health.require_audit)"
                             if cfg.verifier_health.require_audit else None)
            if why is not None:
                plan.grpo_tasks.remove(tid)
                plan.grpo_dropped[tid] = f"{UNHEALTHY_VERIFIER}: {why}"
    return plan
