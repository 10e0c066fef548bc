"""Prefect flows `train-sft` and `train-grpo`: one training stage on its own, outside the flywheel's rounds.

`train-sft` fine-tunes a model on a snapshot of the lake; `train-grpo` improves a model with GRPO on a suite's train
tasks, rewarded by our verifiers in our sandboxes. Both register the checkpoint in the lake. Wiring only.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.config import FlywheelConfig
from flows.flywheel import stage_grpo, stage_sft


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

    return stage_sft(run_config_of(cfg, "train_sft", {}, overrides), run_id, round, _parent(model), snapshot_id)


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

    return stage_grpo(run_config_of(cfg, "train_grpo", {}, overrides), run_id, round, _parent(model))
