"""Score a model on tasks through the real episode loop: TransformersPolicy + agents.rollout + a sandbox backend.

`evaluate` is what "the student scores X% on the held-out split" means everywhere (flows, tests, benchmarks):
each task runs as a real episode (tool calls in sandboxes, verifier + forensics), rows come back as Trajectory
records (source student) that the caller may write to the lake. Greedy decoding by default, so a score is
reproducible. `choose_promotion` is the rule that picks, in a round with GRPO, the SFT or the GRPO checkpoint
from their held-out scores. This module does not write rows or register anything.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Literal

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


PromoteRule = Literal["grpo_unless_worse", "grpo", "sft"]


class Promotion(BaseModel):
    """Which checkpoint of a round goes on, and why."""

    choice: Literal["sft", "grpo"]
    code: str = Field(description="Reason code: grpo_not_worse, grpo_worse_than_margin, grpo_greedy_lower, "
                      "rule_grpo, rule_sft.")
    reason: str = Field(description="The reason in words, with the numbers.")
    gain_sampled: float = Field(description="GRPO's held-out sampled pass@1 minus SFT's.")
    gain_sampled_se: float = Field(description="Standard error of that difference (two binomial proportions).")
    gain_greedy: float = Field(description="GRPO's held-out greedy pass@1 minus SFT's.")


def choose_promotion(rule: PromoteRule, margin: float, *, sft_greedy: float, grpo_greedy: float,
                     sft_sampled: float, grpo_sampled: float, sft_n: int, grpo_n: int,
                     greedy_margin: float = 0.0) -> Promotion:
    """The promotion rule: 'grpo_unless_worse' keeps GRPO's checkpoint unless its held-out sampled pass@1 is below
    SFT's by more than `margin`, or its greedy pass@1 is below SFT's by more than `greedy_margin` (0: any drop);
    'grpo' / 'sft' always pick that one. sft_n / grpo_n: the sampled episodes scored (for the standard error of the
    gain, reported beside it)."""
    gain = grpo_sampled - sft_sampled
    se = (sft_sampled * (1 - sft_sampled) / max(1, sft_n) + grpo_sampled * (1 - grpo_sampled) / max(1, grpo_n)) ** 0.5
    nums = (f"held-out sampled pass@1 GRPO {grpo_sampled:.3f} vs SFT {sft_sampled:.3f} (gain {gain:+.3f} "
            f"+- {se:.3f}), greedy GRPO {grpo_greedy:.3f} vs SFT {sft_greedy:.3f}")
    common = {"gain_sampled": gain, "gain_sampled_se": se, "gain_greedy": grpo_greedy - sft_greedy}
    if rule == "grpo":
        return Promotion(choice="grpo", code="rule_grpo", reason=f"flywheel.promote = 'grpo': GRPO's; {nums}",
                         **common)
    if rule == "sft":
        return Promotion(choice="sft", code="rule_sft", reason=f"flywheel.promote = 'sft': SFT's; {nums}", **common)
    if gain < -margin:
        return Promotion(choice="sft", code="grpo_worse_than_margin",
                         reason=f"SFT's: GRPO is worse by more than the margin {margin:g}; {nums}", **common)
    if grpo_greedy < sft_greedy - greedy_margin - 1e-9:
        return Promotion(choice="sft", code="grpo_greedy_lower",
                         reason=f"SFT's: GRPO's greedy pass@1 is below SFT's by more than the greedy margin "
                                f"{greedy_margin:g}; {nums}", **common)
    return Promotion(choice="grpo", code="grpo_not_worse",
                     reason=f"GRPO's: not worse than SFT's by more than the margin {margin:g} (sampled) or "
                            f"{greedy_margin:g} (greedy); {nums}", **common)
