"""Prefect flows `train-sft` and `train-grpo`: one training stage on its own; and the training stages of the
flywheel's rounds (`stage_base`, `stage_sft`, `stage_grpo`, the same tasks in both; `stage_mismatch`, the
mismatch panel of a round's student rollouts against its checkpoint).

`train-sft` fine-tunes a model on a snapshot of the lake; `train-grpo` improves a model with GRPO on the
schedule's train tasks that still give signal, rewarded by our verifiers in our sandboxes. Every training step
runs inside one `flywheel-gpu` slot (flows/concurrency.py, `[limits] gpu_slots`), the tiny base student's copy
warm-up included. Each registers its checkpoint in the lake. Wiring only: training/ does the work.
"""

from __future__ import annotations

import math
import shutil
from typing import Any

from prefect import flow, get_run_logger, task

from flows.concurrency import gpu_slot
from flows.config import FlywheelConfig
from flows.rollouts import schedule_train_tasks
from flows.stages import StageTimer, metric


@task(name="base-student")
def stage_base(cfg: FlywheelConfig, run_id: str) -> dict[str, Any]:
    """Build the tiny base student from the schedule's task corpus (or use the configured model) and register it."""
    from training.registry import model_dir, register_checkpoint
    from training.tiny import FAMILIES, build_tiny_model, task_corpus
    from training.warmup import warm_up_copying

    root = cfg.run.out
    timer = StageTimer()
    metrics: dict[str, Any] = {}
    if cfg.student.base in FAMILIES:  # tiny, tiny-gptoss, tiny-qwen3
        corpus_tasks = schedule_train_tasks(cfg)
        path = model_dir(root, f"{run_id}-base")
        shutil.rmtree(path, ignore_errors=True)
        t = cfg.student.tiny
        fam = cfg.student.base
        build_tiny_model(path, task_corpus(corpus_tasks, family=fam), family=fam, hidden=t.hidden, layers=t.layers,
                         heads=t.heads, kv_heads=t.kv_heads, vocab_size=t.vocab_size, seed=t.seed,
                         experts=t.experts, experts_per_token=t.experts_per_token,
                         rare_word_share=t.rare_word_share)
        with gpu_slot(cfg.limits):
            warm = warm_up_copying(path, [task.prompt for task in corpus_tasks], steps=t.copy_warmup_steps,
                                   learning_rate=t.copy_warmup_learning_rate, batch_size=t.copy_warmup_batch_size,
                                   seed=t.seed, threads=cfg.sft.threads, rare_word_share=t.rare_word_share,
                                   progress=True)
        if warm.steps:
            metrics["copy_warmup_steps"] = warm.steps
            metrics["copy_warmup_loss"] = round(warm.final_loss, 4)
    else:
        path = cfg.student.base
    metrics["wall_s"] = timer.s
    ck = register_checkpoint(root, run_id=run_id, round=0, stage="base", path=str(path), metrics=metrics)
    return {"checkpoint_id": ck.checkpoint_id, "path": str(path), **metrics}


# log_prints off for the training tasks: dill (datasets' fingerprinting) runs dis.dis, which prints, while it
# captures sys.stdout; Prefect's print logging would put ~500 lines of bytecode into the run's log.
@task(name="sft", log_prints=False)
def stage_sft(cfg: FlywheelConfig, run_id: str, round: int, parent: dict[str, Any], snapshot_id: str
              ) -> dict[str, Any]:
    """SFT of `parent` (path, checkpoint_id) on snapshot `snapshot_id`; rounds after the first use
    flywheel.later_sft_steps when they continue from the incumbent (flywheel.sft_from)."""
    from training.registry import model_dir, register_checkpoint
    from training.sft import train_sft
    from warehouse.lake import write_rows

    root = cfg.run.out
    out = model_dir(root, f"{run_id}-r{round}-sft")
    shutil.rmtree(out, ignore_errors=True)  # an interrupted earlier attempt starts over
    sft_cfg = cfg.sft
    if round > 1 and cfg.flywheel.later_sft_steps and cfg.flywheel.sft_from == "incumbent":
        sft_cfg = sft_cfg.model_copy(update={"max_steps": cfg.flywheel.later_sft_steps})
    with gpu_slot(cfg.limits):
        res = train_sft(parent["path"], None, out, sft_cfg, snapshot_id=snapshot_id, root=root,
                        attention=cfg.student.train_attention)
    metrics = {"final_loss": res.losses[-1] if res.losses else None, "steps": res.steps, "wall_s": res.total_s,
               "examples": res.n_examples, "dropped_truncated": res.n_dropped_truncated,
               "dropped_malformed": res.n_dropped_malformed}
    ck = register_checkpoint(root, run_id=run_id, round=round, stage="sft", path=res.checkpoint_path,
                             parent_id=parent["checkpoint_id"], snapshot_id=snapshot_id, metrics=metrics)
    write_rows(root, "rounds", [
        metric(run_id, round, "sft", "stage", "-", "all", "wall_s", res.total_s),
        metric(run_id, round, "sft", "student", "train", "all", "sft_final_loss",
               res.losses[-1] if res.losses else float("nan")),
        metric(run_id, round, "sft", "stage", "-", "all", "tokens", res.n_tokens),
        # per suite: what SFT kept, cut and dropped (and why), and the episodes' assistant turns it trained
        *(metric(run_id, round, "sft", "data", "train", suite, f"sft_{name}", n)
          for suite, counts in sorted(res.per_suite.items()) for name, n in counts.items())])
    return {"checkpoint_id": ck.checkpoint_id, "path": res.checkpoint_path, "wall_s": res.total_s,
            "losses": res.losses[-5:], "examples": res.n_examples}


# per-step GRPO health figures written to the rounds table (subject 'step', metric NAME:STEP)
STEP_FIGURES = ("grad_norm", "clip_fraction", "importance_weight_mean", "importance_weight_min",
                "importance_weight_max", "logprob_diff_mean", "reward", "loss")


def grpo_step_rows(run_id: str, round: int, steps: list[dict[str, Any]], *, stop_grad_norm: float,
                   stopped: str | None) -> list[dict[str, Any]]:
    """Rounds rows of GRPO's gradient health: each step's figures (subject 'step', metric NAME:STEP, for those
    TRL logged), the stop threshold that applied (grpo_stop_grad_norm) and, when it fired, the step it stopped at
    (grpo_stopped_at)."""
    rows = [metric(run_id, round, "grpo", "step", "train", "all", f"{name}:{d['step']}", d[name])
            for d in steps for name in STEP_FIGURES if d.get(name) is not None and math.isfinite(d[name])]
    if math.isfinite(stop_grad_norm):
        rows.append(metric(run_id, round, "grpo", "stage", "train", "all", "grpo_stop_grad_norm", stop_grad_norm))
    if stopped:
        rows.append(metric(run_id, round, "grpo", "stage", "train", "all", "grpo_stopped_at",
                           steps[-1]["step"] if steps else 0))
    return rows


@task(name="grpo", log_prints=False)
def stage_grpo(cfg: FlywheelConfig, run_id: str, round: int, parent: dict[str, Any]) -> dict[str, Any]:
    """GRPO of `parent` on the train tasks of the suites joined by `round` whose student outcomes were mixed (at
    most flywheel.grpo_max_tasks); `parent` comes back unchanged when no task gives signal."""
    from curate.curriculum import plan_curriculum
    from sandbox.backend import open_backend
    from training.grpo import EpisodeLog, train_grpo
    from training.registry import model_dir, register_checkpoint
    from warehouse.lake import write_rows

    root = cfg.run.out
    tasks = schedule_train_tasks(cfg, lambda from_round: from_round <= round)
    plan = plan_curriculum(root, cfg.curriculum, run_id=run_id, upto_round=round, task_ids=[t.id for t in tasks],
                           group_size=cfg.grpo.num_generations)
    keep = set(plan.grpo_tasks)
    chosen = [t for t in tasks if t.id in keep][: cfg.flywheel.grpo_max_tasks]
    skipped = plan.dropped_counts()
    get_run_logger().info("round %d GRPO tasks by the student's pass@k history at group size %d: %d of %d train "
                          "tasks give signal, %d used (flywheel.grpo_max_tasks); skipped: %s", round,
                          cfg.grpo.num_generations, len(plan.grpo_tasks), len(tasks), len(chosen),
                          ", ".join(f"{k} {v}" for k, v in skipped.items()) or "none")
    task_rows = [metric(run_id, round, "grpo", "stage", "train", "all", "grpo_tasks", len(chosen))] + [
        metric(run_id, round, "grpo", "stage", "train", "all", f"grpo_skipped:{k}", v) for k, v in skipped.items()]
    if not chosen:
        write_rows(root, "rounds", task_rows)
        return {**parent, "skipped": "no task gives signal (all always passed or always failed)",
                "skipped_tasks": skipped}
    out = model_dir(root, f"{run_id}-r{round}-grpo")
    shutil.rmtree(out, ignore_errors=True)
    # The GPU slot only: GRPO's sandboxes serve its reward function, not a rollout chunk (holding sandbox slots
    # too, in the other order than a vLLM rollout does, could deadlock two runs).
    with gpu_slot(cfg.limits):
        with open_backend(cfg.sandbox, pool_size=min(cfg.rollout.concurrency, 8)) as backend:
            res = train_grpo(parent["path"], chosen, out, cfg.grpo, backend=backend, rewards=cfg.rewards,
                             thresholds=cfg.diagnostics, attention=cfg.student.train_attention,
                             episode_log=EpisodeLog(root, run_id, round, policy=f"grpo-r{round}"))
    health = grpo_step_rows(run_id, round, res.steps_diagnostics, stop_grad_norm=cfg.diagnostics.stop_grad_norm,
                            stopped=res.stopped)
    if res.stopped:  # the norms exploded: this checkpoint is not used, the round goes on from the parent
        get_run_logger().warning("round %d GRPO %s; the round goes on from its parent checkpoint", round,
                                 res.stopped)
        write_rows(root, "rounds", task_rows + health)
        return {**parent, "skipped": f"GRPO stopped: {res.stopped}", "skipped_tasks": skipped}
    metrics = {"reward_first": res.rewards[0] if res.rewards else None,
               "reward_last": res.rewards[-1] if res.rewards else None, "steps": res.steps,
               "hacks_with_positive_reward": res.hacks_with_positive_reward, "wall_s": res.total_s,
               "warnings": res.warnings, "episode_rows": res.rows_written}
    ck = register_checkpoint(root, run_id=run_id, round=round, stage="grpo", path=res.checkpoint_path,
                             parent_id=parent["checkpoint_id"], metrics=metrics)
    rows = task_rows + health + [metric(run_id, round, "grpo", "stage", "-", "all", "wall_s", res.total_s)]
    rows += [metric(run_id, round, "grpo", "stage", "-", "all", f"task_containers_{k}", v)
             for k, v in res.task_containers.items()]  # Harbor tasks: agent containers started, reused, reset_failed
    if res.rewards:
        rows += [metric(run_id, round, "grpo", "student", "train", "all", "grpo_reward_first", res.rewards[0]),
                 metric(run_id, round, "grpo", "student", "train", "all", "grpo_reward_last", res.rewards[-1])]
    write_rows(root, "rounds", rows)
    return {"checkpoint_id": ck.checkpoint_id, "path": res.checkpoint_path, "wall_s": res.total_s,
            "tasks": len(chosen), "skipped_tasks": skipped, "rewards": res.rewards}


@task(name="mismatch", log_prints=False)
def stage_mismatch(cfg: FlywheelConfig, run_id: str, round: int, student: dict[str, Any]) -> dict[str, Any]:
    """The mismatch panel of the round's rollouts of the student's checkpoint (their stored logprobs) against that
    checkpoint recomputed as the trainer sees it; its figures land in the rounds table (subject 'mismatch') and `refused`
    lists the thresholds (cfg.mismatch) it crosses."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.attention import use_attention
    from training.mismatch import MismatchError, panel_limits, promotion_refusals, rows_panel
    from warehouse.lake import write_rows
    from warehouse.query import read_trajectories

    from agents.transformers_policy import checkpoint_version

    timer = StageTimer()
    # the rollouts of this checkpoint only: the round's other student rows (the candidates' held-out episodes,
    # GRPO's own) came from other checkpoints when the incumbent was kept or another candidate was scored
    rows = read_trajectories(cfg.run.out, "run_id = ? AND round = ? AND source = 'student' AND model_version = ?",
                             [run_id, round, checkpoint_version(student["path"])])
    tok = AutoTokenizer.from_pretrained(student["path"])
    model = use_attention(AutoModelForCausalLM.from_pretrained(student["path"]).eval(), cfg.student.train_attention)
    try:
        with gpu_slot(cfg.limits):
            p = rows_panel(model, tok, rows, old_batch_size=1)
    except MismatchError as e:
        return {"skipped": str(e), "refused": [], "wall_s": timer.s}
    figures = {"mm:mean_abs_diff": p.mean_abs_diff, "mm:max_abs_diff": p.max_abs_diff,
               "mm:token_mult_prob_error": p.token_mult_prob_error, "mm:iw_max": p.iw_max,
               "mm:clip_fraction": p.clip_fraction or 0.0}
    if p.pearson is not None:
        figures["mm:pearson"] = p.pearson
    # the limits that applied, beside the figures (the report draws them): mm_max:NAME, mm_min:NAME
    figures.update({f"mm_{side}:{name}": v for name, (side, v) in panel_limits(cfg.mismatch).items()})
    write_rows(cfg.run.out, "rounds", [metric(run_id, round, "mismatch", "mismatch", "train", "all", k, v)
                                        for k, v in figures.items()]
               + [metric(run_id, round, "mismatch", "stage", "-", "all", "wall_s", timer.s)])
    refused = promotion_refusals(p, cfg.mismatch)
    return {"panel": p.model_dump(), "refused": refused, "wall_s": timer.s}


def _parent(model: str) -> dict[str, Any]:
    return {"path": model, "checkpoint_id": None}


@flow(name="train-sft", log_prints=True)
def train_sft_flow(cfg: FlywheelConfig, model: str, snapshot_id: str, run_id: str, round: int = 1,
                   overrides: list[str] | None = None) -> dict[str, Any]:
    """SFT of `model` (a folder or hub id) on snapshot `snapshot_id`; the checkpoint lands in ROOT/models.

    Args:
        cfg: The config (lake root, [sft] recipe); a deployment fills it with the served config.
        model: The model to fine-tune: a folder or a hub id.
        snapshot_id: The training snapshot (from curate) to fine-tune on.
        run_id: The run the checkpoint is registered under.
        round: The round the checkpoint is registered under.
        overrides: Config keys as section.key=value (e.g. sft.max_steps=200), laid over the served config.
    """
    from flows.serve import run_config_of

    return stage_sft(cfg=run_config_of(cfg, "train_sft", {}, overrides), run_id=run_id, round=round,
                     parent=_parent(model), snapshot_id=snapshot_id)


@flow(name="train-grpo", log_prints=True)
def train_grpo_flow(cfg: FlywheelConfig, model: str, run_id: str, round: int = 1,
                    overrides: list[str] | None = None) -> dict[str, Any]:
    """GRPO of `model` on the train tasks of the schedule's suites up to `round` that still give signal.

    Args:
        cfg: The config (lake root, suites, [grpo] recipe); a deployment fills it with the served config.
        model: The model to improve: a folder or a hub id.
        run_id: The run the checkpoint is registered under.
        round: Suites joining up to this round give the tasks.
        overrides: Config keys as section.key=value (e.g. grpo.max_steps=4), laid over the served config.
    """
    from flows.serve import run_config_of

    return stage_grpo(cfg=run_config_of(cfg, "train_grpo", {}, overrides), run_id=run_id, round=round,
                      parent=_parent(model))
