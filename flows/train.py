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
def train_sft_flow(cfg: FlywheelConfig, model: str, snapshot_id: str, run_id: str, round: int = 1) -> dict[str, Any]:
    """SFT of `model` (a folder or hub id) on snapshot `snapshot_id`; the checkpoint lands in ROOT/models."""
    return stage_sft(cfg, run_id, round, _parent(model), snapshot_id)


@flow(name="train-grpo", log_prints=True)
def train_grpo_flow(cfg: FlywheelConfig, model: str, run_id: str, round: int = 1) -> dict[str, Any]:
    """GRPO of `model` on the train tasks of the schedule's suites up to `round` that still give signal."""
    return stage_grpo(cfg, run_id, round, _parent(model))
