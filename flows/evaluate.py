"""Prefect flow `evaluate`: score a model on the held-out split of the schedule's suites; rows land in the lake.

Wiring only: the model runs as a TransformersPolicy through the real episode loop (agents.rollout) in sandboxes,
and the pass rates land in the rounds table with subject `eval`.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from prefect.artifacts import create_table_artifact

from flows.config import FlywheelConfig
from flows.flywheel import student_policy, suite_tasks, rollout_rows, score_rows


@task(name="evaluate")
def evaluate_task(cfg: FlywheelConfig, model: str, run_id: str, round: int, name: str) -> list[dict[str, Any]]:
    from sandbox.backend import open_backend
    from warehouse.lake import write_rows

    heldout = [t for step in cfg.flywheel.suites for t in suite_tasks(step, "heldout", cfg.run.seed)]
    with open_backend(cfg.sandbox, pool_size=min(cfg.generate.concurrency, 8)) as backend:
        rows = rollout_rows(cfg, heldout, student_policy(cfg, model, name, temperature=0.0), run_id=run_id,
                            round=round, samples=1, backend=backend)
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
        overrides: Config keys as section.key=value (e.g. generate.concurrency=4), laid over the served config.
    """
    from flows.serve import run_config_of

    cfg = run_config_of(cfg, "evaluate", {}, overrides)
    scores = evaluate_task(cfg, model, run_id, round, name)
    create_table_artifact(key="evaluate-scores", table=[{"suite": m["suite"], "pass@1": m["value"]}
                                                        for m in scores], description=f"held-out pass@1 of {model}")
    return scores
