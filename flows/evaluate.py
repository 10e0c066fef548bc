"""Prefect flow `evaluate`: score a model on the held-out split of the schedule's suites; and the scoring stages of
the flywheel's rounds (`stage_baseline` in round 0, `stage_control` and `stage_student` after each round's
training).

In a round with GRPO, `stage_control` scores the SFT and the GRPO checkpoint alike and applies the promotion rule
(training.evaluate.choose_promotion, `[flywheel] promote`). Wiring only: a model runs as a TransformersPolicy
through the one rollout-to-lake path (flows/rollouts.py: slots, sandboxes, [rollout] knobs, rows in the lake), and
the one scorer (warehouse/score.py, through flows.stages.score_rows) puts pass@1 and pass@k per suite into the
rounds table. Every task here retries only on transient infrastructure errors (`ENDPOINT_RETRIES`); a retry
skips the rows already written.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from prefect.artifacts import create_table_artifact

from flows.concurrency import ENDPOINT_RETRIES
from flows.config import FlywheelConfig
from flows.rollouts import (
    build_teacher,
    heldout_tasks,
    rollout_backend,
    rollout_rows,
    schedule_train_tasks,
    student_policy,
    teacher_configs,
)
from flows.stages import StageTimer, metric, score_rows


@task(name="score-base-and-teacher", **ENDPOINT_RETRIES)
def stage_baseline(cfg: FlywheelConfig, run_id: str, base_path: str) -> dict[str, Any]:
    """Held-out pass@1 of the base student and of the teacher, round 0."""
    from warehouse.lake import write_rows

    timer = StageTimer()
    heldout = heldout_tasks(cfg)
    score = {"run_id": run_id, "round": 0, "stage": "eval", "split": "heldout"}
    with rollout_backend(cfg, []) as backend:
        base = student_policy(cfg, base_path, "base", temperature=0.0)
        rows = rollout_rows(cfg, heldout, base, run_id=run_id, round=0, samples=1, backend=backend)
        metrics = score_rows(rows, subject="base", **score)
    with rollout_backend(cfg, teacher_configs(cfg)) as backend:
        rows = rollout_rows(cfg, heldout, build_teacher(cfg), run_id=run_id, round=0, samples=1,
                            backend=backend)
        metrics += score_rows(rows, subject="teacher", **score)
    metrics.append(metric(run_id, 0, "baseline", "stage", "-", "all", "wall_s", timer.s))
    write_rows(cfg.run.out, "rounds", metrics)
    return {"wall_s": timer.s, "metrics": len(metrics)}


def heldout_scores(cfg: FlywheelConfig, path: str, name: str, *, run_id: str, round: int, subject: str,
                   backend: Any, sampled: bool) -> list[dict[str, Any]]:
    """Rounds-table rows of a checkpoint on every held-out task: greedy pass@1 (policy `name`); with `sampled`,
    flywheel.pass_k episodes per task at flywheel.sample_temperature (policy `name-tT`): their mean pass rate as
    `sampled_pass@1` (with `sampled_episodes`) and, for pass_k > 1, pass@k."""
    fw = cfg.flywheel
    heldout = heldout_tasks(cfg)
    score = {"run_id": run_id, "round": round, "subject": subject, "stage": "eval", "split": "heldout"}
    greedy = student_policy(cfg, path, name, temperature=0.0)
    rows = rollout_rows(cfg, heldout, greedy, run_id=run_id, round=round, samples=1, backend=backend)
    metrics = score_rows(rows, **score)
    if sampled:
        policy = student_policy(cfg, path, f"{name}-t{fw.sample_temperature:g}", temperature=fw.sample_temperature,
                                seed=round)
        rows = rollout_rows(cfg, heldout, policy, run_id=run_id, round=round, samples=fw.pass_k, backend=backend)
        metrics += [{**m, "metric": "sampled_" + m["metric"]} for m in score_rows(rows, **score)]
        if fw.pass_k > 1:
            metrics += [m for m in score_rows(rows, k=fw.pass_k, **score) if m["metric"] != "episodes"]
    return metrics


@task(name="sft-vs-grpo", **ENDPOINT_RETRIES)
def stage_control(cfg: FlywheelConfig, run_id: str, round: int, sft: dict[str, Any], grpo: dict[str, Any]
                  ) -> dict[str, Any]:
    """The SFT-only control of a round with GRPO: both checkpoints scored on the held-out split (greedy pass@1,
    sampled pass@1 over flywheel.pass_k samples, pass@k), then flywheel.promote picks the one that goes on
    (training.evaluate.choose_promotion). The scores (subjects sft, grpo), the gain, its standard error and the
    choice land in the rounds table; the reason is logged and returned (the ledger keeps it)."""
    from prefect import get_run_logger

    from training.evaluate import choose_promotion
    from warehouse.lake import write_rows

    timer = StageTimer()
    fw = cfg.flywheel
    metrics: list[dict[str, Any]] = []
    with rollout_backend(cfg, []) as backend:
        for subject, ck in (("sft", sft), ("grpo", grpo)):
            metrics += heldout_scores(cfg, ck["path"], f"student-r{round}-{subject}", run_id=run_id, round=round,
                                      subject=subject, backend=backend, sampled=True)

    def value(subject: str, name: str) -> float:
        return next(m["value"] for m in metrics if m["subject"] == subject and m["suite"] == "all"
                    and m["metric"] == name)

    p = choose_promotion(fw.promote, fw.promote_margin, sft_greedy=value("sft", "pass@1"),
                         grpo_greedy=value("grpo", "pass@1"), sft_sampled=value("sft", "sampled_pass@1"),
                         grpo_sampled=value("grpo", "sampled_pass@1"), sft_n=int(value("sft", "sampled_episodes")),
                         grpo_n=int(value("grpo", "sampled_episodes")), greedy_margin=fw.promote_greedy_margin)
    get_run_logger().info("round %d promotes %s (%s): %s", round, p.choice, p.code, p.reason)

    def m(name: str, v: float) -> dict[str, Any]:
        return metric(run_id, round, "promote", "promotion", "heldout", "all", name, v)

    rows = [m("grpo_gain_sampled_pass@1", p.gain_sampled), m("grpo_gain_sampled_se", p.gain_sampled_se),
            m("grpo_gain_pass@1", p.gain_greedy), m("promoted_grpo", float(p.choice == "grpo")),
            m("promote_margin", fw.promote_margin), m("promote_greedy_margin", fw.promote_greedy_margin),
            m(f"reason:{p.code}", 1.0),
            metric(run_id, round, "control", "stage", "-", "all", "wall_s", timer.s)]
    write_rows(cfg.run.out, "rounds", metrics + rows)
    chosen = grpo if p.choice == "grpo" else sft
    return {"promoted": p.choice, "code": p.code, "reason": p.reason, "checkpoint_id": chosen["checkpoint_id"],
            "path": chosen["path"], "wall_s": timer.s,
            "student_metrics": [{k: r[k] for k in ("stage", "split", "suite", "metric", "value")}
                                for r in metrics if r["subject"] == p.choice]}


@task(name="student-rollouts", **ENDPOINT_RETRIES)
def stage_student(cfg: FlywheelConfig, run_id: str, round: int, student: dict[str, Any],
                  scored: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Score the new student on every suite's held-out split (greedy pass@1, sampled pass@1 and pass@k); roll it
    out on the train tasks (next round's data). `scored`: the student's held-out scores already measured (the
    control stage scored the promoted checkpoint): recorded as the student's instead of scoring it again."""
    from warehouse.lake import write_rows

    timer = StageTimer()
    fw = cfg.flywheel
    train = schedule_train_tasks(cfg, lambda from_round: from_round <= round)[: fw.student_train_tasks]
    name = f"student-r{round}"
    with rollout_backend(cfg, []) as backend:
        if scored is not None:
            metrics = [metric(run_id, round, r["stage"], "student", r["split"], r["suite"], r["metric"], r["value"])
                       for r in scored]
        else:
            metrics = heldout_scores(cfg, student["path"], name, run_id=run_id, round=round, subject="student",
                                     backend=backend, sampled=fw.pass_k > 1)
        if fw.student_train_samples > 0 and round < fw.rounds:
            explore = student_policy(cfg, student["path"], f"{name}-train", temperature=fw.sample_temperature,
                                     seed=1000 + round)
            rows = rollout_rows(cfg, train, explore, run_id=run_id, round=round,
                                samples=fw.student_train_samples, backend=backend)
            metrics += score_rows(rows, stage="student", split="train", run_id=run_id, round=round,
                                  subject="student")
    metrics.append(metric(run_id, round, "student", "stage", "-", "all", "wall_s", timer.s))
    write_rows(cfg.run.out, "rounds", metrics)
    return {"wall_s": timer.s}


@task(name="evaluate", **ENDPOINT_RETRIES)
def evaluate_task(cfg: FlywheelConfig, model: str, run_id: str, round: int, name: str) -> list[dict[str, Any]]:
    """Greedy held-out pass@1 of `model` per suite; the rows and the scores land in the lake."""
    from warehouse.lake import write_rows

    with rollout_backend(cfg, []) as backend:
        rows = rollout_rows(cfg, heldout_tasks(cfg), student_policy(cfg, model, name, temperature=0.0),
                            run_id=run_id, round=round, samples=1, backend=backend)
    metrics = score_rows(rows, run_id=run_id, round=round, stage="eval", subject="eval", split="heldout")
    write_rows(cfg.run.out, "rounds", metrics)
    return [m for m in metrics if m["metric"].startswith("pass@")]


@flow(name="evaluate", log_prints=True)
def evaluate_flow(cfg: FlywheelConfig, model: str, run_id: str = "eval", round: int = 0,
                  name: str = "eval", overrides: list[str] | None = None) -> list[dict[str, Any]]:
    """Held-out pass@1 of `model` (a folder or hub id) on every suite of cfg.flywheel.suites.

    Args:
        cfg: The config (lake root, suites, sandbox); a deployment fills it with the served config.
        model: The model to score: a folder or a hub id.
        run_id: The run id its score rows are recorded under.
        round: The round its score rows are recorded under.
        name: The policy name on its rows.
        overrides: Config keys as section.key=value (e.g. rollout.concurrency=4), laid over the served config.
    """
    from flows.serve import run_config_of

    cfg = run_config_of(cfg, "evaluate", {}, overrides)
    scores = evaluate_task(cfg=cfg, model=model, run_id=run_id, round=round, name=name)
    create_table_artifact(key="evaluate-scores", table=[{"suite": m["suite"], "pass@1": m["value"]}
                                                        for m in scores], description=f"held-out pass@1 of {model}")
    return scores
