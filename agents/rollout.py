"""The rollout runner: many episodes at bounded concurrency, retried on infrastructure errors, delivered in batches.

`rollout(tasks, policies, backend, ...)` plans one episode per (task, sample index, policy) -- every policy of a
list, or the one a `Mixture` assigns -- with the deterministic id `trajectory_id(run_id, round, task.id,
policy.name, sample_index)`, skips ids in `skip_ids` (what the lake already holds: a run killed with kill -9 and
started again adds no duplicates), and runs the rest on `concurrency` worker coroutines (a bounded pool pulling from
one plan, so memory does not grow with the number of episodes), with a thread pool of the same size for the
episodes' blocking sandbox calls. An episode whose row has verdict infra_error is run
again after a jittered exponential backoff, up to `infra_retries` times, and the last row is kept (an infra_error
row that survives is delivered: it records the failure and is never scored); `RequestRejected` (a wrong key, model
or option) is not retried. Finished rows go to `on_rows` in batches of `batch_size` (or sooner, after
`flush_interval_s`), called in a worker thread one batch at a time: the flow writes each batch to the lake
atomically. An exception from `on_rows` stops the rollout (unwritten rows are redone on resume).
Returns a `RolloutSummary`: counts by verdict, by policy, and yield per policy (passes / scored episodes).
This module does not write files or choose policies' sampling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, Field

from agents.loop import run_episode
from agents.mixture import Mixture
from agents.policy import Policy
from sandbox.result import Backend
from tasks.spec import Task
from warehouse.record import SCORED_VERDICTS, Trajectory, trajectory_id

log = logging.getLogger(__name__)

NO_RETRY_ERROR_CLASSES = frozenset({"RequestRejected"})


class PolicyStats(BaseModel):
    episodes: int = 0
    verdicts: dict[str, int] = Field(default_factory=dict)
    passes: int = 0
    scored: int = 0
    yield_rate: float = Field(default=0.0, description="passes / scored episodes (infra_error excluded).")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    mean_latency_ms: float = 0.0


class RolloutSummary(BaseModel):
    run_id: str
    round: int
    planned: int = Field(description="Episodes in the plan (tasks x samples x policies), before skipping.")
    skipped: int = Field(description="Planned episodes whose id was in skip_ids.")
    episodes: int = Field(default=0, description="Rows produced by this call.")
    delivered: int = Field(default=0, description="Rows handed to on_rows.")
    retries: int = Field(default=0, description="Episode re-runs after an infra_error.")
    verdicts: dict[str, int] = Field(default_factory=dict)
    by_policy: dict[str, PolicyStats] = Field(default_factory=dict)
    wall_s: float = 0.0
    episodes_per_s: float = 0.0

    def add(self, row: Trajectory) -> None:
        self.episodes += 1
        self.verdicts[row.verdict] = self.verdicts.get(row.verdict, 0) + 1
        st = self.by_policy.setdefault(row.policy, PolicyStats())
        st.mean_latency_ms = (st.mean_latency_ms * st.episodes + row.latency_ms) / (st.episodes + 1)
        st.episodes += 1
        st.verdicts[row.verdict] = st.verdicts.get(row.verdict, 0) + 1
        st.passes += row.verdict == "pass"
        st.scored += row.verdict in SCORED_VERDICTS
        st.yield_rate = st.passes / st.scored if st.scored else 0.0
        st.prompt_tokens += row.prompt_tokens
        st.completion_tokens += row.completion_tokens
        st.cost_usd += row.cost_usd


Job = tuple[Task, int, Policy, str]


def plan(tasks: Iterable[Task], policies: Policy | Sequence[Policy] | Mixture, *, samples: int, run_id: str,
         round: int) -> list[Job]:
    """Every (task, sample index, policy, trajectory id) the rollout would run, in a stable order."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if isinstance(policies, Mixture):
        pick: Callable[[Task, int], list[Policy]] = lambda t, s: [policies.assign(t, s)]
    else:
        plist = [policies] if hasattr(policies, "reply") else list(policies)  # type: ignore[arg-type]
        if not plist:
            raise ValueError("no policy given; pass a policy, a list of policies or a Mixture")
        names = [p.name for p in plist]
        if len(set(names)) != len(names):
            raise ValueError(f"policy names must be unique (they are part of trajectory ids): {names}")
        pick = lambda t, s: plist
    jobs: list[Job] = []
    seen: set[str] = set()
    for task in tasks:
        for s in range(samples):
            for p in pick(task, s):
                tid = trajectory_id(run_id, round, task.id, p.name, s)
                if tid in seen:
                    raise ValueError(f"task id {task.id!r} appears twice in the task list; task ids must be unique")
                seen.add(tid)
                jobs.append((task, s, p, tid))
    return jobs


class _Progress:
    """rich progress bar on stderr (or nothing)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self._p: Any = None
        if enabled and total:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._p = Progress(TextColumn("rollout"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                               TextColumn("{task.fields[info]}"), console=Console(file=sys.stderr),
                               transient=False)
            self._task = self._p.add_task("rollout", total=total, info="")
            self._p.start()

    def advance(self, summary: RolloutSummary) -> None:
        if self._p is not None:
            info = " ".join(f"{k}={v}" for k, v in sorted(summary.verdicts.items()))
            self._p.update(self._task, advance=1, info=info)

    def stop(self) -> None:
        if self._p is not None:
            self._p.stop()


async def rollout(
    tasks: Iterable[Task],
    policies: Policy | Sequence[Policy] | Mixture,
    backend: Backend,
    *,
    run_id: str,
    round: int = 0,
    samples: int = 1,
    concurrency: int = 8,
    skip_ids: Iterable[str] = (),
    on_rows: Callable[[list[Trajectory]], Any] | None = None,
    batch_size: int = 32,
    flush_interval_s: float = 30.0,
    infra_retries: int = 2,
    retry_backoff_s: float = 1.0,
    max_turns: int = 8,
    tool_timeout_s: float | None = None,
    verify_kwargs: dict[str, Any] | None = None,
    progress: bool = True,
) -> RolloutSummary:
    """Run every planned episode not in skip_ids; see the module docstring. Returns the summary."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    t0 = time.perf_counter()
    skip = set(skip_ids)
    jobs = plan(tasks, policies, samples=samples, run_id=run_id, round=round)
    todo = [j for j in jobs if j[3] not in skip]
    summary = RolloutSummary(run_id=run_id, round=round, planned=len(jobs), skipped=len(jobs) - len(todo))
    it: Iterator[Job] = iter(todo)
    buffer: list[Trajectory] = []
    last_flush = time.monotonic()
    flush_lock = asyncio.Lock()
    bar = _Progress(progress, len(todo))

    async def flush(force: bool = False) -> None:
        nonlocal buffer, last_flush
        if not buffer or not (force or len(buffer) >= batch_size or time.monotonic() - last_flush >= flush_interval_s):
            return
        if flush_lock.locked() and not force:
            return  # the worker holding the lock flushes what is due, including these rows
        async with flush_lock:
            while buffer and (force or len(buffer) >= batch_size or time.monotonic() - last_flush >= flush_interval_s):
                batch, buffer = buffer[:batch_size], buffer[batch_size:]
                last_flush = time.monotonic()
                if on_rows is not None:
                    await asyncio.to_thread(on_rows, batch)
                summary.delivered += len(batch)

    async def one(task: Task, s: int, policy: Policy) -> Trajectory:
        attempt = 0
        while True:
            row = await run_episode(task, policy, backend, run_id=run_id, round=round, sample_index=s,
                                    max_turns=max_turns, tool_timeout_s=tool_timeout_s,
                                    verify_kwargs=verify_kwargs, executor=executor)
            if (row.verdict != "infra_error" or attempt >= infra_retries
                    or row.error_class in NO_RETRY_ERROR_CLASSES):
                return row
            attempt += 1
            summary.retries += 1
            delay = retry_backoff_s * 2 ** (attempt - 1) * random.uniform(0.5, 1.0)
            log.warning("episode %s sample %d (%s) hit infra_error %s: %s; retry %d/%d in %.1fs", task.id, s,
                        policy.name, row.error_class, row.error_message, attempt, infra_retries, delay)
            await asyncio.sleep(delay)

    distinct = {id(p): p for p in (policies.policies if isinstance(policies, Mixture) else
                                   [policies] if hasattr(policies, "reply") else policies)}  # type: ignore[union-attr]
    # A batching in-process policy (agents/transformers_policy.py) of a single-policy rollout is held in lockstep:
    # its batches wait for every worker, so which requests share a batch does not depend on timing.
    held = [p for p in distinct.values() if hasattr(p, "lockstep")] if len(distinct) == 1 else []

    async def worker() -> None:
        try:
            for task, s, policy, _tid in it:
                row = await one(task, s, policy)
                summary.add(row)
                buffer.append(row)
                bar.advance(summary)
                await flush()
        finally:
            for p in held:
                p.lockstep_done()

    # One thread per episode in flight for its blocking sandbox calls (the default executor has only cpus + 4).
    executor = ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(todo))) + 1,
                                  thread_name_prefix="flywheel-rollout")
    try:
        async with contextlib.AsyncExitStack() as stack:
            for p in distinct.values():
                if hasattr(p, "session"):  # per-loop resources (HTTP clients) live as long as this run
                    await stack.enter_async_context(p.session())
            workers = min(concurrency, len(todo))
            for p in held:
                p.lockstep(workers)
            async with asyncio.TaskGroup() as tg:
                for _ in range(workers):
                    tg.create_task(worker())
        while buffer:
            await flush(force=True)
    finally:
        bar.stop()
        executor.shutdown(wait=False, cancel_futures=True)
    summary.wall_s = time.perf_counter() - t0
    summary.episodes_per_s = summary.episodes / summary.wall_s if summary.wall_s > 0 else 0.0
    return summary


def summary_table(summary: RolloutSummary) -> str:
    """A plain-text table of the summary (verdicts and yield per policy)."""
    cols = ("pass", "fail", "hack", "model_error", "timeout", "infra_error")
    head = f"{'policy':<24}{'episodes':>9}" + "".join(f"{c:>12}" for c in cols) + f"{'yield':>8}{'cost $':>10}"
    lines = [head]
    for name, st in sorted(summary.by_policy.items()):
        lines.append(f"{name:<24}{st.episodes:>9}" + "".join(f"{st.verdicts.get(c, 0):>12}" for c in cols)
                     + f"{st.yield_rate:>8.1%}{st.cost_usd:>10.4f}")
    lines.append(f"{summary.episodes} episodes ({summary.skipped} skipped as already written, {summary.retries} "
                 f"infra retries) in {summary.wall_s:.1f}s = {summary.episodes_per_s:.2f} episodes/s")
    return "\n".join(lines)
