"""Prefect flow `curate`: filter, de-duplicate, decontaminate and mix a run's rows into a training snapshot.

Wiring only: curate.stage does the work; the flow publishes the counts by source, verdict and drop reason as a
table artifact. The flywheel flow runs the same stage inside each round.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.config import FlywheelConfig
from flows.flywheel import stage_curate


@flow(name="curate", log_prints=True)
def curate_flow(cfg: FlywheelConfig, run_id: str, round: int = 1) -> dict[str, Any]:
    """Build round `round`'s training snapshot of run `run_id` from the lake at cfg.run.out."""
    return stage_curate(cfg, run_id, round)
