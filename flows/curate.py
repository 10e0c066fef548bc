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
def curate_flow(cfg: FlywheelConfig, run_id: str, round: int = 1,
                overrides: list[str] | None = None) -> dict[str, Any]:
    """Build round `round`'s training snapshot of run `run_id` from the lake at cfg.run.out.

    Args:
        cfg: The config (lake root, curation filters, mix); a deployment fills it with the served config.
        run_id: The run whose rows are curated.
        round: The round whose snapshot is built.
        overrides: Config keys as section.key=value (e.g. curate.max_per_task=2), laid over the served config.
    """
    from flows.serve import run_config_of

    return stage_curate(run_config_of(cfg, "curate", {}, overrides), run_id, round)
