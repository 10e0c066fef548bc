"""The one rollout-to-lake path of every stage (generate's chunks, the flywheel's teacher, baseline and student
stages, evaluate), and the tasks of the schedule they roll out on.

A stage opens `rollout_backend(cfg, policy_cfg)`: it holds the stage's Prefect concurrency slots (sandboxes, plus
the endpoint's requests or a GPU, flows/concurrency.py) and one sandbox backend for the block. Inside it
`rollout_to_lake` runs the episodes with the `[rollout]` knobs, skips ids already in the lake and writes rows in
batches as they finish; `rollout_rows` also reads back the rows an earlier attempt wrote, so a retried or resumed
stage scores the whole set. Retries of transient failures are the stage task's (`@task(**ENDPOINT_RETRIES)`);
the episode-level infra retries are the rollout's. This module builds no Prefect task and decides nothing about
what a stage rolls out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.concurrency import rollout_slots
from flows.config import FlywheelConfig, SuiteStep

if TYPE_CHECKING:
    from agents.config import PolicyConfig


def suite_tasks(step: SuiteStep, split: str, seed: int) -> list:
    """The tasks of one suite of the schedule, `train` or `heldout` split."""
    from tasks.suites import load_suite

    n = step.train_tasks if split == "train" else step.heldout_tasks
    return load_suite(step.suite, n=n, split=split, seed=seed, difficulty=step.difficulty)


def schedule_train_tasks(cfg: FlywheelConfig, joins: Callable[[int], bool] = lambda from_round: True) -> list:
    """The train tasks of the schedule's suites whose first round satisfies `joins` (default: every suite)."""
    return [t for step in cfg.flywheel.suites if joins(step.from_round)
            for t in suite_tasks(step, "train", cfg.run.seed)]


def synthesized_folder(cfg: FlywheelConfig, run_id: str, round: int) -> Path:
    """Where `flywheel.synthesize` puts the tasks it admitted after `round`: FOLDER/RUN_ID/round-R."""
    base = cfg.flywheel.synthesize.folder or f"{cfg.run.out.removeprefix('file://')}/synthesized"
    return Path(base) / run_id / f"round-{round}"


def synthesized_tasks(cfg: FlywheelConfig, run_id: str, joins: Callable[[int], bool]) -> list:
    """The tasks `flywheel.synthesize` admitted in this run whose first training round (the one after the round
    that asked for them) satisfies `joins`; suite `synthesized`, images built (reused when present)."""
    from tasks.harbor import is_harbor_dir, load_harbor

    if not cfg.flywheel.synthesize.enabled:
        return []
    out = []
    for r in range(1, cfg.flywheel.rounds):
        folder = synthesized_folder(cfg, run_id, r)
        if joins(r + 1) and is_harbor_dir(folder):
            out += [t.model_copy(update={"suite": "synthesized"}) for t in load_harbor(folder, build=True)]
    return out


def train_pool(cfg: FlywheelConfig, run_id: str, joins: Callable[[int], bool]) -> list:
    """Every train task whose first round satisfies `joins`: the schedule's, then the synthesized ones."""
    return schedule_train_tasks(cfg, joins) + synthesized_tasks(cfg, run_id, joins)


def joining_tasks(cfg: FlywheelConfig, round: int) -> list:
    """The train tasks of the suites that join the schedule in `round` (the teacher covers them whole)."""
    return schedule_train_tasks(cfg, lambda from_round: from_round == round)


def heldout_tasks(cfg: FlywheelConfig) -> list:
    """The held-out tasks of every suite of the schedule (every round scores on all of them)."""
    return [t for step in cfg.flywheel.suites for t in suite_tasks(step, "heldout", cfg.run.seed)]


def teacher_configs(cfg: FlywheelConfig) -> list[PolicyConfig]:
    """The teacher's policy configs: those of [teacher_mixture] when set, else [teacher]."""
    return list(cfg.teacher_mixture.policies) if cfg.teacher_mixture else [cfg.teacher]


def build_teacher(cfg: FlywheelConfig):
    """The teacher of every teacher stage: the Mixture of [teacher_mixture] when set, else the [teacher] policy."""
    from agents.config import build_policy
    from agents.mixture import mixture_from_config

    return mixture_from_config(cfg.teacher_mixture) if cfg.teacher_mixture else build_policy(cfg.teacher)


def teacher_name(cfg: FlywheelConfig) -> str:
    """The teacher's name on summaries: the policy's, or `mixture(a,b)`."""
    names = [c.name_or_kind() for c in teacher_configs(cfg)]
    return names[0] if not cfg.teacher_mixture else f"mixture({','.join(names)})"


def check_teacher_and_sandbox(cfg: FlywheelConfig) -> None:
    """Fail fast, before anything is written: every teacher policy (endpoint, model) and the sandbox engine."""
    from agents.config import check_policy
    from sandbox.backend import check_backend

    for c in teacher_configs(cfg):
        check_policy(c)
    check_backend(cfg.sandbox)


_PREFLIGHT_PASSED: set[tuple[str, str]] = set()


def preflight_once(kind: str, cfg: FlywheelConfig, check: Callable[[FlywheelConfig], None], *,
                   recheck: bool) -> None:
    """Run a stage's preflight `check` on cfg, or skip it when recheck is False and this process already passed
    the same check on the same config (its run id aside): the CLI checks before it starts the flow, so the flow
    does not check twice; a flow started any other way (a deployment run, a Python call) still checks."""
    key = (kind, cfg.model_dump_json(exclude={"run": {"run_id"}}))
    if recheck or key not in _PREFLIGHT_PASSED:
        check(cfg)
        _PREFLIGHT_PASSED.add(key)


def _policy_names(policy) -> list[str]:
    from agents.mixture import Mixture

    ps = policy.policies if isinstance(policy, Mixture) else policy if isinstance(policy, list) else [policy]
    return [p.name for p in ps]


@contextmanager
def rollout_backend(cfg: FlywheelConfig, policy_cfgs: list[PolicyConfig]) -> Iterator[Any]:
    """The slots of one rollout (rollout.concurrency sandboxes, and the endpoint's requests or a GPU for each
    policy of `policy_cfgs`; [] for a CPU policy such as the student) and a sandbox backend, for the block."""
    from sandbox.backend import open_backend

    n = cfg.rollout.concurrency
    with rollout_slots(cfg.limits, policy_cfgs, n):
        with open_backend(cfg.sandbox, pool_size=min(n, 8)) as backend:
            yield backend


@dataclass
class LakeRollout:
    """What one rollout wrote: the fresh rows, how many landed and how many were in the lake already."""

    fresh: list = field(default_factory=list)
    written: int = 0
    skipped_existing: int = 0
    summary: Any = None


def rollout_to_lake(cfg: FlywheelConfig, tasks: list, policy, *, run_id: str, round: int, samples: int,
                    backend, progress: bool = True, on_progress: Any = None) -> LakeRollout:
    """Run a policy (or a list, or a Mixture) over tasks through the real loop with the [rollout] knobs; skip the
    ids the lake has; write rows as batches finish. `on_progress(n)` (optional, with `.finish()`) counts rows."""
    from agents.rollout import plan, rollout
    from warehouse.lake import existing_ids, warm_writer, write_trajectories

    warm_writer()  # the first write's one-off import cost, paid while the first episodes run
    r = cfg.rollout
    skip = existing_ids(cfg.run.out, run_id, round)
    out = LakeRollout()

    def on_rows(rows: list) -> None:
        res = write_trajectories(cfg.run.out, rows)
        out.written += res.written
        out.skipped_existing += res.skipped
        out.fresh.extend(rows)
        if on_progress is not None:
            on_progress(len(rows))

    try:
        if on_progress is not None and skip:
            on_progress(sum(j[3] in skip for j in plan(tasks, policy, samples=samples, run_id=run_id,
                                                        round=round)))
        out.summary = asyncio.run(rollout(tasks, policy, backend, run_id=run_id, round=round, samples=samples,
                                          concurrency=r.concurrency, skip_ids=skip, on_rows=on_rows,
                                          batch_size=r.batch_size, infra_retries=r.infra_retries,
                                          max_turns=r.max_turns, progress=progress,
                                          verify_kwargs={"rewards": cfg.rewards, "judge_config": cfg.judge}))
    finally:
        if on_progress is not None:
            on_progress.finish()
    out.skipped_existing += out.summary.skipped
    return out


def rollout_rows(cfg: FlywheelConfig, tasks: list, policy, *, run_id: str, round: int, samples: int,
                 backend, progress: bool = True) -> list:
    """`rollout_to_lake`, then every row of the set: the fresh ones and those an earlier attempt wrote."""
    from warehouse.query import read_trajectories

    fresh = rollout_to_lake(cfg, tasks, policy, run_id=run_id, round=round, samples=samples, backend=backend,
                            progress=progress).fresh
    ids = {r.trajectory_id for r in fresh}
    old = [r for r in read_trajectories(cfg.run.out, "run_id = ? AND round = ? "
                                                     "AND list_contains(?::VARCHAR[], policy) "
                                                     "AND list_contains(?::VARCHAR[], task_id)",
                                        [run_id, round, _policy_names(policy), [t.id for t in tasks]])
           if r.trajectory_id not in ids]
    return fresh + old
