"""The `flywheel` commands that read or fill the lake without a Prefect server: `sql`, `export`, `stats`, `view`,
and the `demos` group (`import`).

Thin wiring over warehouse/ (queries, exports, stats), flows/view.py and curate/demos.py; they never start a server
nor import prefect. flows/cli.py registers these commands on the app.
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
    lake_root,
)

demos_app = typer.Typer(no_args_is_help=True, help="Human demonstrations: import into the lake.")


def sql(
    query: Annotated[str, typer.Argument(help="SQL over views trajectories, messages, tool_calls, ...")],
    root: Annotated[str, typer.Option(help="Lake root folder or URL.")] = "runs/default",
    format: Annotated[str, typer.Option("--format", "-f", help="table | json (one array) | jsonl | csv | parquet.")] = "table",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File to write (needed for parquet).")] = None,
) -> None:
    """Run SQL against the trajectory lake (in-memory DuckDB over the Parquet files)."""
    from warehouse.query import sql_command

    sql_command(root, query, format, str(output) if output else None)


def export(
    out: Annotated[str, typer.Argument(help="Output: a .jsonl file, a datasets folder or an ATIF folder.")],
    root: Root = "runs/default",
    snapshot: Annotated[str | None, typer.Option(help="Export exactly this curated snapshot's rows and weights "
                                                         "(from `flywheel curate`): what training should read.")] = None,
    format: Annotated[str, typer.Option("--format", "-f", help="jsonl (TRL messages+tools), datasets, atif "
                                                             "(one ATIF v1.8 file per episode), dpo (TRL "
                                                             "prompt/chosen/rejected: a pass paired with a hack or "
                                                             "fail of the same task, round and policy) or kto "
                                                             "(prompt/completion/label of those pairs) or openenv "
                                                             "(OpenEnv's training contract, RFC 012: engine token "
                                                             "ids, logprobs, loss masks).")] = "jsonl",
    arguments: Annotated[str | None, typer.Option(help="Tool-call arguments: object (what chat templates "
                                                           "expect; jsonl default) or string (the OpenAI wire "
                                                           "form; datasets default).")] = None,
    metadata: Annotated[bool, typer.Option(help="Add trajectory id, run, round, source, suite, verdict, reward.")] = False,
    where: Annotated[str | None, typer.Option(help="SQL WHERE clause over the trajectories view.")] = None,
    verdict: Annotated[list[str] | None, typer.Option(help="Keep these verdicts (repeatable).")] = None,
    suite: Annotated[list[str] | None, typer.Option(help="Keep these suites (repeatable).")] = None,
    split: Annotated[list[str] | None, typer.Option(help="Keep these splits (repeatable).")] = None,
    source: Annotated[list[str] | None, typer.Option(help="Keep these sources (repeatable).")] = None,
    run_id: Annotated[list[str] | None, typer.Option("--run-id", help="Keep these runs (repeatable).")] = None,
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
    if snapshot is not None and format in ("dpo", "kto", "openenv"):
        raise UsageError(f"--format {format} pairs episodes of the lake (passes with hacks and failures, which a "
                         "snapshot has filtered out); drop --snapshot and select with --run-id / --where")
    if snapshot is not None:
        used = [k for k, v in filters.items() if v]
        if used:
            raise UsageError(f"--snapshot exports exactly the snapshot's rows; drop {', '.join(used)} (curate "
                             "again with other settings to change what a snapshot holds)")
        res = export_snapshot(lake_root(root), snapshot, out, format, arguments_as=args_as,  # type: ignore[arg-type]
                              metadata=metadata, overwrite=overwrite)
        print(f"wrote {res.n_rows} rows of snapshot {snapshot} to {res.path} ({res.fmt}, with weights)")
        return
    print("warning: exporting from the raw lake bypasses curation (no dedup, decontamination or hack filter); "
          "for training export a snapshot: flywheel export OUT --snapshot S", file=sys.stderr)
    res = export_command(lake_root(root), out, format, where, verdict=verdict, suite=suite, split=split,
                         source=source, run_id=run_id, arguments_as=args_as,  # type: ignore[arg-type]
                         metadata=metadata, overwrite=overwrite)
    left = f"; {res.skipped} episodes without a partner left out" if res.fmt in ("dpo", "kto") else ""
    print(f"wrote {res.n_rows} rows to {res.path} ({res.fmt}{left})")


def stats(
    root: Root = "runs/default",
    by: Annotated[list[str] | None, typer.Option(help="Group by: suite, source, policy, round (repeatable).")] = None,
    where: Annotated[str | None, typer.Option(help="SQL WHERE clause over the trajectories view.")] = None,
    format: Annotated[str, typer.Option("--format", "-f", help="table or json.")] = "table",
) -> None:
    """Pass rate, verdicts, hack codes and tokens by suite, source, policy and round."""
    from warehouse.stats import stats_command

    stats_command(lake_root(root), by=by, where=where, fmt=format)


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
        serve(lake_root(root), host=host, port=port)
    except ViewServerError as e:
        raise UsageError(str(e)) from e


@demos_app.command("import")
def demos_import(
    paths: Annotated[list[str], typer.Argument(help="JSONL, Parquet or datasets folders of chat demos, or ATIF "
                                                    "files.")],
    root: Root = "runs/default",
    run_id: Annotated[str, typer.Option("--run-id", help="Run the demos belong to (curation of a run reads its own "
                                                         "rows).")] = "demos",
    suite: Annotated[str, typer.Option(help="Suite recorded on the rows.")] = "human",
    tools: Annotated[list[str] | None, typer.Option(help="Tools declared when a record has none.")] = None,
    strict: Annotated[bool, typer.Option(help="On an invalid record print only the first problem and the count.")]
    = False,
    allow_partial: Annotated[bool, typer.Option("--allow-partial", help="Import the valid records and skip the "
                                                                        "invalid ones (listed).")] = False,
    format: Annotated[str, typer.Option("--format", help="auto (by file type; a .json file is ATIF), atif (ATIF "
                                                        "files, or folders of them) or openenv (JSONL of OpenEnv "
                                                        "training-contract records, RFC 012).")] = "auto",
) -> None:
    """Validate and import human demonstrations as rows with source human, or OpenEnv rollouts (--format openenv)
    with source env and their token ids and logprobs (idempotent); either is judged like every episode.

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
