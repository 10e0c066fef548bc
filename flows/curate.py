"""Prefect flow `curate`: filter, de-duplicate, decontaminate and mix a run's rows into a training snapshot; and
the curation stage of the flywheel's rounds (`stage_curate`, the same task in both).

Wiring only: curate.stage does the work; the stage records the mix by source and the drops by reason in the rounds
table and publishes them as a table artifact.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_table_artifact

from flows.config import FlywheelConfig
from flows.rollouts import heldout_tasks
from flows.stages import StageTimer, metric


@task(name="curate")
def stage_curate(cfg: FlywheelConfig, run_id: str, round: int) -> dict[str, Any]:
    """Round `round`'s snapshot of run `run_id`, decontaminated against every held-out task of the schedule."""
    from curate.stage import curate
    from warehouse.lake import write_rows

    timer = StageTimer()
    res = curate(cfg.run.out, cfg.curate, run_id=run_id, round=round, heldout_tasks=heldout_tasks(cfg))
    m = partial(metric, run_id, round, "curate", "snapshot", "train", "all")
    metrics = [m(f"mix:{src}", n) for src, n in sorted(res.selected_by_source.items())]
    metrics += [m(f"drop:{why}", n) for why, n in sorted(res.dropped_by_reason.items())]
    metrics += [m("replayed", res.n_replayed), m(f"manifest_hash:{res.manifest_hash}", 1.0)]
    metrics.append(metric(run_id, round, "curate", "stage", "-", "all", "wall_s", timer.s))
    write_rows(cfg.run.out, "rounds", metrics)
    create_table_artifact(key=f"curate-r{round}", table=res.table(),
                          description=f"snapshot {res.snapshot_id}: {res.n_selected} of {res.n_candidates} rows")
    return {"snapshot_id": res.snapshot_id, "n_selected": res.n_selected, "manifest_hash": res.manifest_hash,
            "replayed": res.n_replayed,
            "selected_by_source": res.selected_by_source, "dropped_by_reason": res.dropped_by_reason,
            "wall_s": timer.s}


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

    return stage_curate(cfg=run_config_of(cfg, "curate", {}, overrides), run_id=run_id, round=round)
