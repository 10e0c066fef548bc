"""Curriculum: pass@k history per task across rounds, and the next round's teacher and GRPO tasks.

History comes from the lake's trajectories view (train split, rollouts only -- not GRPO's own episodes --, scored
verdicts only: an infra_error says nothing about the model), per task, round and source. The next round's teacher
tasks are those the student fails (its success rate in the latest round it attempted the task is below a
threshold, or it never attempted it); GRPO tasks are those whose student outcomes were mixed, since a task always
passed or always failed gives every sample the same reward and so zero advantage. At the GRPO group size G
(`group_size`), a task with at least G scored samples is judged by the chance that a group of G of its samples
has mixed rewards, estimated without bias as pass@G - pass^G (`group_signal`), and left out below
cfg.grpo_min_signal (LOW_SIGNAL); a task with fewer samples is judged on the ones it has. GRPO leaves out tasks whose
latest `flywheel tasks audit` row is unhealthy by cfg.verifier_health (grpo_dropped: "unhealthy_verifier:
REASON"), since a broken verifier's reward teaches the wrong thing. This module writes nothing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from math import comb

from curate.config import CurriculumConfig
from curate.health import UNHEALTHY_VERIFIER, latest_by_task
from warehouse.record import SCORED_VERDICTS
from warehouse.score import pass_at_k  # the one scorer

ALWAYS_PASSED = "always_passed"
ALWAYS_FAILED = "always_failed"
LOW_SIGNAL = "low_group_signal"
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
    grpo_signal: dict[str, float] = field(default_factory=dict)
    history: list[PassRecord] = field(default_factory=list)

    def dropped_counts(self) -> dict[str, int]:
        """How many tasks GRPO left out, per reason (an unhealthy verifier's reasons counted together)."""
        out: dict[str, int] = defaultdict(int)
        for why in self.grpo_dropped.values():
            out[why.split(":", 1)[0]] += 1
        return dict(sorted(out.items()))


def group_signal(n: int, c: int, g: int) -> float | None:
    """The chance that a group of g samples of a task has mixed outcomes (some pass, some fail), so non-zero
    advantage, estimated without bias from n samples with c passes: pass@g - pass^g; None when n < g."""
    at_least_one = pass_at_k(n, c, g)
    if at_least_one is None:
        return None
    return at_least_one - comb(c, g) / comb(n, g)


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


def choose_tasks(history: list[PassRecord], cfg: CurriculumConfig, task_ids: list[str] | None = None,
                 group_size: int | None = None) -> CurriculumPlan:
    """Pick teacher and GRPO tasks from a history; task_ids (the train tasks, in order) default to those seen;
    group_size: GRPO's group size G (tasks with >= G samples are judged by group_signal)."""
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
            signal = group_signal(n, c, group_size) if group_size else None
            if signal is not None:
                plan.grpo_signal[tid] = signal
            if signal is not None and signal < cfg.grpo_min_signal:
                plan.grpo_dropped[tid] = LOW_SIGNAL
            else:
                plan.grpo_tasks.append(tid)
    return plan


def plan_curriculum(root: str, cfg: CurriculumConfig, *, run_id: str, upto_round: int | None = None,
                    task_ids: list[str] | None = None, group_size: int | None = None) -> CurriculumPlan:
    """The next round's teacher and GRPO tasks from the run's history up to upto_round (all rounds: None), GRPO's
    without the tasks whose verifier is unhealthy; group_size: GRPO's (see choose_tasks)."""
    plan = choose_tasks(pass_history(root, run_id=run_id, k=cfg.k, upto_round=upto_round), cfg, task_ids,
                        group_size)
    if cfg.verifier_health.enabled and plan.grpo_tasks:
        health = latest_by_task(root, plan.grpo_tasks, cfg.verifier_health)
        for tid in list(plan.grpo_tasks):
            why = health.get(tid, "never audited (verifier_health.require_audit)"
                             if cfg.verifier_health.require_audit else None)
            if why is not None:
                plan.grpo_tasks.remove(tid)
                plan.grpo_dropped[tid] = f"{UNHEALTHY_VERIFIER}: {why}"
    return plan
