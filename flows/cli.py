"""The `flywheel` command line: thin typer wiring over the flows and the plain stage functions.

Every command has --help. Known bad input (config, suite, task file, endpoint, sandbox engine) ends in one line
`error: ...` that names the problem and the fix, and exit code 2; nothing half-written is left behind.
Heavy imports happen inside commands so that `--help` stays fast.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="flywheel: teacher rollouts in sandboxes -> verified trajectories -> SFT -> GRPO -> repeat.")
sandbox_app = typer.Typer(no_args_is_help=True, help="Run commands in sandboxes; build the sandbox image.")
tasks_app = typer.Typer(no_args_is_help=True,
                        help="Built-in suites and task files: list, show, validate, export, import, audit.")
demos_app = typer.Typer(no_args_is_help=True, help="Human demonstrations: import into the lake.")
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(tasks_app, name="tasks")
app.add_typer(demos_app, name="demos")
train_app = typer.Typer(no_args_is_help=True, help="Train a student: SFT on a snapshot, GRPO in sandboxes.")
app.add_typer(train_app, name="train")
server_app = typer.Typer(no_args_is_help=True, help="A local Prefect server (with UI) that every command reuses.")
app.add_typer(server_app, name="server")


class UsageError(Exception):
    """Bad command-line input detected here."""


# (module, class) of every error that means bad input or an unusable environment: one line, exit 2, not a bug.
KNOWN_ERRORS = (
    ("flows.config", "ConfigError"), ("flows.runners", "RunnerError"), ("flows.serve", "ServeError"),
    ("agents.policy", "PolicyError"), ("sandbox.result", "SandboxError"), ("tasks.suites", "UnknownSuiteError"),
    ("tasks.suites", "SuiteSizeError"),
    ("tasks.loaders", "TaskFileError"), ("tasks.judge.errors", "VerifierUnavailable"), ("warehouse.lakefs", "LakeError"),
    ("tasks.harbor", "HarborTaskError"), ("tasks.bfcl", "BfclError"), ("tasks.humaneval", "HumanEvalMissing"),
    ("warehouse.query", "QueryError"), ("warehouse.export", "ExportError"), ("warehouse.stats", "StatsError"),
    ("curate.demos", "DemoImportError"), ("curate.mixing", "SnapshotError"),
    ("flows.concurrency", "ConcurrencyError"), ("flows.artifacts", "ArtifactError"),
    ("flows.localserver", "LocalServerError"),
    ("training.registry", "RegistryError"), ("training.sft", "TrainingError"), ("training.tiny", "TinyModelError"),
    ("training.mismatch", "MismatchError"),
)


def _is_known(e: BaseException) -> bool:
    """Matched by (module, class name) along the MRO, so that no stage module is imported just to catch errors."""
    known = set(KNOWN_ERRORS) | {(__name__, "UsageError")}
    return any((c.__module__, c.__name__) in known for c in type(e).__mro__)


Config = Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML config file.")]
Sets = Annotated[Optional[list[str]], typer.Option("--set", help="Override a config key: section.key=value.")]


@app.command()
def generate(
    config: Config = None,
    suite: Annotated[Optional[str], typer.Option(help="Suite name or task file.")] = None,
    split: Annotated[Optional[str], typer.Option(help="train or heldout.")] = None,
    n_tasks: Annotated[Optional[int], typer.Option("--n-tasks", help="Number of tasks.")] = None,
    samples: Annotated[Optional[int], typer.Option(help="Episodes per task.")] = None,
    difficulty: Annotated[Optional[int], typer.Option(help="Difficulty 1-3 of built-in suites.")] = None,
    teacher: Annotated[Optional[str], typer.Option(help="reference | openai | transformers | vllm.")] = None,
    base_url: Annotated[Optional[str], typer.Option("--base-url", help="OpenAI-compatible endpoint URL.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model name (openai) or model folder (transformers).")] = None,
    backend: Annotated[Optional[str], typer.Option(help="Sandbox backend: docker, local or auto.")] = None,
    concurrency: Annotated[Optional[int], typer.Option(help="Episodes in flight at once.")] = None,
    run_id: Annotated[Optional[str], typer.Option("--run-id", help="Run id (reuse to resume).")] = None,
    out: Annotated[Optional[str], typer.Option(help="Lake root folder or URL.")] = None,
    set_: Sets = None,
) -> None:
    """Roll a teacher out on a task suite in sandboxes; write verified trajectories to the lake."""
    from flows.config import load_config

    overrides = list(set_ or [])
    for key, val in (("generate.suite", suite), ("generate.split", split), ("generate.n_tasks", n_tasks),
                     ("generate.samples", samples), ("generate.difficulty", difficulty),
                     ("teacher.kind", teacher), ("teacher.base_url", base_url), ("teacher.model", model),
                     ("sandbox.backend", backend), ("rollout.concurrency", concurrency),
                     ("run.run_id", run_id), ("run.out", out)):
        if val is not None:
            overrides.append(f"{key}={json.dumps(val)}")
    cfg = load_config(config, overrides)
    _start_server()
    from flows.generate import generate_flow, preflight, print_summary

    preflight(cfg)  # bad suite, endpoint or engine: one line before any file is written
    _server_ready()
    summary = generate_flow(cfg)
    print_summary(summary)


@app.command()
def run(
    config: Config = None,
    rounds: Annotated[Optional[int], typer.Option(help="Number of rounds.")] = None,
    out: Annotated[Optional[str], typer.Option(help="Lake root folder or URL.")] = None,
    resume: Annotated[Optional[str], typer.Option(help="Continue run RUN_ID where it stopped (its saved config "
                                                       "is used).")] = None,
    backend: Annotated[Optional[str], typer.Option(help="Sandbox backend: docker, local or auto.")] = None,
    set_: Sets = None,
) -> None:
    """The flywheel: rounds of teacher -> curate -> SFT -> GRPO -> student re-rollout, then the report."""
    from flows.config import load_config

    if resume:
        if config or rounds or set_ or backend:
            raise UsageError("--resume uses the run's saved config; drop --config/--rounds/--set/--backend")
        root = out or "runs/default"
        saved = _saved_config_path(root, resume)
        cfg = load_config(saved)
    else:
        overrides = list(set_ or [])
        for key, val in (("flywheel.rounds", rounds), ("run.out", out), ("sandbox.backend", backend)):
            if val is not None:
                overrides.append(f"{key}={json.dumps(val)}")
        cfg = load_config(config, overrides)
    _start_server()
    from flows.flywheel import flywheel_flow, preflight, print_summary

    if not resume:
        preflight(cfg)
    _server_ready()
    print_summary(flywheel_flow(cfg, resume=bool(resume)))


def _saved_config_path(root: str, run_id: str) -> Path:
    if "://" in root and not root.startswith("file://"):
        raise UsageError("--resume reads the saved config from a local lake root; pass --out DIR")
    base = root[len("file://"):] if root.startswith("file://") else root
    p = Path(base) / "runs" / run_id / "config.toml"
    if not p.is_file():
        raise UsageError(f"run {run_id} has no saved config at {p}; check --resume RUN_ID and --out DIR")
    return p


def _cfg(config: Optional[Path], out: Optional[str], set_: Optional[list[str]], backend: Optional[str] = None):
    from flows.config import load_config

    overrides = list(set_ or [])
    if out is not None:
        overrides.append(f"run.out={json.dumps(out)}")
    if backend is not None:
        overrides.append(f"sandbox.backend={json.dumps(backend)}")
    return load_config(config, overrides)


def _start_server() -> None:
    """With no PREFECT_API_URL: find the shared local Prefect server, or start it now (detached, in parallel with
    the checks and imports that follow); flows/localserver.py."""
    from flows import localserver

    localserver.start()


def _server_ready() -> None:
    """Wait for the server of `_start_server` to answer (and release slots that dead commands held)."""
    from flows import localserver

    localserver.wait_ready()


def _print_dict(d: dict) -> None:
    print(json.dumps(d, indent=1, default=str))


@app.command()
def curate(
    run_id: Annotated[str, typer.Option("--run-id", help="Run whose rows are curated.")],
    round: Annotated[int, typer.Option(help="Round of the snapshot (rows of earlier rounds are candidates too).")] = 1,
    config: Config = None,
    out: Annotated[Optional[str], typer.Option(help="Lake root folder or URL.")] = None,
    demos: Annotated[Optional[list[str]], typer.Option(help="Human demo files to import first (repeatable).")] = None,
    set_: Sets = None,
) -> None:
    """Filter, de-duplicate, decontaminate and mix a run's rows into a training snapshot (Parquet manifest)."""
    sets = list(set_ or [])
    if demos:
        sets.append(f"curate.demo_paths={json.dumps(demos)}")
    cfg = _cfg(config, out, sets)
    _lake_root(cfg.run.out)
    _start_server()
    from flows.curate import curate_flow

    _server_ready()
    res = curate_flow(cfg, run_id, round)
    _print_dict(res)
    _print_curation(cfg.run.out, res["snapshot_id"])


def _print_curation(root: str, snapshot_id: str) -> None:
    """The snapshot's counts by source, verdict and outcome, each contamination's rule and held-out task, every
    invalid demo and every task skipped for an unhealthy verifier, from its datasets row."""
    from warehouse.query import connect

    con = connect(root)
    try:
        got = con.execute("SELECT counts_json FROM datasets WHERE snapshot_id = ?", [snapshot_id]).fetchall()
    finally:
        con.close()
    counts = json.loads(got[0][0]) if got else {}
    print(f"{'source':<10}{'verdict':<13}{'outcome':<30}{'n':>6}")
    for c in counts.get("table", []):
        print(f"{c['source']:<10}{c['verdict']:<13}{c['outcome']:<30}{c['n']:>6}")
    for tid, why in sorted(counts.get("contamination", {}).items()):
        rule, _, held = why.partition(":")
        print(f"contaminated {tid}: rule {rule} against held-out task {held}")
    for err in counts.get("invalid_demos", []):
        print(f"invalid demo: {err}")
    for tid, why in sorted(counts.get("skipped_tasks", {}).items()):
        print(f"skipped task {tid}: verifier unhealthy ({why}); see flywheel tasks audit")
    if counts.get("unaudited_tasks"):
        print(f"{counts['unaudited_tasks']} task(s) have no verifier audit (flywheel tasks audit SUITE)")


@train_app.command("sft")
def train_sft(
    model: Annotated[str, typer.Option(help="Model folder or hub id to fine-tune.")],
    snapshot: Annotated[str, typer.Option(help="Snapshot id (from `flywheel curate`).")],
    run_id: Annotated[str, typer.Option("--run-id", help="Run the checkpoint is registered under.")],
    round: Annotated[int, typer.Option(help="Round the checkpoint is registered under.")] = 1,
    config: Config = None,
    out: Annotated[Optional[str], typer.Option(help="Lake root folder or URL.")] = None,
    set_: Sets = None,
) -> None:
    """SFT (TRL SFTTrainer, assistant-only loss, multi-turn with tools) of a model on a training snapshot."""
    cfg = _cfg(config, out, set_)
    _lake_root(cfg.run.out)
    _start_server()
    from flows.train import train_sft_flow

    _server_ready()
    _print_dict(train_sft_flow(cfg, model, snapshot, run_id, round))


@train_app.command("preflight")
def train_preflight(
    snapshot: Annotated[str, typer.Option(help="Snapshot id (from `flywheel curate`).")],
    model: Annotated[str, typer.Option(help="Model folder or hub id whose tokenizer and template training uses.")],
    config: Config = None,
    out: Annotated[Optional[str], typer.Option(help="Lake root folder or URL.")] = None,
    strict: Annotated[bool, typer.Option(help="Exit 1 when any row drifts or a loss mask is wrong.")] = False,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Also write the full report here (JSON).")] = None,
    set_: Sets = None,
) -> None:
    """Drift preflight: re-render a snapshot with the training template; compare with the stored token ids."""
    cfg = _cfg(config, out, set_)
    _lake_root(cfg.run.out)
    from training.preflight import preflight_snapshot

    report = preflight_snapshot(cfg.run.out, snapshot, model)
    for d in report.drifted:
        print(d.line())
    for p in report.mask_problems:
        print(p.line())
    s = report.summary()
    print(f"rows: {s['rows']}, with token ids: {s['with_ids']}, unverified (no ids): {s['unverified']}, "
          f"unrenderable: {s['unrenderable']}, template hash differs: {s['template_mismatch']}")
    print(f"drift: {s['drifted']} of {s['with_ids']} rows with token ids ({100 * s['drift_share']:.1f}%); refused "
          f"for RL: {s['drifted']} (fine for SFT)")
    print(f"loss mask: {s['mask_problems']} problem(s); {s['trained_outside_completion']} trained token(s) the "
          "model never generated")
    if json_out is not None:
        json_out.write_text(json.dumps({**s, "drifted_rows": [d.model_dump() for d in report.drifted],
                                        "mask_problem_rows": [p.model_dump() for p in report.mask_problems],
                                        "unrenderable_rows": report.unrenderable,
                                        "template_mismatch_rows": report.template_mismatch}, indent=1))
    if strict and not report.clean:
        print(f"error: snapshot {snapshot} is not token-exact for {model}: {s['drifted']} drifted row(s), "
              f"{s['mask_problems']} mask problem(s); fix: re-roll with the training template, or train SFT only",
              file=sys.stderr)
        raise typer.Exit(1)


@train_app.command("grpo")
def train_grpo(
    model: Annotated[str, typer.Option(help="Model folder or hub id to improve.")],
    run_id: Annotated[str, typer.Option("--run-id", help="Run the checkpoint is registered under.")],
    round: Annotated[int, typer.Option(help="Round: suites of the schedule up to it are used.")] = 1,
    config: Config = None,
    out: Annotated[Optional[str], typer.Option(help="Lake root folder or URL.")] = None,
    backend: Annotated[Optional[str], typer.Option(help="Sandbox backend: docker, local or auto.")] = None,
    set_: Sets = None,
) -> None:
    """GRPO (TRL GRPOTrainer) with our sandboxes as the environment and our verifiers as the reward."""
    cfg = _cfg(config, out, set_, backend)
    _start_server()
    from flows.train import train_grpo_flow

    _server_ready()
    _print_dict(train_grpo_flow(cfg, model, run_id, round))


@app.command()
def evaluate(
    model: Annotated[str, typer.Option(help="Model folder or hub id.")],
    config: Config = None,
    out: Annotated[Optional[str], typer.Option(help="Lake root folder or URL.")] = None,
    run_id: Annotated[str, typer.Option("--run-id", help="Run id recorded on the rows.")] = "eval",
    name: Annotated[str, typer.Option(help="Policy name recorded on the rows.")] = "eval",
    backend: Annotated[Optional[str], typer.Option(help="Sandbox backend: docker, local or auto.")] = None,
    set_: Sets = None,
) -> None:
    """Held-out pass@1 of a model on the schedule's suites (config [flywheel] suites), rows into the lake."""
    cfg = _cfg(config, out, set_, backend)
    _start_server()
    from flows.evaluate import evaluate_flow

    _server_ready()
    for m in evaluate_flow(cfg, model, run_id=run_id, name=name):
        print(f"{m['suite']:>20}  pass@1 {m['value']:.1%}")


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="SQL over views trajectories, messages, tool_calls, ...")],
    root: Annotated[str, typer.Option(help="Lake root folder or URL.")] = "runs/default",
    format: Annotated[str, typer.Option("--format", "-f", help="table | json (one array) | jsonl | csv | parquet.")] = "table",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="File to write (needed for parquet).")] = None,
) -> None:
    """Run SQL against the trajectory lake (in-memory DuckDB over the Parquet files)."""
    from warehouse.query import sql_command

    sql_command(root, query, format, str(output) if output else None)


Root = Annotated[str, typer.Option(help="Lake root folder or URL.")]


def _lake_root(root: str) -> str:
    """A local lake root must exist for read commands (a typo would otherwise read as an empty lake)."""
    if "://" not in root and not Path(root).is_dir():
        raise UsageError(f"lake root {root} does not exist; pass the --root (or --out) a run wrote to")
    return root


@app.command()
def export(
    out: Annotated[str, typer.Argument(help="Output: a .jsonl file, a datasets folder or an ATIF folder.")],
    root: Root = "runs/default",
    snapshot: Annotated[Optional[str], typer.Option(help="Export exactly this curated snapshot's rows and weights "
                                                         "(from `flywheel curate`): what training should read.")] = None,
    format: Annotated[str, typer.Option("--format", "-f", help="jsonl (TRL messages+tools), datasets, atif "
                                                             "(one ATIF v1.8 file per episode), dpo (TRL "
                                                             "prompt/chosen/rejected: a pass paired with a hack or "
                                                             "fail of the same task, round and policy) or kto "
                                                             "(prompt/completion/label of those pairs).")] = "jsonl",
    arguments: Annotated[Optional[str], typer.Option(help="Tool-call arguments: object (what chat templates "
                                                           "expect; jsonl default) or string (the OpenAI wire "
                                                           "form; datasets default).")] = None,
    metadata: Annotated[bool, typer.Option(help="Add trajectory id, run, round, source, suite, verdict, reward.")] = False,
    where: Annotated[Optional[str], typer.Option(help="SQL WHERE clause over the trajectories view.")] = None,
    verdict: Annotated[Optional[list[str]], typer.Option(help="Keep these verdicts (repeatable).")] = None,
    suite: Annotated[Optional[list[str]], typer.Option(help="Keep these suites (repeatable).")] = None,
    split: Annotated[Optional[list[str]], typer.Option(help="Keep these splits (repeatable).")] = None,
    source: Annotated[Optional[list[str]], typer.Option(help="Keep these sources (repeatable).")] = None,
    run_id: Annotated[Optional[list[str]], typer.Option("--run-id", help="Keep these runs (repeatable).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output.")] = False,
) -> None:
    """Export a curated snapshot (--snapshot) or lake rows to JSONL in TRL's messages-plus-tools format, a
    datasets folder or ATIF; or preference data (dpo, kto JSONL) with the rejected episode's reason codes."""
    from warehouse.export import export_command, export_snapshot

    if arguments not in (None, "object", "string"):
        raise UsageError(f"--arguments {arguments!r}: choose object or string")
    args_as = arguments or ("string" if format == "datasets" else "object")
    filters = {"--where": where, "--verdict": verdict, "--suite": suite, "--split": split, "--source": source,
               "--run-id": run_id}
    if snapshot is not None and format in ("dpo", "kto"):
        raise UsageError(f"--format {format} pairs episodes of the lake (passes with hacks and failures, which a "
                         "snapshot has filtered out); drop --snapshot and select with --run-id / --where")
    if snapshot is not None:
        used = [k for k, v in filters.items() if v]
        if used:
            raise UsageError(f"--snapshot exports exactly the snapshot's rows; drop {', '.join(used)} (curate "
                             "again with other settings to change what a snapshot holds)")
        res = export_snapshot(_lake_root(root), snapshot, out, format, arguments_as=args_as,  # type: ignore[arg-type]
                              metadata=metadata, overwrite=overwrite)
        print(f"wrote {res.n_rows} rows of snapshot {snapshot} to {res.path} ({res.fmt}, with weights)")
        return
    print("warning: exporting from the raw lake bypasses curation (no dedup, decontamination or hack filter); "
          "for training export a snapshot: flywheel export OUT --snapshot S", file=sys.stderr)
    res = export_command(_lake_root(root), out, format, where, verdict=verdict, suite=suite, split=split,
                         source=source, run_id=run_id, arguments_as=args_as,  # type: ignore[arg-type]
                         metadata=metadata, overwrite=overwrite)
    left = f"; {res.skipped} episodes without a partner left out" if res.fmt in ("dpo", "kto") else ""
    print(f"wrote {res.n_rows} rows to {res.path} ({res.fmt}{left})")


@app.command()
def stats(
    root: Root = "runs/default",
    by: Annotated[Optional[list[str]], typer.Option(help="Group by: suite, source, policy, round (repeatable).")] = None,
    where: Annotated[Optional[str], typer.Option(help="SQL WHERE clause over the trajectories view.")] = None,
    format: Annotated[str, typer.Option("--format", "-f", help="table or json.")] = "table",
) -> None:
    """Pass rate, verdicts, hack codes and tokens by suite, source, policy and round."""
    from warehouse.stats import stats_command

    stats_command(_lake_root(root), by=by, where=where, fmt=format)


@app.command()
def view(
    root: Root = "runs/default",
    port: Annotated[int, typer.Option(help="TCP port to listen on.")] = 8765,
    host: Annotated[str, typer.Option(help="Address to listen on; loopback only unless you mean to share.")] =
    "127.0.0.1",
) -> None:
    """Browse the lake in a web browser: runs, rounds, episodes, tasks and snapshots (read-only)."""
    from flows.view import ViewServerError, serve

    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: listening on {host}: anyone who can reach it can read every episode of the lake",
              file=sys.stderr)
    try:
        serve(_lake_root(root), host=host, port=port)
    except ViewServerError as e:
        raise UsageError(str(e)) from e


@app.command()
def verify(
    trajectories: Annotated[Path, typer.Option(help="JSONL file of trajectories (the record's messages format).")],
    tasks: Annotated[Optional[str], typer.Option(help="Task file (JSONL/Parquet) the trajectories refer to.")] = None,
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
    out: Annotated[Optional[str], typer.Option(help="Also write the tasks as a spec file (.jsonl or .parquet).")] = None,
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
    n: Annotated[Optional[int], typer.Option(help="How many tasks (the first N; default: all of a file, folder or "
                                                  "humaneval, 50 of a built-in suite).")] = None,
    k: Annotated[int, typer.Option(help="Re-grades of the oracle's final state (flakiness).")] = 3,
    workers: Annotated[int, typer.Option(help="Tasks audited at once.")] = 4,
    backend: Annotated[str, typer.Option(help="Sandbox backend: docker, local or auto.")] = "auto",
    json_out: Annotated[Optional[str], typer.Option("--json", help="Also write the rows as JSON to this file.")]
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


@demos_app.command("import")
def demos_import(
    paths: Annotated[list[str], typer.Argument(help="JSONL, Parquet or datasets folders of chat demos, or ATIF "
                                                    "files.")],
    root: Root = "runs/default",
    run_id: Annotated[str, typer.Option("--run-id", help="Run the demos belong to (curation of a run reads its own "
                                                         "rows).")] = "demos",
    suite: Annotated[str, typer.Option(help="Suite recorded on the rows.")] = "human",
    tools: Annotated[Optional[list[str]], typer.Option(help="Tools declared when a record has none.")] = None,
    strict: Annotated[bool, typer.Option(help="On an invalid record print only the first problem and the count.")]
    = False,
    allow_partial: Annotated[bool, typer.Option("--allow-partial", help="Import the valid records and skip the "
                                                                        "invalid ones (listed).")] = False,
    format: Annotated[str, typer.Option("--format", help="auto (by file type; a .json file is ATIF) or atif (ATIF "
                                                        "files, or folders of them).")] = "auto",
) -> None:
    """Validate and import human demonstrations as rows with source human (idempotent).

    A file with an invalid record imports nothing: every problem is listed (only the first with --strict) and the
    command exits 2; --allow-partial imports the valid records instead."""
    if strict and allow_partial:
        raise UsageError("--strict and --allow-partial contradict each other; pass one of them")
    from curate.demos import DemoImportError, import_demos

    try:
        res = import_demos(root, paths, run_id=run_id, suite=suite, default_tools=tools, strict=not allow_partial,
                           format=format)
    except DemoImportError as e:
        if not e.errors:  # an unreadable file: main() prints its one error line
            raise
        if not strict:
            for x in e.errors:
                print(f"invalid: {x}", file=sys.stderr)
        n = len({(x.file, x.where) for x in e.errors})
        print(f"error: {n} invalid record(s), nothing imported; first: {e.errors[0]}; fix them, or pass "
              "--allow-partial to import the valid ones", file=sys.stderr)
        raise typer.Exit(2) from None
    for e in res.errors:
        print(f"skipped: {e}", file=sys.stderr)
    print(f"imported {res.written}, already present {res.skipped}, skipped {res.rejected_records} invalid "
          f"record(s); run {run_id!r} of {root}")
    lacking: dict[str, int] = {}
    for r in res.rows:
        for m in json.loads(r.verifier_details_json).get("missing_evidence") or []:
            lacking[m] = lacking.get(m, 0) + 1
    if lacking:
        print("missing evidence (rows): " + ", ".join(f"{k} {v}" for k, v in sorted(lacking.items())))
    if run_id == "demos":
        print("note: curation of a run reads that run's rows; to train on these demos import them with --run-id RUN, "
              "or give the file to `flywheel curate --demos FILE` (config curate.demo_paths)")


@sandbox_app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sandbox_exec(
    ctx: typer.Context,
    backend: Annotated[str, typer.Option(help="docker, local or auto (docker if an engine answers).")] = "auto",
    timeout: Annotated[float, typer.Option(help="Wall-clock limit in seconds.")] = 10.0,
    memory: Annotated[int, typer.Option(help="Memory limit in MB (swap included).")] = 512,
    image: Annotated[Optional[str], typer.Option(help="Sandbox image tag.")] = None,
) -> None:
    """Run CMD in a fresh sandbox and print one JSON result: flywheel sandbox exec -- CMD [ARG...]."""
    from sandbox.backend import exec_once
    from sandbox.result import SandboxConfig

    argv = list(ctx.args)
    if not argv:
        raise UsageError("no command given; usage: flywheel sandbox exec [OPTIONS] -- CMD [ARG...]")
    kw = {"backend": backend, "timeout_s": timeout, "memory_mb": memory}
    if image:
        kw["image"] = image
    try:
        cfg = SandboxConfig(**kw)
    except Exception as e:  # pydantic ValidationError -> one line
        raise UsageError(f"bad sandbox option: {e.errors()[0]['loc'][0]}: {e.errors()[0]['msg']}") from None
    stdin = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
    result = exec_once(cfg, argv, stdin=stdin or None)
    print(result.model_dump_json())


@sandbox_app.command("build-image")
def sandbox_build_image(
    tag: Annotated[Optional[str], typer.Option(help="Image tag.")] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if the image exists.")] = False,
) -> None:
    """Build the sandbox image from Debian packages (no registry needed); reuse it when present."""
    from sandbox.image import build_image
    from sandbox.result import SandboxConfig

    image_id = build_image(tag or SandboxConfig().image, force=force)
    print(image_id)


@server_app.command("start")
def server_start(
    port: Annotated[Optional[int], typer.Option(help="Port on 127.0.0.1 (default: a free one).")] = None,
    idle_timeout: Annotated[Optional[float], typer.Option(
        "--idle-timeout", help="Seconds without API requests and client commands after which the server stops "
                               "itself (default FLYWHEEL_SERVER_IDLE_S or 900; 0: never).")] = None,
) -> None:
    """Start the local Prefect server (UI included) that commands without PREFECT_API_URL reuse; they also start
    it on first use. It outlives this command, found through PREFECT_HOME/flywheel-server.json."""
    from flows import localserver

    if os.environ.get("PREFECT_API_URL"):
        raise UsageError(f"PREFECT_API_URL is set ({os.environ['PREFECT_API_URL']}): commands use that server; "
                         "unset it to use a local one")
    if idle_timeout is not None and idle_timeout < 0:
        raise UsageError(f"--idle-timeout must be 0 (never) or more seconds, not {idle_timeout}")
    st = localserver.start_shared(port, idle_timeout)
    if port and not st["url"].endswith(f":{port}/api"):
        print(f"note: a local server runs already on {st['url']}; stop it first to use port {port}",
              file=sys.stderr)
    print(f"running: {st['url']} (pid {st['pid']}, log {st['log']}, {_idle_words(st)}); "
          f"UI: {st['url'].removesuffix('/api')}")


def _idle_words(st: dict) -> str:
    idle = float(st.get("idle_s") or 0)
    return f"stops after {idle:.0f} s idle" if idle else "no idle timeout"


@server_app.command("stop")
def server_stop() -> None:
    """Stop the local server and the warm starters of `generate` (and release nothing else: runs and slots are kept
    in PREFECT_HOME's database)."""
    from flows import localserver, warm

    users = localserver.live_clients()
    st = localserver.stop_shared()
    for w in warm.stop_starters():
        print(f"stopped: warm starter (pid {w['pid']})")
    if st and users:
        print(f"warning: stopped while {len(users)} command(s) used it (pid {', '.join(u.split('-')[0] for u in users)})",
              file=sys.stderr)
    print(f"stopped: {st['url']} (pid {st['pid']})" if st else "not running")


@server_app.command("status")
def server_status() -> None:
    """Whether the local server runs (exit 0, its URL and the warm starters) or not (exit 1)."""
    from flows import localserver

    st = localserver.shared_status()
    if not st:
        print("not running")
        raise typer.Exit(1)
    from flows import warm

    users = localserver.live_clients()
    print(f"running: {st['url']} (pid {st['pid']}, log {st['log']}, {_idle_words(st)}, {len(users)} client "
          "command(s))")
    for w in warm.starters():
        print(f"warm starter: pid {w['pid']}, fingerprint {w['fp'][:12]}, {'ready' if w.get('ready') else 'starting'}"
              f", log {w['log']}")


def _register_ops_commands() -> None:
    """Add `serve` and `deploy` (flows/serve.py) to the app, once."""
    if any(c.name == "serve" for c in app.registered_commands):
        return
    from flows.serve import deploy_command, serve_command

    app.command("serve")(serve_command)
    app.command("deploy")(deploy_command)


# `flywheel generate` defers flows/serve.py (its config models are most of this module's import time) to `_main`:
# the warm client of flows/warm.py needs none of it.
if sys.argv[1:2] != ["generate"]:
    _register_ops_commands()


def _usage_exit(e: BaseException) -> int:
    """A click usage error (typer's vendored click or the installed one): the usage line and hint as click shows
    them, then one `error:` line; its exit code (2 for usage errors)."""
    from typer._click.exceptions import NoArgsIsHelpError
    from typer._click.exceptions import UsageError as TyperUsageError

    if isinstance(e, NoArgsIsHelpError):  # a bare group: its help, exit 2 as click does
        e.show()
        return e.exit_code
    ctx = getattr(e, "ctx", None)
    if isinstance(e, TyperUsageError) and ctx is not None:
        hint = f"Try '{ctx.command_path} {ctx.help_option_names[0]}' for help." if ctx.help_option_names else ""
        print(ctx.get_usage(), file=sys.stderr)
        if hint:
            print(hint, file=sys.stderr)
    print(f"error: {e.format_message()}", file=sys.stderr)
    return e.exit_code


def main() -> None:
    """The console script: exit code 0 on success, 2 and one `error:` line on bad input or a usage error,
    130 when aborted; a traceback only for bugs. `generate` goes through a warm starter when one answers
    (flows/warm.py); when none does, it runs here and starts one at its end for the next command."""
    from flows import warm

    if not warm.eligible(sys.argv):
        return _main()
    env, path = dict(os.environ), list(sys.path)
    fp = warm.fingerprint(env, path)
    try:
        code = warm.run_warm(sys.argv, env, fp)
    except KeyboardInterrupt:
        print("aborted", file=sys.stderr)
        sys.exit(130)
    if code is not None:
        sys.exit(code)
    try:
        _main()
    except SystemExit as e:
        if e.code not in (0, None):
            raise  # a failed or aborted command leaves no starter behind
    try:
        warm.spawn_starter(env, path, fp)
    except OSError as e:  # the command's own result stands; the next one runs in-process too
        print(f"warning: could not start the warm starter of generate: {e}", file=sys.stderr)
    sys.exit(0)


def warm_starter() -> None:
    """The process of a warm starter of `generate` (spawned by flows/warm.py `spawn_starter`): it forks `main` for
    each client."""
    from flows import warm

    warm.boot(main)


def _main() -> None:
    _register_ops_commands()
    # This machine (and many clusters) has no route to Prefect's telemetry endpoint: do not try.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    import click
    from typer._click import exceptions as tclick

    try:
        # standalone_mode=False: typer.Exit(n) comes back as the return value, errors are raised to us
        rv = app(standalone_mode=False)
    except (typer.Abort, click.exceptions.Abort, KeyboardInterrupt):
        _stop_server_if_unused()
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except (tclick.ClickException, click.exceptions.ClickException) as e:
        _stop_server_if_unused()
        sys.exit(_usage_exit(e))
    except (typer.Exit, click.exceptions.Exit) as e:
        if e.exit_code:
            _stop_server_if_unused()
        sys.exit(e.exit_code)
    except Exception as e:
        _stop_server_if_unused()
        if _is_known(e):
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        raise
    if rv not in (None, 0):
        _stop_server_if_unused()
    sys.exit(rv if isinstance(rv, int) else 0)


def _stop_server_if_unused() -> None:
    """A command that failed stops the shared server it started, unless another command uses it."""
    mod = sys.modules.get("flows.localserver")
    if mod is not None:
        mod.stop_if_unused()


if __name__ == "__main__":
    main()
