"""Summaries of the lake people look at: pass rate, verdict counts, hack codes and tokens, overall and by suite,
source, policy and round.

compute_stats returns plain data (StatsTable: title, columns, rows); render_stats draws it with rich;
stats_command is the `flywheel stats` entry point. Pass rate = pass / scored, where scored excludes infra_error
(the infrastructure's failures are retried, never scored 0). This module does not write anything.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from warehouse.query import QueryError, query
from warehouse.record import VERDICTS
from warehouse.score import PASS_RATE_SQL

DIMENSIONS: tuple[str, ...] = ("suite", "source", "policy", "round")
_ALLOWED_DIMENSIONS = DIMENSIONS + ("split", "run_id", "task_id", "verifier", "sandbox_backend", "difficulty")


class StatsError(Exception):
    """Bad stats request: unknown dimension or bad WHERE clause."""


@dataclass(frozen=True)
class StatsTable:
    title: str
    columns: list[str]
    rows: list[list[Any]]

    def as_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r, strict=True)) for r in self.rows]


def _metrics_sql() -> str:
    verdicts = ", ".join(f"count(*) FILTER (WHERE verdict = '{v}') AS \"{v}\"" for v in VERDICTS)
    return (
        "count(*) AS n, "
        "count(*) FILTER (WHERE verdict <> 'infra_error') AS scored, "
        f"round({PASS_RATE_SQL}, 4) AS pass_rate, "
        f"{verdicts}, "
        "count(*) FILTER (WHERE len(hack_flags) > 0) AS flagged, "
        "sum(prompt_tokens)::BIGINT AS prompt_tokens, sum(completion_tokens)::BIGINT AS completion_tokens, "
        "round(avg(prompt_tokens + completion_tokens), 1) AS tokens_per_traj"
    )


def _table(root: str, title: str, sql: str) -> StatsTable:
    try:
        t = query(root, sql)
    except QueryError as e:
        raise StatsError(f"{title}: {e}") from e
    cols = t.column_names
    return StatsTable(title=title, columns=cols, rows=[[r[c] for c in cols] for r in t.to_pylist()])


def compute_stats(root: str, by: Sequence[str] = DIMENSIONS, where: str | None = None) -> dict[str, StatsTable]:
    """Tables keyed 'overall', 'by_<dimension>' for each of `by`, and 'hack_codes'."""
    bad = [d for d in by if d not in _ALLOWED_DIMENSIONS]
    if bad:
        raise StatsError(f"unknown stats dimension(s) {bad}: choose from {list(_ALLOWED_DIMENSIONS)}")
    cond = f" WHERE {where}" if where else ""
    out = {"overall": _table(root, "All trajectories", f"SELECT {_metrics_sql()} FROM trajectories{cond}")}
    for d in by:
        out[f"by_{d}"] = _table(
            root, f"By {d}", f'SELECT "{d}", {_metrics_sql()} FROM trajectories{cond} GROUP BY "{d}" ORDER BY "{d}"'
        )
    out["hack_codes"] = _table(
        root,
        "Hack reason codes",
        f"SELECT code, count(*) AS n, round(count(*) / (SELECT count(*) FROM trajectories{cond}), 4) AS share "
        f"FROM (SELECT unnest(hack_flags) AS code FROM trajectories{cond}) GROUP BY code ORDER BY n DESC, code",
    )
    return out


def render_stats(stats: dict[str, StatsTable], console: Any = None) -> None:
    """Draw the tables with rich (to the given console, default stdout)."""
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or captured: do not squeeze 14 columns into 80 characters
            console = Console(width=200)
    for st in stats.values():
        t = Table(title=st.title, title_justify="left")
        for c in st.columns:
            t.add_column(c, justify="left" if c in _ALLOWED_DIMENSIONS or c == "code" else "right")
        for r in st.rows:
            t.add_row(*("" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v) for v in r))
        if not st.rows:
            t.add_row(*(["(none)"] + [""] * (len(st.columns) - 1)))
        console.print(t)


def stats_command(root: str, by: Sequence[str] | None = None, where: str | None = None,
                  fmt: Literal["table", "json"] = "table", console: Any = None) -> dict[str, StatsTable]:
    """`flywheel stats`: print the tables (rich) or one JSON object {name: [row objects]}; returns the data."""
    stats = compute_stats(root, by=tuple(by) if by else DIMENSIONS, where=where)
    if fmt == "json":
        text = json.dumps({k: v.as_dicts() for k, v in stats.items()}, default=str)
        if console is None:
            print(text)
        else:
            console.print_json(text)
    elif fmt == "table":
        render_stats(stats, console)
    else:
        raise StatsError(f"unknown stats format {fmt!r}: choose table or json")
    return stats

