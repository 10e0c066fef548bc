"""Score a model on tasks through the real episode loop: TransformersPolicy + agents.rollout + a sandbox backend.

`evaluate` is what "the student scores X% on the held-out split" means everywhere (flows, tests, benchmarks):
each task runs as a real episode (tool calls in sandboxes, verifier + forensics), rows come back as Trajectory
records (source student) that the caller may write to the lake. Greedy decoding by default, so a score is
reproducible. This module does not write rows or register anything (the promotion rules: training/promotion.py).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from sandbox.result import Backend
from tasks.spec import Task
from warehouse.record import Trajectory
from warehouse.score import pass_rate
from warehouse.score import scored as scored_rows


class EvalResult(BaseModel):
    pass_rate: float = Field(description="Passes / scored episodes (infra_error excluded).")
    mean_reward: float = Field(description="Mean reward over scored episodes.")
    episodes: int
    scored: int
    verdicts: dict[str, int]
    hacks_with_positive_reward: int
    wall_s: float
    rows: list[Trajectory] = Field(default_factory=list, repr=False)


def summarize(rows: list[Trajectory], wall_s: float = 0.0) -> EvalResult:
    scored = scored_rows(rows)
    verdicts: dict[str, int] = {}
    for r in rows:
        verdicts[r.verdict] = verdicts.get(r.verdict, 0) + 1
    return EvalResult(
        pass_rate=pass_rate(rows),
        mean_reward=sum(r.reward for r in scored) / len(scored) if scored else 0.0,
        episodes=len(rows), scored=len(scored), verdicts=verdicts,
        hacks_with_positive_reward=sum(1 for r in rows if r.verdict == "hack" and r.reward > 0),
        wall_s=wall_s, rows=rows,
    )


def evaluate(model: str | Path | Any, tasks: list[Task], backend: Backend, *, run_id: str = "eval", round: int = 0,
             samples: int = 1, temperature: float = 0.0, max_new_tokens: int = 64, batch_size: int = 64,
             concurrency: int = 64, max_turns: int = 4, seed: int = 0, name: str | None = None,
             progress: bool = False, threads: int | None = 1) -> EvalResult:
    """Run every task (x samples) with the model as policy through agents.rollout; return the score and the rows.

    `model` is a model folder / hub id (a TransformersPolicy is built) or any Policy object.
    """
    from agents.rollout import rollout
    from agents.transformers_policy import TransformersPolicy

    if isinstance(model, (str, Path)):
        policy: Any = TransformersPolicy(model, name=name, temperature=temperature, max_new_tokens=max_new_tokens,
                                         batch_size=batch_size, seed=seed, threads=threads)
    else:
        policy = model
    rows: list[Trajectory] = []
    t0 = time.perf_counter()
    asyncio.run(rollout(tasks, policy, backend, run_id=run_id, round=round, samples=samples,
                        concurrency=concurrency, on_rows=rows.extend, batch_size=max(1, len(tasks) * samples),
                        max_turns=max_turns, progress=progress))
    return summarize(rows, time.perf_counter() - t0)
