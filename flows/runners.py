"""Prefect task runners for the flows: a capped thread pool on one machine, Ray when a cluster address is given.

No home-made distribution: Ray's runner comes from the `prefect-ray` package (the `ray` extra), imported only
when asked for, with an error naming the install command when it is missing.

The runner is chosen per flow RUN from the run's own config (`run.ray_address`, `run.max_workers`), not per flow
definition: a served deployment loads the flow from its module in a fresh process, so a runner attached with
`flow.with_options(task_runner=...)` by the caller would not survive. `submit_all` opens the chosen runner inside
the running flow and submits Prefect tasks to it; the task runs are children of the flow run as with
`task.submit`. This module does not start or stop Ray clusters.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner


class RunnerError(RuntimeError):
    """The requested task runner cannot be used here; the message names the fix."""


def make_task_runner(ray_address: str | None = None, max_workers: int = 2) -> TaskRunner:
    """ThreadPoolTaskRunner(max_workers) (Prefect's default is unbounded), or RayTaskRunner on `ray_address`.

    `ray_address`: 'ray://host:10001' (Ray client), 'host:6379' (a cluster this machine belongs to), or 'auto'
    (the cluster `ray start` made on this machine). The runner connects to the cluster; it never starts one.
    """
    if max_workers < 1:
        raise RunnerError(f"max_workers must be >= 1 (got {max_workers}); set run.max_workers to 1 or more")
    if not ray_address:
        return ThreadPoolTaskRunner(max_workers=max_workers)
    try:
        from prefect_ray import RayTaskRunner
    except ImportError:
        raise RunnerError("--ray-address needs Ray's task runner: pip install 'flywheel[ray]' "
                          "(installs prefect-ray and ray)") from None
    # prefect-ray calls ray.init() with no address for 'auto', which would start a NEW local cluster; pass it as
    # a keyword so Ray looks the running cluster up instead (and fails when there is none).
    if ray_address == "auto":
        return RayTaskRunner(init_kwargs={"address": "auto"})
    return RayTaskRunner(address=ray_address)


def check_ray_address(ray_address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, not minutes, when nothing listens at a 'host:port' or 'ray://host:port' address (Ray's
    own connect retries for about a minute and then exits the process). 'auto' is left to Ray."""
    if ray_address == "auto":
        return
    hostport = ray_address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise RunnerError(f"run.ray_address {ray_address!r} is not host:port, ray://host:port or 'auto' "
                          "(e.g. 10.0.0.5:6379)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise RunnerError(f"no Ray cluster answers at {ray_address!r} ({e}); start one with `ray start --head "
                          f"--port {port}` or fix run.ray_address") from None


@contextmanager
def open_task_runner(ray_address: str | None = None, max_workers: int = 2) -> Iterator[TaskRunner]:
    """The runner of `make_task_runner`, started (Ray: connected) for the block and shut down after it.

    Connection errors surface here as RunnerError naming the address, before any task is submitted.
    """
    runner = make_task_runner(ray_address, max_workers)
    if ray_address:
        check_ray_address(ray_address)
    try:
        runner.__enter__()
    except (Exception, SystemExit) as e:  # noqa: BLE001 - ray.init raises many types, or exits
        raise RunnerError(f"cannot connect to the Ray cluster at {ray_address!r}: {type(e).__name__}: {e}; "
                          "start one with `ray start --head` or fix run.ray_address") from None
    try:
        yield runner
    finally:
        runner.__exit__(None, None, None)


def submit_all(task: Any, calls: list[dict[str, Any]], *, ray_address: str | None = None,
               max_workers: int = 2) -> list[Any]:
    """Run `task` once per keyword dict in `calls` on the runner the run's config asks for; results in order.

    Call it inside a flow: each call becomes a task run of the current flow run (threads here, Ray workers with
    `ray_address`). The first failed task raises its exception after every call has finished, so nothing is
    left running behind the flow.
    """
    if not calls:
        return []
    with open_task_runner(ray_address, max_workers) as runner:
        futures = [runner.submit(task, dict(params)) for params in calls]
        for f in futures:
            f.wait()
        return [f.result() for f in futures]


def resumable_task_options() -> dict[str, Any]:
    """`@task(**resumable_task_options())` for a stage whose result a re-run should reuse instead of recomputing
    (a finished curate/train/evaluate step of a round that crashed later): the result is persisted (Prefect's
    result storage: PREFECT_LOCAL_STORAGE_PATH, default ~/.prefect/storage; point it at a shared folder, or set
    PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK, when runs move between machines) and keyed by the task's inputs and
    source code, so the same inputs (config with the same run id and round) give a Cached state. Rollouts do not
    need it: the lake skips ids it already has."""
    from prefect.cache_policies import INPUTS, TASK_SOURCE

    return {"persist_result": True, "cache_policy": INPUTS + TASK_SOURCE}
