"""Prefect flow `flywheel`: N rounds of teacher -> curate -> SFT -> GRPO -> student re-rollout, with a report.

Round 0 builds (or names) the base student, imports human demos and scores the base and the teacher on the
held-out split. Round r (1..N): the teacher rolls out on the curriculum's train tasks; curation mixes teacher
rows, demos and the earlier student's successes into snapshot r; SFT from the previous student (or the base),
then GRPO on the tasks that still give signal; the new student is scored on the held-out split of every suite of
the schedule and rolls out on the train tasks (its successes enter round r+1 as source student); metrics land
in the rounds table and the report is rebuilt. The teacher's rollouts on the suites that join round r+1 need no
student, so they run in a low-priority child process while round r trains (`flywheel.teacher_ahead`; SFT holds
one core, they use the other); round r+1's teacher stage finds them written and adds only the tasks the student
still fails.

Every stage records itself in the ledger (flows/stages.py) when its outputs are durable; `--resume RUN_ID`
skips finished stages. Stage logic lives in agents/, tasks/, training/ and warehouse/: this module wires it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import BaseModel, Field

from flows.artifacts import viewer_links
from flows.config import FlywheelConfig, SuiteStep
from flows.generate import new_run_id
from flows.stages import Ledger

# ---------------------------------------------------------------------------------------------------- helpers


def suite_tasks(step: SuiteStep, split: str, seed: int) -> list:
    from tasks.suites import load_suite

    n = step.train_tasks if split == "train" else step.heldout_tasks
    return load_suite(step.suite, n=n, split=split, seed=seed, difficulty=step.difficulty)


def schedule_train_tasks(cfg: FlywheelConfig, joins: Callable[[int], bool] = lambda from_round: True) -> list:
    """The train tasks of the schedule's suites whose first round satisfies `joins` (default: every suite)."""
    return [t for step in cfg.flywheel.suites if joins(step.from_round)
            for t in suite_tasks(step, "train", cfg.run.seed)]


def joining_tasks(cfg: FlywheelConfig, round: int) -> list:
    """The train tasks of the suites that join the schedule in `round` (the teacher covers them whole)."""
    return schedule_train_tasks(cfg, lambda from_round: from_round == round)


def _metric(run_id: str, round: int, stage: str, subject: str, split: str, suite: str, metric: str,
            value: float) -> dict[str, Any]:
    return {"run_id": run_id, "round": round, "stage": stage, "subject": subject, "split": split, "suite": suite,
            "metric": metric, "value": float(value), "created_at": datetime.now(timezone.utc)}


def score_rows(rows: list, *, run_id: str, round: int, stage: str, subject: str, split: str,
               k: int | None = None) -> list[dict[str, Any]]:
    """pass@1 (and pass@k when k > 1) per suite label and over all, from scored rows (infra_error excluded)."""
    from curate.curriculum import pass_at_k

    by_suite: dict[str, list] = {}
    for r in rows:
        if r.verdict == "infra_error":
            continue
        by_suite.setdefault(f"{r.suite}-d{r.difficulty}", []).append(r)
        by_suite.setdefault("all", []).append(r)
    out = []
    for suite, rs in sorted(by_suite.items()):
        metric = "pass@1" if not k or k <= 1 else f"pass@{k}"
        if not k or k <= 1:
            value = sum(r.verdict == "pass" for r in rs) / len(rs)
        else:
            per_task: dict[str, list] = {}
            for r in rs:
                per_task.setdefault(r.task_id, []).append(r.verdict == "pass")
            vals = [pass_at_k(len(v), sum(v), k) for v in per_task.values()]
            vals = [v for v in vals if v is not None]
            value = sum(vals) / len(vals) if vals else 0.0
        out.append(_metric(run_id, round, stage, subject, split, suite, metric, value))
        out.append(_metric(run_id, round, stage, subject, split, suite, "episodes", len(rs)))
    return out


def rollout_rows(cfg: FlywheelConfig, tasks: list, policy, *, run_id: str, round: int, samples: int,
                 backend, progress: bool = True) -> list:
    """Run a policy over tasks through the real loop; write rows as they finish; return every row of the set."""
    from agents.rollout import rollout
    from warehouse.lake import existing_ids, write_trajectories
    from warehouse.query import read_trajectories

    skip = existing_ids(cfg.run.out, run_id, round)
    fresh: list = []

    def on_rows(rows: list) -> None:
        write_trajectories(cfg.run.out, rows)
        fresh.extend(rows)

    asyncio.run(rollout(tasks, policy, backend, run_id=run_id, round=round, samples=samples,
                        concurrency=cfg.generate.concurrency, skip_ids=skip, on_rows=on_rows,
                        batch_size=cfg.generate.batch_size, infra_retries=cfg.generate.infra_retries,
                        max_turns=cfg.generate.max_turns, progress=progress))
    ids = {r.trajectory_id for r in fresh}
    old = [r for r in read_trajectories(cfg.run.out, "run_id = ? AND round = ? AND policy = ? "
                                                     "AND list_contains(?::VARCHAR[], task_id)",
                                        [run_id, round, policy.name, [t.id for t in tasks]])
           if r.trajectory_id not in ids]
    return fresh + old


def student_policy(cfg: FlywheelConfig, model_path: str, name: str, *, temperature: float, seed: int = 0):
    from agents.transformers_policy import TransformersPolicy

    s = cfg.student
    return TransformersPolicy(model_path, name=name, temperature=temperature, max_new_tokens=s.max_new_tokens,
                              batch_size=s.batch_size, seed=seed, threads=s.threads)


# ---------------------------------------------------------------------------------------------------- stages


class StageTimer:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    @property
    def s(self) -> float:
        return round(time.perf_counter() - self.t0, 2)


@task(name="base-student")
def stage_base(cfg: FlywheelConfig, run_id: str) -> dict[str, Any]:
    """Build the tiny base student from the schedule's task corpus (or use the configured model) and register it."""
    from training.registry import model_dir, register_checkpoint
    from training.tiny import build_tiny_model, task_corpus
    from training.warmup import warm_up_copying

    root = cfg.run.out
    timer = StageTimer()
    metrics: dict[str, Any] = {}
    if cfg.student.base == "tiny":
        corpus_tasks = schedule_train_tasks(cfg)
        path = model_dir(root, f"{run_id}-base")
        shutil.rmtree(path, ignore_errors=True)
        t = cfg.student.tiny
        build_tiny_model(path, task_corpus(corpus_tasks), hidden=t.hidden, layers=t.layers, heads=t.heads,
                         kv_heads=t.kv_heads, vocab_size=t.vocab_size, seed=t.seed)
        warm = warm_up_copying(path, [task.prompt for task in corpus_tasks], steps=t.copy_warmup_steps, seed=t.seed,
                               threads=cfg.sft.threads, progress=True)
        if warm.steps:
            metrics["copy_warmup_steps"] = warm.steps
            metrics["copy_warmup_loss"] = round(warm.final_loss, 4)
    else:
        path = cfg.student.base
    metrics["wall_s"] = timer.s
    ck = register_checkpoint(root, run_id=run_id, round=0, stage="base", path=str(path), metrics=metrics)
    return {"checkpoint_id": ck.checkpoint_id, "path": str(path), **metrics}


@task(name="score-base-and-teacher")
def stage_baseline(cfg: FlywheelConfig, run_id: str, base_path: str) -> dict[str, Any]:
    """Held-out pass@1 (and pass@k) of the base student and of the teacher, round 0."""
    from agents.config import build_policy
    from sandbox.backend import open_backend
    from warehouse.lake import write_rows

    timer = StageTimer()
    heldout = [t for step in cfg.flywheel.suites for t in suite_tasks(step, "heldout", cfg.run.seed)]
    metrics: list[dict[str, Any]] = []
    with open_backend(cfg.sandbox, pool_size=min(cfg.generate.concurrency, 8)) as backend:
        base = student_policy(cfg, base_path, "base", temperature=0.0)
        rows = rollout_rows(cfg, heldout, base, run_id=run_id, round=0, samples=1, backend=backend)
        metrics += score_rows(rows, run_id=run_id, round=0, stage="eval", subject="base", split="heldout")
        teacher = build_policy(cfg.teacher)
        rows = rollout_rows(cfg, heldout, teacher, run_id=run_id, round=0, samples=1, backend=backend)
        metrics += score_rows(rows, run_id=run_id, round=0, stage="eval", subject="teacher", split="heldout")
    metrics.append(_metric(run_id, 0, "baseline", "stage", "-", "all", "wall_s", timer.s))
    write_rows(cfg.run.out, "rounds", metrics)
    return {"wall_s": timer.s, "metrics": len(metrics)}


@task(name="teacher-rollout", retries=1, retry_delay_seconds=5)
def stage_teacher(cfg: FlywheelConfig, run_id: str, round: int) -> dict[str, Any]:
    """The teacher on every train task of the suites joining this round, and on the earlier suites' tasks that the
    student still fails (the curriculum)."""
    from agents.config import build_policy
    from sandbox.backend import open_backend
    from curate.curriculum import plan_curriculum
    from warehouse.lake import write_rows

    timer = StageTimer()
    new = joining_tasks(cfg, round)
    earlier = schedule_train_tasks(cfg, lambda from_round: from_round < round)
    chosen = new
    if earlier:
        # Suites the teacher already covered: only the tasks the student still fails get the teacher again.
        plan = plan_curriculum(cfg.run.out, cfg.curriculum.model_copy(update={"unseen_to_teacher": False}),
                               run_id=run_id, upto_round=round - 1, task_ids=[t.id for t in earlier])
        wanted = set(plan.teacher_tasks)
        chosen = new + [t for t in earlier if t.id in wanted]
    with open_backend(cfg.sandbox, pool_size=min(cfg.generate.concurrency, 8)) as backend:
        rows = rollout_rows(cfg, chosen, build_policy(cfg.teacher), run_id=run_id, round=round,
                            samples=cfg.flywheel.teacher_samples, backend=backend)
    scored = [r for r in rows if r.verdict != "infra_error"]
    metrics = [_metric(run_id, round, "teacher", "teacher", "train", "all", "yield",
                       sum(r.verdict == "pass" for r in scored) / len(scored) if scored else 0.0),
               _metric(run_id, round, "teacher", "teacher", "train", "all", "tasks", len(chosen)),
               _metric(run_id, round, "teacher", "teacher", "train", "all", "episodes", len(rows)),
               _metric(run_id, round, "teacher", "teacher", "train", "all", "hack_rate",
                       sum(r.verdict == "hack" for r in scored) / len(scored) if scored else 0.0),
               _metric(run_id, round, "teacher", "stage", "-", "all", "wall_s", timer.s),
               _metric(run_id, round, "teacher", "stage", "-", "all", "tokens",
                       sum(r.prompt_tokens + r.completion_tokens for r in rows))]
    codes: dict[str, int] = {}
    for r in scored:
        for c in r.hack_flags:
            codes[c] = codes.get(c, 0) + 1
    metrics += [_metric(run_id, round, "teacher", "teacher", "train", "all", f"hack:{c}", n / len(scored))
                for c, n in sorted(codes.items())]
    write_rows(cfg.run.out, "rounds", metrics)
    return {"tasks": len(chosen), "episodes": len(rows), "wall_s": timer.s}


def teacher_ahead(cfg: FlywheelConfig, run_id: str, round: int) -> dict[str, Any]:
    """The teacher on the train tasks of the suites that join `round`. They depend on no student, so the flow
    runs this in a child process while the round before it trains (SFT holds one core, these rollouts the other).
    Rows land in the lake under `round`; that round's teacher stage then finds them written and skips them. No
    progress bar (the student's rollouts may draw theirs meanwhile), no Prefect calls (it runs outside the flow)."""
    from agents.config import build_policy
    from sandbox.backend import open_backend
    from warehouse.lake import write_rows

    timer = StageTimer()
    new = joining_tasks(cfg, round)
    with open_backend(cfg.sandbox, pool_size=min(cfg.generate.concurrency, 8)) as backend:
        rows = rollout_rows(cfg, new, build_policy(cfg.teacher), run_id=run_id, round=round,
                            samples=cfg.flywheel.teacher_samples, backend=backend, progress=False)
    write_rows(cfg.run.out, "rounds", [_metric(run_id, round, "teacher-ahead", "stage", "-", "all", "wall_s",
                                               timer.s)])
    return {"tasks": len(new), "episodes": len(rows), "wall_s": timer.s}


def _ahead(cfg_json: str, run_id: str, round: int) -> dict[str, Any]:
    """teacher_ahead in a child process at low priority, recorded in the ledger. A process, not a thread: in a
    thread its rollouts held the GIL against SFT's Python (measured on 2 cores: SFT fell from ~6 to 1.2-1.7
    steps/s beside it, worse when the thread was niced, since a descheduled thread keeps the GIL); a niced
    process takes only the CPU that training leaves over."""
    try:
        os.nice(15)
    except OSError:  # not permitted: same priority, still correct
        pass
    cfg = FlywheelConfig.model_validate_json(cfg_json)
    ledger = Ledger(cfg.run.out, run_id)
    done = ledger.get(round, "teacher-ahead")
    return done if done is not None else ledger.done(round, "teacher-ahead", teacher_ahead(cfg, run_id, round))


@task(name="curate")
def stage_curate(cfg: FlywheelConfig, run_id: str, round: int) -> dict[str, Any]:
    from curate.stage import curate
    from warehouse.lake import write_rows

    timer = StageTimer()
    heldout = [t for step in cfg.flywheel.suites for t in suite_tasks(step, "heldout", cfg.run.seed)]
    res = curate(cfg.run.out, cfg.curate, run_id=run_id, round=round, heldout_tasks=heldout)
    metrics = [_metric(run_id, round, "curate", "snapshot", "train", "all", f"mix:{src}", n)
               for src, n in sorted(res.selected_by_source.items())]
    metrics += [_metric(run_id, round, "curate", "snapshot", "train", "all", f"drop:{why}", n)
                for why, n in sorted(res.dropped_by_reason.items())]
    metrics.append(_metric(run_id, round, "curate", "stage", "-", "all", "wall_s", timer.s))
    write_rows(cfg.run.out, "rounds", metrics)
    create_table_artifact(key=f"curate-r{round}", table=res.table(),
                          description=f"snapshot {res.snapshot_id}: {res.n_selected} of {res.n_candidates} rows")
    return {"snapshot_id": res.snapshot_id, "n_selected": res.n_selected,
            "selected_by_source": res.selected_by_source, "dropped_by_reason": res.dropped_by_reason,
            "wall_s": timer.s}


# log_prints off for the training tasks: dill (datasets' fingerprinting) runs dis.dis, which prints, while it
# captures sys.stdout; Prefect's print logging would put ~500 lines of bytecode into the run's log.
@task(name="sft", log_prints=False)
def stage_sft(cfg: FlywheelConfig, run_id: str, round: int, parent: dict[str, Any], snapshot_id: str
              ) -> dict[str, Any]:
    from training.registry import model_dir, register_checkpoint
    from training.sft import train_sft
    from warehouse.lake import write_rows

    root = cfg.run.out
    out = model_dir(root, f"{run_id}-r{round}-sft")
    shutil.rmtree(out, ignore_errors=True)  # an interrupted earlier attempt starts over
    sft_cfg = cfg.sft
    if round > 1 and cfg.flywheel.later_sft_steps:
        sft_cfg = sft_cfg.model_copy(update={"max_steps": cfg.flywheel.later_sft_steps})
    res = train_sft(parent["path"], None, out, sft_cfg, snapshot_id=snapshot_id, root=root)
    metrics = {"final_loss": res.losses[-1] if res.losses else None, "steps": res.steps, "wall_s": res.total_s,
               "examples": res.n_examples, "dropped_truncated": res.n_dropped_truncated}
    ck = register_checkpoint(root, run_id=run_id, round=round, stage="sft", path=res.checkpoint_path,
                             parent_id=parent["checkpoint_id"], snapshot_id=snapshot_id, metrics=metrics)
    write_rows(root, "rounds", [
        _metric(run_id, round, "sft", "stage", "-", "all", "wall_s", res.total_s),
        _metric(run_id, round, "sft", "student", "train", "all", "sft_final_loss",
                res.losses[-1] if res.losses else float("nan")),
        _metric(run_id, round, "sft", "stage", "-", "all", "tokens", res.n_tokens)])
    return {"checkpoint_id": ck.checkpoint_id, "path": res.checkpoint_path, "wall_s": res.total_s,
            "losses": res.losses[-5:], "examples": res.n_examples}


@task(name="grpo", log_prints=False)
def stage_grpo(cfg: FlywheelConfig, run_id: str, round: int, parent: dict[str, Any]) -> dict[str, Any]:
    from sandbox.backend import open_backend
    from training.grpo import train_grpo
    from training.registry import model_dir, register_checkpoint
    from curate.curriculum import plan_curriculum
    from warehouse.lake import write_rows

    root = cfg.run.out
    tasks = [t for step in cfg.flywheel.suites if step.from_round <= round
             for t in suite_tasks(step, "train", cfg.run.seed)]
    plan = plan_curriculum(root, cfg.curriculum, run_id=run_id, upto_round=round, task_ids=[t.id for t in tasks])
    keep = set(plan.grpo_tasks)
    chosen = [t for t in tasks if t.id in keep][: cfg.flywheel.grpo_max_tasks]
    if not chosen:
        return {**parent, "skipped": "no task gives signal (all always passed or always failed)"}
    out = model_dir(root, f"{run_id}-r{round}-grpo")
    shutil.rmtree(out, ignore_errors=True)
    with open_backend(cfg.sandbox, pool_size=min(cfg.generate.concurrency, 8)) as backend:
        res = train_grpo(parent["path"], chosen, out, cfg.grpo, backend=backend)
    metrics = {"reward_first": res.rewards[0] if res.rewards else None,
               "reward_last": res.rewards[-1] if res.rewards else None, "steps": res.steps,
               "hacks_with_positive_reward": res.hacks_with_positive_reward, "wall_s": res.total_s,
               "warnings": res.warnings}
    ck = register_checkpoint(root, run_id=run_id, round=round, stage="grpo", path=res.checkpoint_path,
                             parent_id=parent["checkpoint_id"], metrics=metrics)
    rows = [_metric(run_id, round, "grpo", "stage", "-", "all", "wall_s", res.total_s)]
    if res.rewards:
        rows += [_metric(run_id, round, "grpo", "student", "train", "all", "grpo_reward_first", res.rewards[0]),
                 _metric(run_id, round, "grpo", "student", "train", "all", "grpo_reward_last", res.rewards[-1])]
    write_rows(root, "rounds", rows)
    return {"checkpoint_id": ck.checkpoint_id, "path": res.checkpoint_path, "wall_s": res.total_s,
            "tasks": len(chosen), "rewards": res.rewards}


@task(name="student-rollouts")
def stage_student(cfg: FlywheelConfig, run_id: str, round: int, student: dict[str, Any]) -> dict[str, Any]:
    """Score the new student on every suite's held-out split; roll it out on the train tasks (next round's data)."""
    from sandbox.backend import open_backend
    from warehouse.lake import write_rows

    timer = StageTimer()
    fw = cfg.flywheel
    heldout = [t for step in fw.suites for t in suite_tasks(step, "heldout", cfg.run.seed)]
    train = [t for step in fw.suites if step.from_round <= round
             for t in suite_tasks(step, "train", cfg.run.seed)][: fw.student_train_tasks]
    name = f"student-r{round}"
    metrics: list[dict[str, Any]] = []
    with open_backend(cfg.sandbox, pool_size=min(cfg.generate.concurrency, 8)) as backend:
        greedy = student_policy(cfg, student["path"], name, temperature=0.0)
        rows = rollout_rows(cfg, heldout, greedy, run_id=run_id, round=round, samples=1, backend=backend)
        metrics += score_rows(rows, run_id=run_id, round=round, stage="eval", subject="student", split="heldout")
        if fw.pass_k > 1:
            sampled = student_policy(cfg, student["path"], f"{name}-t{fw.sample_temperature:g}",
                                      temperature=fw.sample_temperature, seed=round)
            rows = rollout_rows(cfg, heldout, sampled, run_id=run_id, round=round, samples=fw.pass_k,
                                backend=backend)
            metrics += score_rows(rows, run_id=run_id, round=round, stage="eval", subject="student",
                                  split="heldout", k=fw.pass_k)
        if fw.student_train_samples > 0 and round < fw.rounds:
            explore = student_policy(cfg, student["path"], f"{name}-train", temperature=fw.sample_temperature,
                                      seed=1000 + round)
            rows = rollout_rows(cfg, train, explore, run_id=run_id, round=round,
                                samples=fw.student_train_samples, backend=backend)
            metrics += score_rows(rows, run_id=run_id, round=round, stage="student", subject="student",
                                  split="train")
    metrics.append(_metric(run_id, round, "student", "stage", "-", "all", "wall_s", timer.s))
    write_rows(cfg.run.out, "rounds", metrics)
    return {"wall_s": timer.s}


# ---------------------------------------------------------------------------------------------------- the flow


class FlywheelSummary(BaseModel):
    run_id: str
    root: str
    rounds: int
    heldout: list[dict[str, Any]] = Field(default_factory=list, description="subject, round, suite, pass@1")
    report_md: str = ""
    report_html: str = ""
    wall_s: float = 0.0


def _stage(ledger: Ledger, round: int, name: str, fn, *args) -> dict[str, Any]:
    """Run a stage unless the ledger says it finished; record its outputs when it does."""
    logger = get_run_logger()
    done = ledger.get(round, name)
    if done is not None:
        logger.info("round %d %s: done earlier, skipped", round, name)
        return done
    logger.info("round %d %s: starting", round, name)
    out = fn(*args)
    return ledger.done(round, name, out)


@flow(name="flywheel", log_prints=True)
def flywheel_flow(cfg: FlywheelConfig, resume: bool = False, rounds: int | None = None,
                  suites: list[SuiteStep] | None = None, student_base: str | None = None, grpo: bool | None = None,
                  overrides: list[str] | None = None) -> FlywheelSummary:
    """Rounds of teacher -> curate -> SFT -> GRPO -> student re-rollout, then the report.

    Args:
        cfg: The run's config, one section per stage; a deployment fills it with the served config and keeps it
            out of the run form.
        resume: Continue the run of run.run_id (set it in overrides) from its last finished stage.
        rounds: Rounds of teacher -> curate -> SFT -> GRPO -> student.
        suites: The schedule: each suite with the round it joins training and its task counts.
        student_base: The base student: 'tiny' (built from the task corpus) or a model folder / hub id.
        grpo: Run GRPO after SFT in each round.
        overrides: Any other config key, as section.key=value (e.g. sft.max_steps=200, run.run_id=fw-1), laid
            over the served config after the fields above.
    """
    from flows.serve import run_config_of

    cfg = run_config_of(cfg, "flywheel", {"rounds": rounds, "suites": suites, "student_base": student_base,
                                          "grpo": grpo}, overrides)
    from flows.config import save_config
    from warehouse.lake import compact
    from warehouse.report import build_report, heldout_table

    t0 = time.perf_counter()
    run_id = cfg.run.run_id or new_run_id("fw")
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"run_id": run_id})})
    root = cfg.run.out
    if not resume:
        preflight(cfg)
        save_config(cfg, root, run_id)
    ledger = Ledger(root, run_id)
    logger = get_run_logger()
    logger.info("flywheel run %s -> %s (%d rounds)", run_id, root, cfg.flywheel.rounds)

    base = _stage(ledger, 0, "base", stage_base, cfg, run_id)
    _stage(ledger, 0, "baseline", stage_baseline, cfg, run_id, base["path"])
    student = base
    for r in range(1, cfg.flywheel.rounds + 1):
        _stage(ledger, r, "teacher", stage_teacher, cfg, run_id, r)
        snap = _stage(ledger, r, "curate", stage_curate, cfg, run_id, r)
        ahead = None
        if (cfg.flywheel.teacher_ahead and r < cfg.flywheel.rounds and ledger.get(r + 1, "teacher") is None
                and any(step.from_round == r + 1 for step in cfg.flywheel.suites)):
            logger.info("round %d teacher on the suites joining it: in a child process, while round %d trains",
                        r + 1, r)
            pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
            ahead = pool.submit(_ahead, cfg.model_dump_json(), run_id, r + 1)
            pool.shutdown(wait=False)
        try:
            sft = _stage(ledger, r, "sft", stage_sft, cfg, run_id, r, student, snap["snapshot_id"])
            student = sft
            if cfg.flywheel.grpo:
                student = _stage(ledger, r, "grpo", stage_grpo, cfg, run_id, r, sft)
            _stage(ledger, r, "student", stage_student, cfg, run_id, r, student)
        finally:
            if ahead is not None:
                try:  # its rows are durable as they land; whatever it missed, round r+1's teacher stage runs
                    logger.info("round %d teacher ahead: %s", r + 1, ahead.result())
                except Exception as e:  # noqa: BLE001
                    logger.warning("round %d teacher ahead failed (%s: %s); round %d's teacher stage runs those "
                                   "tasks instead", r + 1, type(e).__name__, e, r + 1)
        compact(root, run_id)
        report = build_report(root, run_id)
        create_markdown_artifact(key="flywheel-report", markdown=report.markdown + viewer_links(
                                     cfg.run.viewer_url, run_id, [snap["snapshot_id"]]),
                                 description=f"flywheel {run_id} after round {r}")
    report = build_report(root, run_id)
    table = heldout_table(root, run_id)
    create_table_artifact(key="flywheel-heldout", table=table, description=f"held-out pass@1 of run {run_id}")
    return FlywheelSummary(run_id=run_id, root=str(root), rounds=cfg.flywheel.rounds, heldout=table,
                           report_md=report.markdown_path, report_html=report.html_path,
                           wall_s=time.perf_counter() - t0)


def preflight(cfg: FlywheelConfig) -> None:
    """Fail fast before anything is written: suites, teacher, sandbox engine, base model."""
    from agents.config import check_policy
    from sandbox.backend import check_backend
    from tasks.suites import check_suite

    for step in cfg.flywheel.suites:
        check_suite(step.suite)
    check_policy(cfg.teacher)
    check_backend(cfg.sandbox)


def print_summary(s: FlywheelSummary) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console(width=max(100, Console().width))
    t = Table(title=f"flywheel {s.run_id}: held-out pass@1 by round")
    suites = sorted({row["suite"] for row in s.heldout})
    t.add_column("round")
    t.add_column("subject")
    for su in suites:
        t.add_column(su, justify="right")
    keyed: dict[tuple[int, str], dict[str, float]] = {}
    for row in s.heldout:
        keyed.setdefault((row["round"], row["subject"]), {})[row["suite"]] = row["pass@1"]
    for (rnd, subj), vals in sorted(keyed.items()):
        t.add_row(str(rnd), subj, *(f"{vals[su]:.0%}" if su in vals else "-" for su in suites))
    c.print(t)
    c.print(f"{s.wall_s / 60:.1f} min\nreport: {s.report_md}\n        {s.report_html}\n"
            f"query:  flywheel sql --root {s.root} \"SELECT * FROM rounds WHERE run_id = '{s.run_id}'\"")
