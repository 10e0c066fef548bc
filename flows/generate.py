"""Prefect flow `generate`: tasks -> teacher episodes in sandboxes -> verified rows in the lake; and the teacher
stage of the flywheel's rounds (`stage_teacher`, `teacher_ahead`).

Wiring only: the suite comes from tasks/, the episodes from agents.rollout, the sandboxes from sandbox/, the writes
from warehouse.lake. Everything that can fail on bad input (suite, endpoint, engine) is checked before anything is
written. Rows are written in batches as episodes finish, so a kill loses at most the episodes in flight, and a
re-run with the same run id skips the rows already written.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from datetime import datetime, timezone
from functools import partial
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from pydantic import BaseModel, Field

from flows.artifacts import progress_callback
from flows.concurrency import ENDPOINT_RETRIES, default_limits, ensure_limits
from flows.config import FlywheelConfig, RunConfig, form_type
from flows.rollouts import (
    build_teacher,
    check_teacher_and_sandbox,
    joining_tasks,
    preflight_once,
    rollout_backend,
    rollout_rows,
    rollout_to_lake,
    synthesized_tasks,
    teacher_configs,
    teacher_name,
    train_pool,
)
from flows.runners import make_task_runner, submit_all
from flows.stages import Ledger, StageTimer, metric


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
    ran_on: list[str] = Field(default_factory=list, description=(
        "Where each rollout chunk ran, in chunk order, as host:pid: this process with the thread runner, Ray "
        "worker processes with run.ray_address."))


class ChunkResult(BaseModel):
    """What one rollout chunk reports back to the flow."""

    written: int
    skipped_existing: int
    ran_on: str = Field(description="host:pid of the process that ran the chunk")


def new_run_id(prefix: str = "run") -> str:
    return f"{prefix}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


@task(name="load-tasks")
def load_tasks(cfg: FlywheelConfig) -> list:
    from tasks.suites import load_suite

    g = cfg.generate
    return load_suite(g.suite, n=g.n_tasks, split=g.split, seed=cfg.run.seed, difficulty=g.difficulty)


@task(name="rollout", **ENDPOINT_RETRIES)
def rollout_task(cfg: FlywheelConfig, tasks: list, run_id: str, progress: Any = None) -> ChunkResult:
    """Run the episodes of one chunk of tasks; rows are made durable batch by batch.

    Retrying is safe: ids already written are skipped. Chunks run on the flow's task runner (threads here, Ray
    workers with --ray-address), each with its own slots and sandbox backend (flows/rollouts.py).
    """
    with rollout_backend(cfg, teacher_configs(cfg)) as backend:
        policy = build_teacher(cfg)
        res = rollout_to_lake(cfg, tasks, policy, run_id=run_id, round=cfg.generate.round,
                              samples=cfg.generate.samples, backend=backend, on_progress=progress)
    return ChunkResult(written=res.written, skipped_existing=res.skipped_existing,
                       ran_on=f"{socket.gethostname()}:{os.getpid()}")


# ---------------------------------------------------------------------------------------------------- flywheel


@task(name="teacher-rollout", **ENDPOINT_RETRIES)
def stage_teacher(cfg: FlywheelConfig, run_id: str, round: int) -> dict[str, Any]:
    """The flywheel's teacher stage: every train task of the suites joining this round (and of the tasks
    flywheel.synthesize admitted after the round before), and the earlier tasks that the student still fails (the
    curriculum); yield, hack rates and tokens into the rounds table."""
    from curate.curriculum import plan_curriculum
    from warehouse.lake import write_rows
    from warehouse.score import pass_rate, scored

    timer = StageTimer()
    new = synthesized_tasks(cfg, run_id, lambda joins: joins == round) + joining_tasks(cfg, round)
    earlier = train_pool(cfg, run_id, lambda joins: joins < round)
    chosen = new
    if earlier:
        # Suites the teacher already covered: only the tasks the student still fails get the teacher again.
        plan = plan_curriculum(cfg.run.out, cfg.curriculum.model_copy(update={"unseen_to_teacher": False}),
                               run_id=run_id, upto_round=round - 1, task_ids=[t.id for t in earlier])
        wanted = set(plan.teacher_tasks)
        chosen = new + [t for t in earlier if t.id in wanted]
    with rollout_backend(cfg, teacher_configs(cfg)) as backend:
        rows = rollout_rows(cfg, chosen, build_teacher(cfg), run_id=run_id, round=round,
                            samples=cfg.flywheel.teacher_samples, backend=backend)
    sc = scored(rows)
    m = partial(metric, run_id, round, "teacher", "teacher", "train", "all")
    metrics = [m("yield", pass_rate(rows)), m("tasks", len(chosen)), m("episodes", len(rows)),
               m("hack_rate", sum(r.verdict == "hack" for r in sc) / len(sc) if sc else 0.0),
               metric(run_id, round, "teacher", "stage", "-", "all", "wall_s", timer.s),
               metric(run_id, round, "teacher", "stage", "-", "all", "tokens",
                      sum(r.prompt_tokens + r.completion_tokens for r in rows))]
    codes: dict[str, int] = {}
    for r in sc:
        for c in r.hack_flags:
            codes[c] = codes.get(c, 0) + 1
    metrics += [m(f"hack:{c}", n / len(sc)) for c, n in sorted(codes.items())]
    write_rows(cfg.run.out, "rounds", metrics)
    return {"tasks": len(chosen), "episodes": len(rows), "wall_s": timer.s}


def teacher_ahead(cfg: FlywheelConfig, run_id: str, round: int) -> dict[str, Any]:
    """The teacher on the train tasks of the suites that join `round`. They depend on no student, so the flywheel
    runs this in a child process while the round before it trains (SFT holds one core, these rollouts the other).
    Rows land in the lake under `round`; that round's teacher stage then finds them written and skips them. The
    same slots and path as every rollout; no progress bar (the student's rollouts may draw theirs meanwhile), no
    Prefect task (it runs outside the flow, so no task retries: what it misses, round `round`'s stage runs)."""
    from warehouse.lake import write_rows

    timer = StageTimer()
    new = joining_tasks(cfg, round)
    with rollout_backend(cfg, teacher_configs(cfg)) as backend:
        rows = rollout_rows(cfg, new, build_teacher(cfg), run_id=run_id, round=round,
                            samples=cfg.flywheel.teacher_samples, backend=backend, progress=False)
    write_rows(cfg.run.out, "rounds", [metric(run_id, round, "teacher-ahead", "stage", "-", "all", "wall_s",
                                              timer.s)])
    return {"tasks": len(new), "episodes": len(rows), "wall_s": timer.s}


def teacher_ahead_process(cfg_json: str, run_id: str, round: int) -> dict[str, Any]:
    """teacher_ahead in a child process at low priority, recorded in the ledger. A process, not a thread: in a
    thread its rollouts held the GIL against SFT's Python (measured on 2 cores: SFT fell from ~6 to 1.2-1.7
    steps/s beside it, worse when the thread was niced, since a descheduled thread keeps the GIL); a niced
    process takes only the CPU that training leaves over."""
    try:
        os.nice(15)
    except OSError:  # not permitted: same priority, still correct
        pass
    cfg = FlywheelConfig.model_validate_json(cfg_json)
    ledger = Ledger(cfg.run.out, run_id)
    done = ledger.get(round, "teacher-ahead")
    return done if done is not None else ledger.done(round, "teacher-ahead", teacher_ahead(cfg, run_id, round))


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


def preflight(cfg: FlywheelConfig, *, recheck: bool = True) -> None:
    """Fail fast, before anything is written: suite, teacher endpoint(s), sandbox engine. recheck=False skips a
    config this process already passed (flows.rollouts.preflight_once)."""
    from tasks.suites import check_suite

    def check(c: FlywheelConfig) -> None:
        check_suite(c.generate.suite, c.generate.split, c.generate.n_tasks)
        check_teacher_and_sandbox(c)

    preflight_once("generate", cfg, check, recheck=recheck)


# The run form's plain parameters: the config keys' types and bounds (flows.config.RUN_PARAMETERS, form_type).
Suite, Split, NTasks, Samples = (form_type(f"generate.{k}") for k in ("suite", "split", "n_tasks", "samples"))
TeacherKind, Backend = form_type("teacher.kind"), form_type("sandbox.backend")


@flow(name="generate", log_prints=True, task_runner=make_task_runner(None, max_workers=RunConfig().max_workers))
def generate_flow(cfg: FlywheelConfig, suite: Suite | None = None, split: Split | None = None,
                  n_tasks: NTasks | None = None, samples: Samples | None = None,
                  teacher_kind: TeacherKind | None = None,
                  teacher_model: str | None = None, teacher_endpoint: str | None = None,
                  backend: Backend | None = None,
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
        overrides: Any other config key, as section.key=value (e.g. rollout.concurrency=4, run.run_id=gen-1),
            laid over the served config after the fields above.
    """
    from flows.serve import run_config_of

    cfg = run_config_of(cfg, "generate", {"suite": suite, "split": split, "n_tasks": n_tasks, "samples": samples,
                                          "teacher_kind": teacher_kind, "teacher_model": teacher_model,
                                          "teacher_endpoint": teacher_endpoint, "backend": backend}, overrides)
    from flows.config import save_config
    from warehouse.lake import compact
    from warehouse.score import pass_rate_of_counts

    t0 = time.perf_counter()
    preflight(cfg, recheck=False)  # the CLI checked this config already; other starts are checked here
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

    compact(root, run_id, g.round)  # one file per partition keeps queries fast (crash-safe: see warehouse.lake)
    from warehouse.query import query  # DuckDB: imported after the episodes, not before the first one

    rows = query(root, """
        SELECT policy, verdict, count(*) AS n FROM trajectories
        WHERE run_id = ? AND round = ? GROUP BY ALL ORDER BY ALL""", [run_id, g.round]).to_pylist()
    verdicts: dict[str, int] = {}
    by_policy: dict[str, dict[str, int]] = {}
    for r in rows:
        verdicts[r["verdict"]] = verdicts.get(r["verdict"], 0) + r["n"]
        by_policy.setdefault(r["policy"], {})[r["verdict"]] = r["n"]
    episodes = sum(verdicts.values())
    summary = GenerateSummary(
        run_id=run_id, round=g.round, root=str(root), suite=g.suite, split=g.split, policy=teacher_name(cfg),
        episodes=episodes, written=sum(r.written for r in results),
        skipped_existing=sum(r.skipped_existing for r in results), verdicts=verdicts, by_policy=by_policy,
        pass_rate=pass_rate_of_counts(verdicts), wall_s=time.perf_counter() - t0, config_path=config_path,
        ran_on=[r.ran_on for r in results])
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
    procs, hosts = set(s.ran_on), {r.rsplit(":", 1)[0] for r in s.ran_on}
    c.print(f"rows written {s.written}, already present {s.skipped_existing}; pass rate {s.pass_rate:.1%}; "
            f"{s.wall_s:.1f}s; {len(s.ran_on)} chunk(s) ran in {len(procs)} process(es) on {len(hosts)} host(s)"
            f"\nlake: {s.root}   config: {s.config_path}\n"
            f"query: flywheel sql --root {s.root} \"SELECT suite, split, avg(success::int) FROM trajectories "
            f"GROUP BY ALL\"")
