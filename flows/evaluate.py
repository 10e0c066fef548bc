"""Prefect flow `evaluate`: score a model on the held-out split of the schedule's suites; and the scoring stages of
the flywheel's rounds (`stage_baseline` in round 0, `stage_control` and `stage_student` after each round's
training).

`stage_control` scores the round's checkpoints (SFT's, and GRPO's when it ran), picks the candidate between them
(training.promotion.choose_promotion, `[flywheel] promote`) and holds it against the incumbent
(training.promotion.against_incumbent, `[flywheel] incumbent_z`). Wiring only: a model runs as a TransformersPolicy
through the one scoring path (training/scoring.py, which the benchmarks share) with the one rollout-to-lake path
as its episode runner (flows/rollouts.py: slots, sandboxes, [rollout] knobs, rows in the lake), and the one scorer
(warehouse/score.py) puts pass@1 and pass@k per suite into the rounds table (flows.stages.suite_rows). Every task
here retries only on transient infrastructure errors (`ENDPOINT_RETRIES`); a retry skips the rows already written.
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
    synthesized_tasks,
    teacher_configs,
)
from flows.stages import StageTimer, checkpoint_rows, metric, score_rows, suite_rows
from training.scoring import EpisodeRunner, Sampling, score_checkpoint, score_policy, student_policy


def lake_runner(cfg: FlywheelConfig, backend: Any, *, run_id: str, round: int) -> EpisodeRunner:
    """training.scoring's episode runner for a stage: the one rollout-to-lake path (rows written to the lake, an
    earlier attempt's read back)."""
    return lambda tasks, policy, samples: rollout_rows(cfg, tasks, policy, run_id=run_id, round=round,
                                                       samples=samples, backend=backend)


@task(name="score-base-and-teacher", **ENDPOINT_RETRIES)
def stage_baseline(cfg: FlywheelConfig, run_id: str, base_path: str) -> dict[str, Any]:
    """Held-out pass@1 of the base student and of the teacher, round 0."""
    from warehouse.lake import write_rows

    timer = StageTimer()
    heldout = heldout_tasks(cfg)
    score = {"run_id": run_id, "round": 0, "stage": "eval", "split": "heldout"}
    with rollout_backend(cfg, []) as backend:
        base = score_policy(student_policy(cfg.student, base_path, "base", temperature=0.0), heldout,
                            run=lake_runner(cfg, backend, run_id=run_id, round=0))
        metrics = suite_rows(base.scores, subject="base", **score)
    with rollout_backend(cfg, teacher_configs(cfg)) as backend:
        teacher = score_policy(build_teacher(cfg), heldout, run=lake_runner(cfg, backend, run_id=run_id, round=0))
        metrics += suite_rows(teacher.scores, subject="teacher", **score)
    metrics.append(metric(run_id, 0, "baseline", "stage", "-", "all", "wall_s", timer.s))
    write_rows(cfg.run.out, "rounds", metrics)
    return {"wall_s": timer.s, "metrics": len(metrics)}


def heldout_scores(cfg: FlywheelConfig, path: str, name: str, *, run_id: str, round: int, subject: str,
                   backend: Any, sampled: bool) -> list[dict[str, Any]]:
    """Rounds-table rows of a checkpoint on every held-out task (training.scoring.score_checkpoint): greedy pass@1
    (policy `name`); with `sampled`, flywheel.pass_k episodes per task at flywheel.sample_temperature with the
    round as seed (policy `name-tT`): their mean pass rate as `sampled_pass@1` (with `sampled_episodes`) and, for
    pass_k > 1, pass@k."""
    fw = cfg.flywheel
    score = {"run_id": run_id, "round": round, "subject": subject, "stage": "eval", "split": "heldout"}
    sampling = Sampling(k=fw.pass_k, temperature=fw.sample_temperature, seed=round) if sampled else None
    res = score_checkpoint(path, heldout_tasks(cfg), student=cfg.student, name=name, sampling=sampling,
                           run=lake_runner(cfg, backend, run_id=run_id, round=round))
    return checkpoint_rows(res, **score)


def incumbent_metrics(cfg: FlywheelConfig, run_id: str, incumbent: dict[str, Any]) -> list[dict[str, Any]]:
    """The incumbent's held-out score rows (stage, split, suite, metric, value) from the rounds table: those of the
    round and subject it was scored as (`scored_round`, `scored_subject`: round 0's base, or an earlier round's
    student), the latest row of each metric."""
    from warehouse.query import query

    return query(cfg.run.out, """
        SELECT stage, split, suite, metric, arg_max(value, created_at) AS value FROM rounds
        WHERE run_id = ? AND CAST(round AS INTEGER) = ? AND subject = ? AND split = 'heldout'
        GROUP BY ALL ORDER BY suite, metric""",
                 [run_id, int(incumbent.get("scored_round", 0)), incumbent.get("scored_subject", "base")]).to_pylist()


@task(name="promotion", **ENDPOINT_RETRIES)
def stage_control(cfg: FlywheelConfig, run_id: str, round: int, sft: dict[str, Any] | None,
                  grpo: dict[str, Any] | None, incumbent: dict[str, Any]) -> dict[str, Any]:
    """The round's promotion. Scores the round's checkpoints on the held-out split (greedy pass@1; sampled pass@1
    over flywheel.pass_k samples and pass@k when GRPO ran or pass_k > 1). With GRPO, the SFT-only control:
    flywheel.promote picks the candidate between SFT's and GRPO's checkpoints (training.promotion.choose_promotion;
    the gain, its standard error and the choice land in the rounds table). Then the candidate is held against the
    incumbent (`incumbent`: the student the round started from, with `scored_round` / `scored_subject` naming its
    held-out scores in the rounds table) by training.promotion.against_incumbent: the decision, its reason code and
    the per-suite deltas with their standard errors land in the rounds table (subject 'promotion', metrics
    incumbent_*), the reason in the log and the returned record (the ledger keeps it). Returns the checkpoint that
    goes on (`promoted`: 'sft', 'grpo' or 'incumbent') with its held-out metrics. `sft` None: the round trained
    no candidate (its snapshot was empty): the incumbent stays, code no_candidate."""
    from prefect import get_run_logger

    from training.promotion import HeldoutScores, against_incumbent, choose_promotion, no_candidate
    from warehouse.lake import write_rows

    timer = StageTimer()
    fw = cfg.flywheel
    logger = get_run_logger()
    metrics: list[dict[str, Any]] = []
    sampled = grpo is not None or fw.pass_k > 1
    candidates = ([("sft", sft)] if sft is not None else []) + ([("grpo", grpo)] if grpo is not None else [])
    with rollout_backend(cfg, []) as backend:
        for subject, ck in candidates:
            metrics += heldout_scores(cfg, ck["path"], f"student-r{round}-{subject}", run_id=run_id, round=round,
                                      subject=subject, backend=backend, sampled=sampled)

    def value(subject: str, name: str) -> float:
        return next(m["value"] for m in metrics if m["subject"] == subject and m["suite"] == "all"
                    and m["metric"] == name)

    def m(name: str, v: float, suite: str = "all") -> dict[str, Any]:
        return metric(run_id, round, "promote", "promotion", "heldout", suite, name, v)

    rows: list[dict[str, Any]] = []
    choice, out = "sft", {}
    if grpo is not None:
        p = choose_promotion(fw.promote, fw.promote_margin, sft_greedy=value("sft", "pass@1"),
                             grpo_greedy=value("grpo", "pass@1"), sft_sampled=value("sft", "sampled_pass@1"),
                             grpo_sampled=value("grpo", "sampled_pass@1"),
                             sft_n=int(value("sft", "sampled_episodes")),
                             grpo_n=int(value("grpo", "sampled_episodes")), greedy_margin=fw.promote_greedy_margin)
        logger.info("round %d candidate %s (%s): %s", round, p.choice, p.code, p.reason)
        choice, out = p.choice, {"code": p.code, "reason": p.reason}
        rows += [m("grpo_gain_sampled_pass@1", p.gain_sampled), m("grpo_gain_sampled_se", p.gain_sampled_se),
                 m("grpo_gain_pass@1", p.gain_greedy), m("promoted_grpo", float(p.choice == "grpo")),
                 m("promote_margin", fw.promote_margin), m("promote_greedy_margin", fw.promote_greedy_margin),
                 m(f"reason:{p.code}", 1.0)]
    chosen = grpo if choice == "grpo" else sft
    cand_rows = [r for r in metrics if r["subject"] == choice]
    inc_rows = incumbent_metrics(cfg, run_id, incumbent)
    if chosen is None:
        d = no_candidate(f"round {round}'s snapshot holds no example")
        out = {"code": d.code, "reason": d.reason}
        logger.warning("round %d %s: %s (%s)", round, d.code, d.reason, incumbent.get("checkpoint_id"))
    else:
        d = against_incumbent(HeldoutScores.from_metrics(cand_rows), HeldoutScores.from_metrics(inc_rows),
                              z=fw.incumbent_z)
        (logger.info if d.promoted else logger.warning)(
            "round %d %s: %s's checkpoint %s %s the incumbent %s: %s", round, d.code, choice,
            chosen["checkpoint_id"], "replaces" if d.promoted else "does NOT replace",
            incumbent.get("checkpoint_id"), d.reason)
    rows += [m("incumbent_promoted", float(d.promoted)), m("incumbent_z", fw.incumbent_z),
             m(f"incumbent_reason:{d.code}", 1.0)]
    for delta in d.deltas:
        rows += [m("incumbent_delta_pass@1", delta.greedy_delta, delta.suite),
                 m("incumbent_delta_se", delta.greedy_se, delta.suite),
                 m("incumbent_worse", float(delta.worse), delta.suite)]
        if delta.sampled_delta is not None:
            rows += [m("incumbent_delta_sampled_pass@1", delta.sampled_delta, delta.suite),
                     m("incumbent_delta_sampled_se", delta.sampled_se or 0.0, delta.suite)]
    rows.append(metric(run_id, round, "control", "stage", "-", "all", "wall_s", timer.s))
    write_rows(cfg.run.out, "rounds", metrics + rows)
    keys = ("stage", "split", "suite", "metric", "value")
    if d.promoted and chosen is not None:
        goes_on, promoted, scored = chosen, choice, [{k: r[k] for k in keys} for r in cand_rows]
    else:
        goes_on, promoted, scored = incumbent, "incumbent", [{k: r[k] for k in keys} for r in inc_rows]
    return {"promoted": promoted, "candidate": choice if chosen is not None else None,
            "candidate_checkpoint_id": chosen["checkpoint_id"] if chosen is not None else None,
            "code": out.get("code", "sft_only"), "reason": out.get("reason", "no GRPO checkpoint: SFT's is the "
                                                                           "candidate"),
            "incumbent_code": d.code, "incumbent_reason": d.reason,
            "deltas": [x.model_dump() for x in d.deltas], "checkpoint_id": goes_on.get("checkpoint_id"),
            "path": goes_on["path"], "wall_s": timer.s, "student_metrics": scored}


@task(name="student-rollouts", **ENDPOINT_RETRIES)
def stage_student(cfg: FlywheelConfig, run_id: str, round: int, student: dict[str, Any],
                  scored: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Score the new student on every suite's held-out split (greedy pass@1, sampled pass@1 and pass@k); roll it
    out on the train tasks (next round's data). `scored`: the student's held-out scores already measured (the
    control stage scored the promoted checkpoint): recorded as the student's instead of scoring it again."""
    from warehouse.lake import write_rows

    timer = StageTimer()
    fw = cfg.flywheel
    name = f"student-r{round}"
    with rollout_backend(cfg, []) as backend:
        if scored is not None:
            metrics = [metric(run_id, round, r["stage"], "student", r["split"], r["suite"], r["metric"], r["value"])
                       for r in scored]
        else:
            metrics = heldout_scores(cfg, student["path"], name, run_id=run_id, round=round, subject="student",
                                     backend=backend, sampled=fw.pass_k > 1)
        if fw.student_train_samples > 0 and round < fw.rounds:
            # the schedule's first student_train_tasks, and every task flywheel.synthesize admitted so far
            train = schedule_train_tasks(cfg, lambda from_round: from_round <= round)[: fw.student_train_tasks] + \
                synthesized_tasks(cfg, run_id, lambda joins: joins <= round)
            explore = student_policy(cfg.student, student["path"], f"{name}-train",
                                     temperature=fw.sample_temperature, seed=1000 + round)
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
        res = score_checkpoint(model, heldout_tasks(cfg), student=cfg.student, name=name, sampling=None,
                               run=lake_runner(cfg, backend, run_id=run_id, round=round))
    metrics = checkpoint_rows(res, run_id=run_id, round=round, stage="eval", subject="eval", split="heldout")
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
