"""The `flywheel` commands that run the stage flows: `generate`, `run` (the flywheel), `curate`, `evaluate`, and
the `train` group (`sft`, `preflight`, `grpo`).

Each one builds the run config from its options, starts the local Prefect server early, checks its input, waits
for the server, then runs the flow and prints its summary. The flows and their heavy imports are loaded inside the
commands; this module holds no stage logic. flows/cli.py registers these commands on the app.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from flows.cli_options import (
    Config,
    Sets,
    UsageError,
    lake_root,
    load_cfg,
    print_dict,
    server_ready,
    start_server,
)

train_app = typer.Typer(no_args_is_help=True, help="Train a student: SFT on a snapshot, GRPO in sandboxes.")


def generate(
    config: Config = None,
    suite: Annotated[str | None, typer.Option(help="Suite name or task file.")] = None,
    split: Annotated[str | None, typer.Option(help="train or heldout.")] = None,
    n_tasks: Annotated[int | None, typer.Option("--n-tasks", help="Number of tasks.")] = None,
    samples: Annotated[int | None, typer.Option(help="Episodes per task.")] = None,
    difficulty: Annotated[int | None, typer.Option(help="Difficulty 1-3 of built-in suites.")] = None,
    teacher: Annotated[str | None, typer.Option(help="reference | openai | transformers | vllm.")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", help="OpenAI-compatible endpoint URL.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name (openai) or model folder (transformers).")] = None,
    backend: Annotated[str | None, typer.Option(help="Sandbox backend: docker, local or auto.")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Episodes in flight at once.")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id (reuse to resume).")] = None,
    out: Annotated[str | None, typer.Option(help="Lake root folder or URL.")] = None,
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
    start_server()
    from flows.generate import generate_flow, preflight, print_summary

    preflight(cfg)  # bad suite, endpoint or engine: one line before any file is written
    server_ready()
    summary = generate_flow(cfg)
    print_summary(summary)


def run(
    config: Config = None,
    rounds: Annotated[int | None, typer.Option(help="Number of rounds.")] = None,
    out: Annotated[str | None, typer.Option(help="Lake root folder or URL.")] = None,
    resume: Annotated[str | None, typer.Option(help="Continue run RUN_ID where it stopped (its saved config "
                                                       "is used).")] = None,
    backend: Annotated[str | None, typer.Option(help="Sandbox backend: docker, local or auto.")] = None,
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
    start_server()
    from flows.flywheel import flywheel_flow, preflight, print_summary

    if not resume:
        preflight(cfg)
    server_ready()
    print_summary(flywheel_flow(cfg, resume=bool(resume)))


def _saved_config_path(root: str, run_id: str) -> Path:
    if "://" in root and not root.startswith("file://"):
        raise UsageError("--resume reads the saved config from a local lake root; pass --out DIR")
    base = root.removeprefix("file://")
    p = Path(base) / "runs" / run_id / "config.toml"
    if not p.is_file():
        raise UsageError(f"run {run_id} has no saved config at {p}; check --resume RUN_ID and --out DIR")
    return p


def curate(
    run_id: Annotated[str, typer.Option("--run-id", help="Run whose rows are curated.")],
    round: Annotated[int, typer.Option(help="Round of the snapshot (rows of earlier rounds are candidates too).")] = 1,
    config: Config = None,
    out: Annotated[str | None, typer.Option(help="Lake root folder or URL.")] = None,
    demos: Annotated[list[str] | None, typer.Option(help="Human demo files to import first (repeatable).")] = None,
    set_: Sets = None,
) -> None:
    """Filter, de-duplicate, decontaminate and mix a run's rows into a training snapshot (Parquet manifest)."""
    sets = list(set_ or [])
    if demos:
        sets.append(f"curate.demo_paths={json.dumps(demos)}")
    cfg = load_cfg(config, out, sets)
    lake_root(cfg.run.out)
    start_server()
    from flows.curate import curate_flow

    server_ready()
    res = curate_flow(cfg, run_id, round)
    print_dict(res)
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
    out: Annotated[str | None, typer.Option(help="Lake root folder or URL.")] = None,
    set_: Sets = None,
) -> None:
    """SFT (TRL SFTTrainer, assistant-only loss, multi-turn with tools) of a model on a training snapshot."""
    cfg = load_cfg(config, out, set_)
    lake_root(cfg.run.out)
    start_server()
    from flows.train import train_sft_flow

    server_ready()
    print_dict(train_sft_flow(cfg, model, snapshot, run_id, round))


@train_app.command("preflight")
def train_preflight(
    snapshot: Annotated[str, typer.Option(help="Snapshot id (from `flywheel curate`).")],
    model: Annotated[str, typer.Option(help="Model folder or hub id whose tokenizer and template training uses.")],
    config: Config = None,
    out: Annotated[str | None, typer.Option(help="Lake root folder or URL.")] = None,
    strict: Annotated[bool, typer.Option(help="Exit 1 when any row drifts or a loss mask is wrong.")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the full report here (JSON).")] = None,
    set_: Sets = None,
) -> None:
    """Drift preflight: re-render a snapshot with the training template; compare with the stored token ids."""
    cfg = load_cfg(config, out, set_)
    lake_root(cfg.run.out)
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
    out: Annotated[str | None, typer.Option(help="Lake root folder or URL.")] = None,
    backend: Annotated[str | None, typer.Option(help="Sandbox backend: docker, local or auto.")] = None,
    set_: Sets = None,
) -> None:
    """GRPO (TRL GRPOTrainer) with our sandboxes as the environment and our verifiers as the reward."""
    cfg = load_cfg(config, out, set_, backend)
    start_server()
    from flows.train import train_grpo_flow

    server_ready()
    print_dict(train_grpo_flow(cfg, model, run_id, round))


def evaluate(
    model: Annotated[str, typer.Option(help="Model folder or hub id.")],
    config: Config = None,
    out: Annotated[str | None, typer.Option(help="Lake root folder or URL.")] = None,
    run_id: Annotated[str, typer.Option("--run-id", help="Run id recorded on the rows.")] = "eval",
    name: Annotated[str, typer.Option(help="Policy name recorded on the rows.")] = "eval",
    backend: Annotated[str | None, typer.Option(help="Sandbox backend: docker, local or auto.")] = None,
    set_: Sets = None,
) -> None:
    """Held-out pass@1 of a model on the schedule's suites (config [flywheel] suites), rows into the lake."""
    cfg = load_cfg(config, out, set_, backend)
    start_server()
    from flows.evaluate import evaluate_flow

    server_ready()
    for m in evaluate_flow(cfg, model, run_id=run_id, name=name):
        print(f"{m['suite']:>20}  pass@1 {m['value']:.1%}")
