"""The `flywheel` commands about tasks and their judging: `verify` (re-judge trajectories) and the `tasks` group
(`list`, `show`, `validate`, `export`, `import`, `audit`, `synthesize`).

Thin wiring over tasks/cli.py, agents/audit.py, curate/health.py and curate/synthesis.py, with tables printed by rich; no Prefect
server. flows/cli.py registers these commands on the app.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from flows.cli_options import (
    Root,
    UsageError,
)

tasks_app = typer.Typer(no_args_is_help=True,
                        help="Built-in suites and task files: list, show, validate, export, import, audit, "
                             "synthesize.")


def verify(
    trajectories: Annotated[Path, typer.Option(help="JSONL file of trajectories (the record's messages format).")],
    tasks: Annotated[str | None, typer.Option(help="Task file (JSONL/Parquet) the trajectories refer to.")] = None,
    backend: Annotated[str, typer.Option(help="Sandbox backend for code tasks: docker, local or auto.")] = "auto",
    workers: Annotated[int, typer.Option(help="Episodes judged at once (output keeps the input order).")] = 4,
) -> None:
    """Re-judge trajectories: one JSON line each with trajectory_id, verdict, reward, hack_flags and what failed."""
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig
    from tasks.cli import verify_trajectories

    if not trajectories.is_file():
        raise UsageError(f"trajectory file {trajectories} does not exist; pass a JSONL file to --trajectories")
    if workers < 1:
        raise UsageError(f"--workers must be at least 1, not {workers}")
    with open_backend(SandboxConfig(backend=backend), pool_size=max(2, min(workers, 8))) as be:
        verify_trajectories(str(trajectories), tasks_path=tasks, backend=be, workers=workers)


@tasks_app.command("list")
def tasks_list() -> None:
    """The built-in suites with their difficulty levels and tools."""
    from rich.console import Console
    from rich.table import Table

    from tasks.cli import tasks_list as _list

    infos = _list()
    t = Table(title="built-in suites")
    fields = list(type(infos[0]).model_fields) if infos else []
    for f in fields:
        t.add_column(f)
    for i in infos:
        t.add_row(*(str(getattr(i, f)) for f in fields))
    Console().print(t)


@tasks_app.command("show")
def tasks_show(
    source: Annotated[str, typer.Argument(help="Suite name or task file.")],
    n: Annotated[int, typer.Option(help="How many tasks.")] = 3,
    split: Annotated[str, typer.Option(help="train or heldout.")] = "train",
    seed: Annotated[int, typer.Option(help="Seed of built-in suites.")] = 0,
    difficulty: Annotated[int, typer.Option(help="Difficulty of built-in suites.")] = 1,
    format: Annotated[str, typer.Option(help="Task file format: auto, spec, gsm8k, mbpp or humaneval.")] = "auto",
) -> None:
    """Print the first N tasks of a suite or task file as JSON lines."""
    from tasks.cli import tasks_show as _show

    for t in _show(source, n=n, split=split, seed=seed, difficulty=difficulty, format=format):
        print(t.model_dump_json())


@tasks_app.command("validate")
def tasks_validate(path: Annotated[str, typer.Argument(help="Task file: JSONL, Parquet, GSM8K/MBPP/HumanEval.")],
                   format: Annotated[str, typer.Option(help="auto, spec, gsm8k, mbpp or humaneval.")] = "auto") -> None:
    """Check a task file; every problem is printed with file, line and field. Exit 2 when any."""
    from tasks.cli import tasks_validate as _validate

    report = _validate(path, format=format)
    if not report.ok:
        for p in report.problems:
            print(p, file=sys.stderr)
        print(f"error: {len(report.problems)} problem(s) in {path}; fix the lines above (or pass --format)",
              file=sys.stderr)
        raise typer.Exit(2)
    print(f"ok: {path}")


@tasks_app.command("export")
def tasks_export(
    source: Annotated[str, typer.Argument(help="Built-in suite name.")],
    out: Annotated[str, typer.Argument(help="Output .jsonl or .parquet task file.")],
    n: Annotated[int, typer.Option(help="How many tasks.")] = 50,
    split: Annotated[str, typer.Option(help="train or heldout.")] = "train",
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
    difficulty: Annotated[int, typer.Option(help="Difficulty.")] = 1,
) -> None:
    """Write built-in tasks to a task file (e.g. for `flywheel verify --tasks`)."""
    from tasks.cli import tasks_export as _export

    print(_export(source, out, n=n, split=split, seed=seed, difficulty=difficulty))


@tasks_app.command("import")
def tasks_import(
    kind: Annotated[str, typer.Argument(help="The task format: harbor.")],
    path: Annotated[str, typer.Argument(help="A Harbor task folder, or a folder of them.")],
    build: Annotated[bool, typer.Option(help="Build (or reuse) each task's image from environment/Dockerfile.")] = True,
    out: Annotated[str | None, typer.Option(help="Also write the tasks as a spec file (.jsonl or .parquet).")] = None,
) -> None:
    """Validate and load Harbor task folders (task.toml, instruction.md, environment/, tests/, solution/) and build
    their images; the folder is then a suite: flywheel generate --suite PATH."""
    from rich.console import Console
    from rich.table import Table

    from tasks.cli import tasks_import_harbor

    if kind != "harbor":
        raise UsageError(f"unknown task format {kind!r}; the one importable format is harbor: "
                         "flywheel tasks import harbor DIR")
    res = tasks_import_harbor(path, build=build, out=out)
    t = Table(title=f"{len(res.tasks)} Harbor task(s) from {path}")
    for col in ("task", "split", "image", "agent s", "verifier s", "memory MB", "cpus"):
        t.add_column(col)
    for task in res.tasks:
        h = task.metadata["harbor"]
        t.add_row(task.id, task.split, h["image"], str(h["agent_timeout_s"] or "-"), f"{h['verifier_timeout_s']:g}",
                  str(h["memory_mb"] or "-"), str(h["cpus"] or "-"))
    Console(width=160).print(t)
    if build:
        print(f"images: {len(res.built)} built, {len(res.reused)} reused")
    if res.out:
        print(f"wrote {res.out}")
    print(f"ok: run it with: flywheel generate --suite {path} --teacher reference --backend docker")


@tasks_app.command("audit")
def tasks_audit(
    source: Annotated[str, typer.Argument(help="Suite name, humaneval, a Harbor folder or a task file.")],
    root: Root = "runs/default",
    n: Annotated[int | None, typer.Option(help="How many tasks (the first N; default: all of a file, folder or "
                                                  "humaneval, 50 of a built-in suite).")] = None,
    k: Annotated[int, typer.Option(help="Re-grades of the oracle's final state (flakiness).")] = 3,
    workers: Annotated[int, typer.Option(help="Tasks audited at once.")] = 4,
    backend: Annotated[str, typer.Option(help="Sandbox backend: docker, local or auto.")] = "auto",
    json_out: Annotated[str | None, typer.Option("--json", help="Also write the rows as JSON to this file.")]
    = None,
    no_lake: Annotated[bool, typer.Option("--no-lake", help="Print only; write no verifier_health rows.")] = False,
    split: Annotated[str, typer.Option(help="Split of the suite (bfcl-multi-turn: heldout).")] = "train",
) -> None:
    """Audit each task's verifier: the oracle must pass, a null agent must fail, mutants of the oracle's code
    should fail, K re-grades must agree. Rows go to the lake's verifier_health table (flywheel sql reads it)."""
    from rich.console import Console
    from rich.table import Table

    from agents.audit import audit_tasks
    from curate.config import VerifierHealthConfig
    from curate.health import unhealthy_reason
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig
    from tasks.cli import tasks_show as _load
    from warehouse.lake import write_rows

    if (n is not None and n < 1) or k < 0 or workers < 1:
        raise UsageError(f"--n and --workers must be at least 1 and --k at least 0 (got n={n}, k={k}, "
                         f"workers={workers})")
    if n is None and source == "bfcl-multi-turn":  # all it loads
        from tasks.bfcl import load_entries

        n = len(load_entries()[0])
    builtin = not Path(source).exists() and source != "humaneval"
    tasks = _load(source, n=n if n is not None else (50 if builtin else sys.maxsize), split=split)
    if not tasks:
        raise UsageError(f"{source} holds no tasks; pass a suite name, humaneval, a Harbor folder or a task file")
    try:
        with open_backend(SandboxConfig(backend=backend), pool_size=max(2, min(2 * workers, 8))) as be:
            rows = audit_tasks(tasks, be, k=k, workers=workers)
    finally:
        if any(t.verifier.kind == "harbor" for t in tasks):
            from tasks.harbor import shutdown

            shutdown()
    th = VerifierHealthConfig()
    why = {r.task_id: unhealthy_reason(r.model_dump(), th) for r in rows}
    t = Table(title=f"verifier health of {len(rows)} task(s) from {source}")
    for col in ("task", "verifier", "oracle", "null", "mutants killed", "kill rate", "flake rate", "wall s",
                "healthy"):
        t.add_column(col)
    for r in rows:
        t.add_row(r.task_id, f"{r.verifier} v{r.verifier_version}", "pass" if r.oracle_pass else "FAIL",
                  "PASS" if r.null_pass else "fail", f"{r.mutants_killed}/{r.n_mutants}",
                  "-" if r.mutant_kill_rate is None else f"{r.mutant_kill_rate:.2f}", f"{r.flake_rate:.2f}",
                  f"{r.wall_s:.1f}", "yes" if why[r.task_id] is None else f"no: {why[r.task_id]}")
    Console(width=180).print(t)
    n_mut = sum(r.n_mutants for r in rows)
    killed = sum(r.mutants_killed for r in rows)
    bad = [tid for tid, w in why.items() if w is not None]
    print(f"oracle passes {sum(r.oracle_pass for r in rows)}/{len(rows)}; null agent passes "
          f"{sum(r.null_pass for r in rows)}/{len(rows)}; mutant kill rate "
          + (f"{killed}/{n_mut} = {killed / n_mut:.3f}" if n_mut else "- (no mutants)")
          + f"; flaky {sum(r.flake_rate > 0 for r in rows)}; unhealthy {len(bad)}"
          + (f": {', '.join(bad)}" if bad else ""))
    if json_out:
        Path(json_out).write_text(json.dumps([r.model_dump() for r in rows], indent=1) + "\n")
        print(f"wrote {json_out}")
    if not no_lake:
        path = write_rows(root, "verifier_health", [r.model_dump() for r in rows])
        print(f"wrote {len(rows)} verifier_health row(s) to {path}")


@tasks_app.command("synthesize")
def tasks_synthesize(
    out: Annotated[Path, typer.Option(help="Folder the admitted tasks are written to (one Harbor folder each).")],
    root: Root = "runs/default",
    writer: Annotated[str, typer.Option(help="reference (the procedural ledger family, offline) or openai.")]
    = "reference",
    n: Annotated[int, typer.Option(help="Candidates to write and judge.")] = 10,
    seed: Annotated[int, typer.Option(help="Seed of the reference family (candidate i depends on seed, i).")] = 0,
    start: Annotated[int, typer.Option(help="First candidate index of the reference family.")] = 0,
    k: Annotated[int, typer.Option(help="Re-grades of the oracle's final state (flakiness).")] = 3,
    workers: Annotated[int, typer.Option(help="Candidates audited at once.")] = 2,
    heldout: Annotated[list[str] | None, typer.Option(
        help="A suite, task file or Harbor folder whose held-out tasks no candidate may copy (repeatable; default: "
             "arithmetic, code, mathword).")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", help="openai writer: the endpoint URL.")] = None,
    model: Annotated[str | None, typer.Option(help="openai writer: the served model name.")] = None,
    seeds: Annotated[str | None, typer.Option(
        help="openai writer: a Harbor folder of seed tasks (default: 2 tasks of the reference family).")] = None,
    max_tokens: Annotated[int, typer.Option(help="openai writer: max completion tokens per task.")] = 4096,
    prompt_price: Annotated[float, typer.Option(help="openai writer: USD per 1M prompt tokens.")] = 0.0,
    completion_price: Annotated[float, typer.Option(help="openai writer: USD per 1M completion tokens.")] = 0.0,
    no_lake: Annotated[bool, typer.Option("--no-lake", help="Write no task_synthesis rows.")] = False,
) -> None:
    """Write N candidate tasks (reference family or an OpenAI-compatible writer) and admit only those whose verifier
    is healthy: it builds, the oracle passes on every re-grade, a null agent and the perturbed oracles fail, the
    instruction leaks neither the test nor the answer, no held-out task or admitted task is copied, the limits hold.
    Admitted tasks go to OUT as Harbor folders; one task_synthesis row per candidate goes to the lake."""
    import uuid

    from rich.console import Console
    from rich.table import Table

    from curate.synthesis import SynthesisConfig, load_heldout, synthesize
    from sandbox.backend import check_backend, open_backend
    from sandbox.result import SandboxConfig
    from tasks.factory.draft import Candidate
    from tasks.factory.ledger import FAMILY, ledger_drafts
    from warehouse.lake import write_rows

    if n < 1 or k < 1 or workers < 1 or start < 0:
        raise UsageError(f"--n, --k and --workers must be at least 1 and --start at least 0 (got n={n}, k={k}, "
                         f"workers={workers}, start={start})")
    if writer not in ("reference", "openai"):
        raise UsageError(f"unknown writer {writer!r}; choose --writer reference or --writer openai")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; pass a folder (it is created when missing)")
    try:
        cfg = SynthesisConfig(k=k, workers=workers, **({"heldout": heldout} if heldout else {}))
    except ValueError as e:
        raise UsageError(f"bad option: {e}") from None
    sid = f"synth-{uuid.uuid4().hex[:12]}"
    # before any writer request is paid for: the engine Harbor tasks need, and the held-out sources
    check_backend(SandboxConfig(backend="docker"))
    load_heldout(cfg)
    if writer == "reference":
        cands = [Candidate(candidate_id=f"ledger-{seed}-{d.metadata['index']}", writer="reference", family=FAMILY,
                           draft=d) for d in ledger_drafts(n, seed=seed, start=start)]
    else:
        from pydantic import ValidationError

        from agents.config import PolicyConfig, PriceTable

        try:
            policy_cfg = PolicyConfig(kind="openai", name="task-writer", base_url=base_url, model=model, seed=seed,
                                      max_tokens=max_tokens, price=PriceTable(prompt_per_1m=prompt_price,
                                                                              completion_per_1m=completion_price))
        except ValidationError as e:
            raise UsageError(f"--writer openai: {e.errors()[0]['msg']}") from None
        cands = _openai_candidates(policy_cfg, seeds, n=n)
    try:
        with open_backend(SandboxConfig(backend="docker"), pool_size=max(2, min(2 * workers, 8))) as be:
            res = synthesize(cands, cfg, out=out, backend=be, synthesis_id=sid)
    finally:
        from tasks.harbor import shutdown

        shutdown()
    t = Table(title=f"{len(res.rows)} candidate(s), {len(res.admitted)} admitted ({sid})")
    for col in ("candidate", "decision", "reasons", "oracle", "null", "perturbed killed", "flake", "audit s"):
        t.add_column(col)
    for r in res.rows:
        t.add_row(r.candidate_id, r.decision, ", ".join(r.reason_codes) or "-",
                  "-" if r.oracle_pass is None else ("pass" if r.oracle_pass else "FAIL"),
                  "-" if r.null_pass is None else ("PASS" if r.null_pass else "fail"),
                  "-" if r.n_perturbed is None else f"{r.perturbed_killed}/{r.n_perturbed}",
                  "-" if r.flake_rate is None else f"{r.flake_rate:.2f}", f"{r.audit_s:.1f}")
    Console(width=160).print(t)
    print("funnel: " + ", ".join(f"{code} {c}" for code, c in sorted(res.funnel().items())))
    for r in res.rows:
        if r.reason_codes:
            print(f"refused {r.candidate_id}: {', '.join(r.reason_codes)}" + (f" ({r.detail})" if r.detail else ""))
    if not no_lake:
        path = write_rows(root, "task_synthesis", [r.model_dump() for r in res.rows])
        print(f"wrote {len(res.rows)} task_synthesis row(s) to {path}")
    print(f"admitted {len(res.admitted)} of {len(res.rows)} to {out}")


def _openai_candidates(policy_cfg, seeds: str | None, *, n: int) -> list:
    """The openai writer's candidates (the project's OpenAI client, built from `policy_cfg`: its retries, timeouts
    and prices); UsageError for an unreachable endpoint or bad seeds."""
    from agents.config import build_policy
    from agents.openai_policy import OpenAIPolicy, check_endpoint
    from agents.policy import EndpointError
    from agents.task_writer import write_candidates
    from tasks.factory.draft import read_folder
    from tasks.factory.ledger import ledger_drafts

    try:
        check_endpoint(policy_cfg.base_url, policy_cfg.model)
    except EndpointError as e:
        raise UsageError(f"the writer's endpoint is not usable: {e}") from None
    if seeds:
        folder = Path(seeds)
        dirs = [folder] if (folder / "task.toml").is_file() else sorted(
            p for p in folder.iterdir() if (p / "task.toml").is_file()) if folder.is_dir() else []
        if not dirs:
            raise UsageError(f"--seeds {seeds} holds no Harbor task folder (task.toml); pass a folder of them")
        seed_drafts = [read_folder(d) for d in dirs]
    else:
        seed_drafts = ledger_drafts(2, seed=policy_cfg.seed)
    policy = build_policy(policy_cfg)
    assert isinstance(policy, OpenAIPolicy)
    # build_policy leaves the client's seed unset; the writer's request i carries seed + i, so an endpoint that
    # honours seeds proposes the same tasks again for the same --seed
    policy.seed = policy_cfg.seed
    return write_candidates(policy, seed_drafts, n=n)
