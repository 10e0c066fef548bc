"""Scoring a model on tasks: the one path of the flywheel's scoring stages (flows/evaluate.py) and the benchmarks.

A score is episodes through the real loop (tool calls in sandboxes, verifier and forensics) scored by the one
scorer (warehouse/score.py: infra_error excluded). `score_checkpoint` is what "the student scores X% on the
held-out split" means: greedy pass@1 (one episode per task, policy `NAME`), and with a `Sampling`, `k` episodes
per task at its temperature and seed (policy `NAME-tT`): their mean pass rate (sampled pass@1) and, for k > 1,
pass@k. The student generates with the `[student]` settings (`student_policy`), the episodes run with the
`[rollout]` knobs. Who runs the episodes is the caller's: the flows pass a runner that writes rows to the lake and
reads back an earlier attempt's (flows/rollouts.py), benchmarks `run_in_memory`, which keeps them in memory.
This module writes nothing, imports no Prefect, and decides nothing about promotion (training/promotion.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from agents.config import RolloutConfig
from sandbox.result import Backend
from tasks.spec import Task
from training.config import StudentConfig
from warehouse.record import Trajectory
from warehouse.score import SuiteScore, score_by_suite, scored

if TYPE_CHECKING:
    from agents.transformers_policy import TransformersPolicy
    from tasks.judge.api import JudgeConfig, RewardConfig

EpisodeRunner = Callable[[list[Task], Any, int], list[Trajectory]]
"""Runs every task `samples` times with a policy and returns the rows: `run(tasks, policy, samples)`."""


class Sampling(BaseModel):
    """The sampled part of a score: k episodes per task at a temperature, with a seed."""

    model_config = ConfigDict(extra="forbid")
    k: int = Field(ge=1, description="Episodes per task (flywheel.pass_k).")
    temperature: float = Field(gt=0, description="Sampling temperature (flywheel.sample_temperature).")
    seed: int = Field(description="Seed of the sampling policy (the flywheel: the round).")


class Scored(BaseModel):
    """One policy's episodes on the tasks, scored: pass@1 per suite label and over `all`."""

    policy: str
    scores: list[SuiteScore]
    rows: list[Trajectory] = Field(default_factory=list, repr=False)
    wall_s: float = Field(default=0.0, description="Seconds the episodes took.")
    cpu_s: float = Field(default=0.0, description="CPU seconds of this process meanwhile.")

    @property
    def pass_rate(self) -> float:
        """pass@1 over every scored episode; 0.0 when none is scored."""
        return next((s.value for s in self.scores if s.suite == "all"), 0.0)

    @property
    def mean_reward(self) -> float:
        """Mean reward over the scored episodes; 0.0 when none is scored."""
        s = scored(self.rows)
        return sum(r.reward for r in s) / len(s) if s else 0.0

    @property
    def verdicts(self) -> dict[str, int]:
        """Episodes per verdict, infra_error included."""
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.verdict] = out.get(r.verdict, 0) + 1
        return out


class CheckpointScore(BaseModel):
    """A checkpoint's score: greedy pass@1; with sampling, sampled pass@1 and (k > 1) pass@k of the same episodes."""

    greedy: Scored
    sampled: Scored | None = None
    pass_k: list[SuiteScore] = Field(default_factory=list, description="pass@k per suite (k > 1 only).")


def student_policy(student: StudentConfig, model: str | Path, name: str, *, temperature: float,
                   seed: int = 0) -> TransformersPolicy:
    """A model folder or hub id as a policy that generates with the `[student]` settings."""
    from agents.transformers_policy import TransformersPolicy

    return TransformersPolicy(model, name=name, temperature=temperature, max_new_tokens=student.max_new_tokens,
                              batch_size=student.batch_size, seed=seed, threads=student.threads,
                              enable_thinking=student.thinking, dtype=student.rollout_dtype)


def run_in_memory(backend: Backend, knobs: RolloutConfig, *, run_id: str, round: int,
                  rewards: RewardConfig | None = None, judge: JudgeConfig | None = None,
                  progress: bool = False) -> EpisodeRunner:
    """An episode runner that keeps the rows in memory: agents.rollout with the `[rollout]` knobs, the reward
    weights and the LLM judge config (as the flows' rollouts pass them)."""
    from agents.rollout import rollout

    def run(tasks: list[Task], policy: Any, samples: int) -> list[Trajectory]:
        rows: list[Trajectory] = []
        asyncio.run(rollout(tasks, policy, backend, run_id=run_id, round=round, samples=samples,
                            concurrency=knobs.concurrency, on_rows=rows.extend, batch_size=knobs.batch_size,
                            infra_retries=knobs.infra_retries, max_turns=knobs.max_turns, progress=progress,
                            verify_kwargs={"rewards": rewards, "judge_config": judge}))
        return rows

    return run


def score_policy(policy: Any, tasks: list[Task], *, run: EpisodeRunner, samples: int = 1) -> Scored:
    """`samples` episodes per task of any policy (a teacher, a student), scored: pass@1 per suite and `all`."""
    t0, c0 = time.perf_counter(), time.process_time()
    rows = run(tasks, policy, samples)
    return Scored(policy=policy.name, scores=score_by_suite(rows), rows=rows, wall_s=time.perf_counter() - t0,
                  cpu_s=time.process_time() - c0)


def score_sampled(model: str | Path, tasks: list[Task], *, student: StudentConfig, run: EpisodeRunner, name: str,
                  sampling: Sampling) -> Scored:
    """sampling.k episodes per task of the model at sampling.temperature (policy `name-tT`), scored."""
    policy = student_policy(student, model, f"{name}-t{sampling.temperature:g}", temperature=sampling.temperature,
                            seed=sampling.seed)
    return score_policy(policy, tasks, run=run, samples=sampling.k)


def score_checkpoint(model: str | Path, tasks: list[Task], *, student: StudentConfig, run: EpisodeRunner,
                     name: str, sampling: Sampling | None) -> CheckpointScore:
    """Greedy pass@1 of the model (policy `name`); with `sampling`, sampled pass@1 over sampling.k episodes per
    task (`score_sampled`) and, for k > 1, pass@k of those episodes."""
    greedy = score_policy(student_policy(student, model, name, temperature=0.0), tasks, run=run)
    if sampling is None:
        return CheckpointScore(greedy=greedy)
    sampled = score_sampled(model, tasks, student=student, run=run, name=name, sampling=sampling)
    return CheckpointScore(greedy=greedy, sampled=sampled,
                           pass_k=score_by_suite(sampled.rows, sampling.k) if sampling.k > 1 else [])
