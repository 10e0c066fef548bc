"""Prefect global concurrency limits for scarce resources, and the retry options of tasks that touch them.

Three kinds of slots, shared by every flow run that talks to the same Prefect server (however many serve
processes, work-pool workers or Ray workers there are):
  - `flywheel-gpu`: one slot per GPU a training or in-process inference stage holds;
  - `flywheel-sandbox`: one slot per sandbox a rollout chunk keeps warm (its episode concurrency);
  - `flywheel-endpoint-<host>-<port>`: one slot per request a chunk may have in flight to that endpoint.
Limits are created when missing with the configured size (`ensure_limits`); `flywheel serve` also resets them
to the config at start (`update=True`); after that the UI (Concurrency page) is where an operator changes them.
A holder asking for more slots than a limit has fails at once with an error naming both numbers, instead of
waiting forever; one that has to wait logs the limit, its use and how to inspect or reset it. Slots are taken per
Prefect task (a rollout chunk), not per request: one API call per chunk, under a 60 s lease the holder renews, so
a holder that dies cannot keep them (flows/lease_reaper.py releases them at once for the CLI's own servers).

Retry options (`ENDPOINT_RETRIES`, `SANDBOX_RETRIES`) are keyword dicts for `@task(...)`: exponential backoff with
jitter, and retry only on transient infrastructure errors (an endpoint that did not answer, a sandbox engine
hiccup, a dropped connection), never on bad input or bugs, which would fail the same way again.
This module does not decide what a stage holds; the stage wiring calls `hold(...)` around its work. Importing it
does not import prefect (the config loader imports `LimitsConfig`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from agents.config import PolicyConfig

GPU = "flywheel-gpu"
SANDBOX = "flywheel-sandbox"
ENDPOINT_PREFIX = "flywheel-endpoint-"

LEASE_S = 60.0
"""Lease of held slots in seconds (Prefect's minimum; the holder renews it every 45 s): slots of a holder that
died come back this long after its last renewal, through the server's repossessor (within its 15 s loop)."""


class ConcurrencyError(RuntimeError):
    """A concurrency limit cannot be used as asked (too many slots, no server); the message names the fix."""


class LimitsConfig(BaseModel):
    """Sizes of the global concurrency limits (the `[limits]` config section)."""

    model_config = ConfigDict(extra="forbid")
    gpu_slots: int = Field(default=1, ge=0, description="GPUs that training and in-process inference may hold at "
                           "once, across all flow runs on this Prefect server (0 blocks every GPU stage).")
    sandbox_slots: int = Field(default=8, ge=0, description="Sandboxes that rollouts may keep open at once, across "
                               "all flow runs (each rollout holds rollout.concurrency of them).")
    endpoint_slots: int = Field(default=16, ge=0, description="Requests in flight to any ONE OpenAI-compatible "
                                "endpoint, across all flow runs (one limit per host:port, made on first use).")
    enabled: bool = Field(default=True, description="Take slots from the Prefect server's global concurrency "
                          "limits; off: no limits are created or taken (single-user runs).")


def endpoint_limit_name(base_url: str) -> str:
    """`flywheel-endpoint-<host>-<port>` for an endpoint URL (path and scheme ignored; one limit per server)."""
    parts = urlsplit(base_url if "//" in base_url else f"http://{base_url}")
    if not parts.hostname:
        raise ConcurrencyError(f"endpoint URL {base_url!r} has no host; use e.g. http://127.0.0.1:8000/v1")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return ENDPOINT_PREFIX + re.sub(r"[^a-z0-9]+", "-", f"{parts.hostname.lower()}-{port}").strip("-")


def default_limits(cfg: LimitsConfig) -> dict[str, int]:
    return {GPU: cfg.gpu_slots, SANDBOX: cfg.sandbox_slots}


def ensure_limits(limits: dict[str, int], *, update: bool = False) -> dict[str, int]:
    """Create each named global concurrency limit that is missing; with `update`, also set existing ones to the
    given size. Returns name -> the size now in force on the server."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    out: dict[str, int] = {}
    with get_client(sync_client=True) as client:
        for name, size in limits.items():
            try:
                cur = client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                cur = None
            if cur is None:
                try:
                    client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=size))
                except ObjectAlreadyExists:  # another process made it between our read and create
                    cur = client.read_global_concurrency_limit_by_name(name)
                    out[name] = cur.limit
                    continue
                out[name] = size
            elif update and (cur.limit != size or not cur.active):
                client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=size, active=True))
                out[name] = size
            else:
                out[name] = cur.limit
    return out


@contextmanager
def hold(name: str, occupy: int, *, default_limit: int, timeout_s: float | None = None) -> Iterator[None]:
    """Hold `occupy` slots of the global limit `name` for the block (waits for them; `timeout_s` bounds the wait).

    The limit is created with `default_limit` slots when missing. Asking for more slots than the limit has raises
    ConcurrencyError at once (it could never be granted). occupy == 0 holds nothing.
    """
    from prefect.concurrency.sync import concurrency

    if occupy <= 0:
        yield
        return
    size = ensure_limits({name: default_limit})[name]
    if occupy > size:
        raise ConcurrencyError(
            f"this task needs {occupy} slots of the concurrency limit {name!r}, which has {size}; raise the limit "
            f"(config [limits], or the Prefect UI's Concurrency page) or lower what the task holds")
    _say_if_waiting(name, occupy)
    with concurrency(name, occupy=occupy, timeout_seconds=timeout_s, strict=True, lease_duration=LEASE_S):
        yield


def _say_if_waiting(name: str, occupy: int) -> None:
    """Log, before blocking, which limit the task waits on and how to inspect or reset it."""
    import logging

    from prefect import get_run_logger
    from prefect.client.orchestration import get_client
    from prefect.exceptions import MissingContextError

    with get_client(sync_client=True) as client:
        cur = client.read_global_concurrency_limit_by_name(name)
    if cur.active_slots + occupy <= cur.limit:
        return
    try:  # in a run: into its log, shown in the UI
        log = get_run_logger()
    except MissingContextError:
        log = logging.getLogger("flywheel.concurrency")
    log.warning(
        "waiting for %d slot(s) of concurrency limit %r: %d of %d are taken. Inspect: `prefect gcl inspect %s` "
        "(or the UI's Concurrency page). Slots of a holder that died come back within %.0f s of its last lease "
        "renewal; `flywheel` commands with their own temporary server release a dead command's slots at start. "
        "Reset by hand only when no run holds any: `prefect gcl update %s --active-slots 0`.",
        occupy, name, cur.active_slots, cur.limit, name, LEASE_S + 15, name)


def gpu_slot(limits: LimitsConfig, n: int = 1, timeout_s: float | None = None):
    """Hold n GPU slots (training, in-process inference); a no-op when limits are disabled."""
    return hold(GPU, n, default_limit=limits.gpu_slots, timeout_s=timeout_s) if limits.enabled else _nothing()


def sandbox_slots(limits: LimitsConfig, n: int, timeout_s: float | None = None):
    """Hold n sandbox slots (a rollout chunk with n episodes in flight); a no-op when limits are disabled."""
    return hold(SANDBOX, n, default_limit=limits.sandbox_slots, timeout_s=timeout_s) if limits.enabled \
        else _nothing()


def endpoint_slots(limits: LimitsConfig, base_url: str, n: int, timeout_s: float | None = None):
    """Hold n request slots of the endpoint at base_url; a no-op when limits are disabled."""
    if not limits.enabled:
        return _nothing()
    return hold(endpoint_limit_name(base_url), n, default_limit=limits.endpoint_slots, timeout_s=timeout_s)


@contextmanager
def rollout_slots(limits: LimitsConfig, policy_cfg: PolicyConfig | Sequence[PolicyConfig], n_in_flight: int,
                  timeout_s: float | None = None) -> Iterator[None]:
    """The slots a rollout holds: n sandboxes, plus n requests of each `openai` policy's endpoint (one limit per
    host:port, however many policies share it), and one GPU per `vllm` policy (in-process engine). `reference`
    and `transformers` (CPU) policies hold no policy slot; a mixture of teachers passes all its policies."""
    cfgs = [policy_cfg] if not isinstance(policy_cfg, Sequence) else list(policy_cfg)
    endpoints = sorted({c.base_url for c in cfgs if c.kind == "openai" and c.base_url}, key=endpoint_limit_name)
    with ExitStack() as stack:
        stack.enter_context(sandbox_slots(limits, n_in_flight, timeout_s))
        for url in {endpoint_limit_name(u): u for u in endpoints}.values():
            stack.enter_context(endpoint_slots(limits, url, n_in_flight, timeout_s))
        if gpus := sum(c.kind == "vllm" for c in cfgs):
            stack.enter_context(gpu_slot(limits, gpus, timeout_s))
        yield


@contextmanager
def _nothing() -> Iterator[None]:
    yield


# --- retries ---------------------------------------------------------------------------------------------------

def _transient(exc: BaseException) -> bool:
    """True for errors that another attempt may not hit: an endpoint that did not answer, a sandbox engine
    hiccup, a dropped connection or a timeout. False for rejected requests, unusable backends and bugs."""
    from agents.policy import EndpointError, RequestRejected
    from sandbox.result import SandboxError, SandboxUnavailable

    if isinstance(exc, (RequestRejected, SandboxUnavailable)):
        return False
    return isinstance(exc, (EndpointError, SandboxError, ConnectionError, TimeoutError))


def retry_on_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect `retry_condition_fn`: retry a failed task run only when its exception is transient."""
    exc = getattr(state, "data", None)
    if not isinstance(exc, BaseException):
        try:
            state.result(raise_on_failure=True)
        except BaseException as e:  # noqa: BLE001 - we classify whatever the state holds
            exc = e
        else:
            return False
    return _transient(exc)


ENDPOINT_RETRIES: dict[str, Any] = {
    "retries": 3,
    "retry_delay_seconds": [10, 20, 40],  # exponential backoff; jitter below
    "retry_jitter_factor": 0.5,
    "retry_condition_fn": retry_on_transient,
}
"""`@task(**ENDPOINT_RETRIES)` for tasks that call an endpoint (rollouts with an openai teacher, evaluation)."""

SANDBOX_RETRIES: dict[str, Any] = {
    "retries": 2,
    "retry_delay_seconds": [5, 10],
    "retry_jitter_factor": 0.5,
    "retry_condition_fn": retry_on_transient,
}
"""`@task(**SANDBOX_RETRIES)` for tasks that only need sandboxes (reference-teacher rollouts, verification)."""
