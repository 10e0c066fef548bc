"""Prefect flow `generate`: tasks -> teacher episodes in sandboxes -> verified rows in the lake.

Wiring only: the suite comes from tasks/, the episodes from agents.rollout, the sandboxes from sandbox/, the writes
from warehouse.lake. Everything that can fail on bad input (suite, endpoint, engine) is checked before anything is
written. Rows are written in batches as episodes finish, so a kill loses at most the episodes in flight, and a
re-run with the same run id skips the rows already written.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from pydantic import BaseModel, Field

from flows.artifacts import progress_callback
from flows.concurrency import ENDPOINT_RETRIES, default_limits, ensure_limits, rollout_slots
from flows.config import FlywheelConfig
from flows.runners import make_task_runner, submit_all


class GenerateSummary(BaseModel):
    run_id: str
    round: int
    root: str
    suite: str
    split: str
    policy: str
    episodes: int = 0
    written: int = 0
    skipped_existing: int = 0
    verdicts: dict[str, int] = Field(default_factory=dict)
    by_policy: dict[str, dict[str, int]] = Field(default_factory=dict)
    pass_rate: float = 0.0
    wall_s: float = 0.0
    config_path: str = ""


def new_run_id(prefix: str = "run") -> str:
    return f"{prefix}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


@task(name="load-tasks")
def load_tasks(cfg: FlywheelConfig) -> list:
    from tasks.suites import load_suite

    g = cfg.generate
    return load_suite(g.suite, n=g.n_tasks, split=g.split, seed=cfg.run.seed, difficulty=g.difficulty)


@task(name="rollout", **ENDPOINT_RETRIES)
def rollout_task(cfg: FlywheelConfig, tasks: list, run_id: str, progress: Any = None) -> dict[str, Any]:
    """Run the episodes of one chunk of tasks; rows are made durable batch by batch.

    Retrying is safe: ids already written are skipped. Chunks run on the flow's task runner (threads here, Ray
    workers with --ray-address), each with its own sandbox backend.
    """
    from agents.config import build_policy
    from agents.rollout import rollout
    from sandbox.backend import open_backend
    from warehouse.lake import existing_ids, write_trajectories

    g, root = cfg.generate, cfg.run.out
    counts = {"written": 0, "skipped": 0}

    def on_rows(rows: list) -> None:
        res = write_trajectories(root, rows)
        counts["written"] += res.written
        counts["skipped"] += res.skipped
        if progress is not None:
            progress(len(rows))

    with rollout_slots(cfg.limits, cfg.teacher, g.concurrency):
        policy = build_policy(cfg.teacher)
        try:
            with open_backend(cfg.sandbox, pool_size=min(g.concurrency, 8)) as backend:
                skip = existing_ids(root, run_id, g.round)
                if progress is not None and skip:
                    progress(len(skip & _planned_ids(tasks, policy.name, run_id, g.round, g.samples)))
                summary = asyncio.run(rollout(
                    tasks, [policy], backend, samples=g.samples, concurrency=g.concurrency, run_id=run_id,
                    round=g.round, skip_ids=skip, on_rows=on_rows, batch_size=g.batch_size,
                    infra_retries=g.infra_retries, max_turns=g.max_turns))
        finally:
            if progress is not None:
                progress.finish()
    return {"written": counts["written"], "skipped_existing": len(skip) + counts["skipped"],
            "summary": summary.model_dump() if hasattr(summary, "model_dump") else summary}


def _planned_ids(tasks: list, policy: str, run_id: str, round: int, samples: int) -> set[str]:
    from warehouse.record import trajectory_id

    return {trajectory_id(run_id, round, t.id, policy, i) for t in tasks for i in range(samples)}


def chunked(items: list, n: int) -> list[list]:
    """Split items into at most n contiguous, non-empty chunks of near-equal size."""
    n = max(1, min(n, len(items)))
    size, extra = divmod(len(items), n)
    out, i = [], 0
    for k in range(n):
        j = i + size + (1 if k < extra else 0)
        out.append(items[i:j])
        i = j
    return out


def preflight(cfg: FlywheelConfig) -> None:
    """Fail fast, before anything is written: suite, teacher endpoint, sandbox engine."""
    from agents.config import check_policy
    from sandbox.backend import check_backend
    from tasks.suites import check_suite

    check_suite(cfg.generate.suite)
    check_policy(cfg.teacher)
    check_backend(cfg.sandbox)


@flow(name="generate", log_prints=True, task_runner=make_task_runner(None, max_workers=2))
def generate_flow(cfg: FlywheelConfig, suite: str | None = None, split: str | None = None,
                  n_tasks: int | None = None, samples: int | None = None,
                  teacher_kind: Literal["reference", "openai", "transformers", "vllm"] | None = None,
                  teacher_model: str | None = None, teacher_endpoint: str | None = None,
                  backend: Literal["auto", "docker", "local"] | None = None,
                  overrides: list[str] | None = None) -> GenerateSummary:
    """Roll the teacher out on a suite and land verified trajectories in the lake.

    Args:
        cfg: The run's config: [generate] picks suite, split, tasks and samples, [teacher] the policy, [sandbox]
            the backend, [run] the lake root, run id (reuse it to resume) and task runner (ray_address). A
            deployment fills it with the served config and keeps it out of the run form.
        suite: Built-in suite name (arithmetic, ...) or a task file (.jsonl/.parquet).
        split: Split of the suite: train or heldout.
        n_tasks: How many tasks to draw from the suite.
        samples: Episodes per task.
        teacher_kind: What serves the teacher: reference (offline replay), openai, transformers or vllm.
        teacher_model: Served model name (openai/vllm) or model folder / hub id (transformers).
        teacher_endpoint: OpenAI-compatible base URL of the teacher, e.g. http://127.0.0.1:8000/v1.
        backend: Sandbox backend: auto (Docker when an engine answers, else local), docker or local.
        overrides: Any other config key, as section.key=value (e.g. generate.concurrency=4, run.run_id=gen-1),
            laid over the served config after the fields above.
    """
    from flows.serve import run_config_of

    cfg = run_config_of(cfg, "generate", {"suite": suite, "split": split, "n_tasks": n_tasks, "samples": samples,
                                          "teacher_kind": teacher_kind, "teacher_model": teacher_model,
                                          "teacher_endpoint": teacher_endpoint, "backend": backend}, overrides)
    from flows.config import save_config
    from warehouse.lake import compact
    from warehouse.query import query

    t0 = time.perf_counter()
    preflight(cfg)
    run_id = cfg.run.run_id or new_run_id("gen")
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"run_id": run_id})})
    logger = get_run_logger()
    root = cfg.run.out
    config_path = save_config(cfg, root, run_id)
    logger.info("run %s -> %s (config %s)", run_id, root, config_path)

    tasks = load_tasks(cfg)
    g = cfg.generate
    ensure_limits(default_limits(cfg.limits))
    chunk_list = chunked(tasks, g.chunks)
    calls = [{"cfg": cfg, "tasks": chunk, "run_id": run_id,
              "progress": progress_callback(len(chunk) * g.samples, key=f"rollout-progress-{i + 1}",
                                            description=f"generate {run_id}: chunk {i + 1}/{len(chunk_list)}")}
             for i, chunk in enumerate(chunk_list)]
    # Threads here, Ray workers with run.ray_address: chosen at run time, so UI-triggered runs can ask for Ray.
    results = submit_all(rollout_task, calls, ray_address=cfg.run.ray_address, max_workers=cfg.run.max_workers)
    out = {"written": sum(r["written"] for r in results),
           "skipped_existing": sum(r["skipped_existing"] for r in results)}

    compact(root, run_id, g.round)  # one file per partition keeps queries fast (crash-safe: see warehouse.lake)
    rows = query(root, """
        SELECT policy, verdict, count(*) AS n FROM trajectories
        WHERE run_id = ? AND round = ? GROUP BY ALL ORDER BY ALL""", [run_id, g.round]).to_pylist()
    verdicts: dict[str, int] = {}
    by_policy: dict[str, dict[str, int]] = {}
    for r in rows:
        verdicts[r["verdict"]] = verdicts.get(r["verdict"], 0) + r["n"]
        by_policy.setdefault(r["policy"], {})[r["verdict"]] = r["n"]
    episodes = sum(verdicts.values())
    scored = episodes - verdicts.get("infra_error", 0)
    summary = GenerateSummary(
        run_id=run_id, round=g.round, root=str(root), suite=g.suite, split=g.split, policy=cfg.teacher.name_or_kind(),
        episodes=episodes, written=out["written"], skipped_existing=out["skipped_existing"], verdicts=verdicts,
        by_policy=by_policy, pass_rate=(verdicts.get("pass", 0) / scored) if scored else 0.0,
        wall_s=time.perf_counter() - t0, config_path=config_path)
    create_table_artifact(
        key="generate-summary",
        table=[{"policy": p, "verdict": v, "episodes": n} for p, d in by_policy.items() for v, n in d.items()],
        description=f"generate {run_id}: {episodes} episodes, pass rate {summary.pass_rate:.1%}")
    return summary


def print_summary(s: GenerateSummary) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"generate {s.run_id}  ({s.suite}/{s.split}, round {s.round})")
    for col in ("policy", "n", "pass", "fail", "hack", "model_err", "timeout", "infra", "yield"):
        t.add_column(col, justify="right" if col != "policy" else "left", no_wrap=True)
    for p, d in sorted(s.by_policy.items()):
        n = sum(d.values())
        t.add_row(p, str(n), *(str(d.get(v, 0)) for v in ("pass", "fail", "hack", "model_error", "timeout",
                                                           "infra_error")),
                  f"{d.get('pass', 0) / n:.1%}" if n else "-")
    c = Console(width=max(100, Console().width))
    c.print(t)
    c.print(f"rows written {s.written}, already present {s.skipped_existing}; pass rate {s.pass_rate:.1%}; "
            f"{s.wall_s:.1f}s\nlake: {s.root}   config: {s.config_path}\n"
            f"query: flywheel sql --root {s.root} \"SELECT suite, split, avg(success::int) FROM trajectories "
            f"GROUP BY ALL\"")
