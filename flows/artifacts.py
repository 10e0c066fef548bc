"""Prefect artifacts of the flows: a progress bar updated during rollouts, tables per stage, the round report.

Thin helpers over `prefect.artifacts`: keys are checked against Prefect's rule (lowercase letters, digits,
dashes) with an error naming the fix, table cells are made JSON-safe, and calls are forced synchronous so that
they also work from inside a running event loop (the rollout loop). Each helper must run inside a flow or task
run (that is where Prefect attaches the artifact). The round report is built from the lake's long-format
`rounds` table by a pure function (`round_report_markdown`) that tests and the CLI can use without Prefect.
`viewer_links` adds links to the run's pages in `flywheel view` when `run.viewer_url` is set.
It computes no metric itself.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable
from datetime import date, datetime
from typing import Any
from uuid import UUID

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

_KEY = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


class ArtifactError(ValueError):
    """An artifact was asked for with a bad key or bad content; the message names the fix."""


def artifact_key(*parts: object) -> str:
    """A valid artifact key from free text: lowercase, every run of other characters becomes one dash.

    artifact_key("generate", "Run_1", 3) == "generate-run-1-3"
    """
    key = re.sub(r"[^a-z0-9]+", "-", "-".join(str(p) for p in parts).lower()).strip("-")
    if not key:
        raise ArtifactError(f"artifact key from {parts!r} is empty; use letters or digits")
    return key


def check_key(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise ArtifactError(f"artifact key {key!r} is invalid: use lowercase letters, digits and single dashes "
                            f"(e.g. {artifact_key(key) if re.search('[A-Za-z0-9]', key) else 'generate-summary'!r})")
    return key


def _cell(v: Any) -> Any:
    """A JSON-safe table cell: numbers, strings, booleans and None as they are, the rest as compact JSON text."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return None if math.isnan(v) or math.isinf(v) else round(v, 6)
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    if hasattr(v, "model_dump"):
        v = v.model_dump(mode="json")
    return json.dumps(v, default=str, sort_keys=True)


def table_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with the union of all columns (first-seen order) and JSON-safe cells; missing cells are None."""
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    return [{c: _cell(r.get(c)) for c in cols} for r in rows]


def publish_table(key: str, rows: list[dict[str, Any]], description: str | None = None) -> UUID:
    """A table artifact from a list of dicts (one row each). An empty list makes an empty table, not an error."""
    return create_table_artifact(table=table_rows(rows), key=check_key(key), description=description, _sync=True)


def publish_markdown(key: str, markdown: str, description: str | None = None) -> UUID:
    return create_markdown_artifact(markdown=markdown, key=check_key(key), description=description, _sync=True)


class Progress:
    """A progress artifact that rollouts advance: `progress(n)` records n more finished episodes.

    Picklable (it holds only the artifact id and counters), so a chunk running on a Ray worker can carry its own
    copy; give each chunk its own `Progress` (see `progress_callback`). Updates to the API are throttled to one
    per `min_interval_s`, and the last one (done == total) is always sent. Thread-safe.
    """

    def __init__(self, artifact_id: UUID, total: int, description: str | None = None,
                 min_interval_s: float = 1.0):
        self.artifact_id = artifact_id
        self.total = max(int(total), 0)
        self.description = description
        self.min_interval_s = min_interval_s
        self.done = 0
        self._sent_at = 0.0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def percent(self) -> float:
        return 100.0 if self.total == 0 else min(100.0, 100.0 * self.done / self.total)

    def __call__(self, n: int = 1) -> None:
        with self._lock:
            self.done += int(n)
            now = time.monotonic()
            if self.done < self.total and now - self._sent_at < self.min_interval_s:
                return
            self._sent_at = now
            pct = self.percent
        desc = f"{self.description + ': ' if self.description else ''}{min(self.done, self.total)}/{self.total}"
        update_progress_artifact(self.artifact_id, progress=pct, description=desc)

    def finish(self) -> None:
        """Mark 100% (e.g. when episodes were skipped because the lake already had them)."""
        with self._lock:
            self.done = max(self.done, self.total)
        update_progress_artifact(self.artifact_id, progress=100.0,
                                 description=f"{self.description + ': ' if self.description else ''}"
                                             f"{self.total}/{self.total}")


def progress_callback(total: int, key: str = "rollout-progress", description: str | None = None,
                      min_interval_s: float = 1.0) -> Progress:
    """Create a progress artifact at 0% and return the callable that advances it: `cb(n_finished_now)`.

    Use inside a flow run: `cb = progress_callback(len(tasks) * samples, description="chunk 1/2")`, pass `cb`
    to the rollout (called with the number of episodes that just finished).
    """
    desc = f"{description + ': ' if description else ''}0/{total}"
    artifact_id = create_progress_artifact(progress=0.0, key=check_key(key), description=desc, _sync=True)
    return Progress(artifact_id, total, description, min_interval_s)


# --- the round report ------------------------------------------------------------------------------------------

def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v).replace("|", "\\|")


def markdown_table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    """A GitHub-flavoured markdown table; '(no rows)' when empty."""
    if not rows:
        return "_(no rows)_\n"
    cols = columns or list(table_rows(rows)[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    out += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out) + "\n"


def round_report_markdown(run_id: str, round: int, metrics: list[dict[str, Any]],
                          sections: dict[str, str] | None = None) -> str:
    """The round report: one table per (split, suite) with a row per metric and a column per subject.

    `metrics` are rows of the lake's `rounds` table (run_id, round, stage, subject, split, suite, metric, value);
    rows of other rounds or runs are ignored. `sections` are extra markdown blocks (title -> body) appended in
    order (e.g. data yield, training loss, links to plots).
    """
    mine = [m for m in metrics if m.get("run_id") == run_id and m.get("round") == round]
    lines = [f"# Round {round} of `{run_id}`", ""]
    if not mine:
        lines += ["_No round metrics recorded yet._", ""]
    subjects_order = ["base", "teacher", "student"]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for m in mine:
        groups.setdefault((str(m.get("split")), str(m.get("suite"))), []).append(m)
    for (split, suite), rows in sorted(groups.items()):
        subjects = sorted({str(r.get("subject")) for r in rows},
                          key=lambda s: (subjects_order.index(s) if s in subjects_order else 99, s))
        table: dict[str, dict[str, Any]] = {}
        for r in rows:  # the last value recorded for a (metric, subject) wins
            table.setdefault(str(r.get("metric")), {"metric": str(r.get("metric"))})[str(r.get("subject"))] = \
                r.get("value")
        has_delta = "student" in subjects and "base" in subjects
        out_rows = []
        for metric in sorted(table):
            row = table[metric]
            if has_delta and isinstance(row.get("student"), (int, float)) and isinstance(row.get("base"),
                                                                                           (int, float)):
                row["student - base"] = row["student"] - row["base"]
            out_rows.append(row)
        cols = ["metric", *subjects] + (["student - base"] if has_delta else [])
        lines += [f"## {suite} / {split}", "", markdown_table(out_rows, cols)]
    for title, body in (sections or {}).items():
        lines += [f"## {title}", "", body.rstrip() + "\n"]
    return "\n".join(lines)


def viewer_links(viewer_url: str | None, run_id: str, snapshot_ids: list[str] | None = None) -> str:
    """Markdown links to a run's pages in `flywheel view` (run, its episodes, hacks, failures, snapshots);
    '' when no viewer URL is configured (run.viewer_url)."""
    if not viewer_url:
        return ""
    from urllib.parse import quote, urlencode

    base = viewer_url.rstrip("/")
    run = quote(run_id, safe="")
    links = [f"[run {run_id}]({base}/runs/{run})", f"[all episodes]({base}/episodes?{urlencode({'run_id': run_id})})",
             f"[hacks]({base}/episodes?{urlencode({'run_id': run_id, 'verdict': 'hack'})})",
             f"[failures]({base}/episodes?{urlencode({'run_id': run_id, 'verdict': 'fail'})})"]
    links += [f"[snapshot {s}]({base}/snapshots/{quote(s, safe='')})" for s in snapshot_ids or []]
    return "\n## In flywheel view\n\n" + " · ".join(links) + "\n"


def publish_round_report(root: str, run_id: str, round: int, sections: dict[str, str] | None = None,
                         key: str = "round-report") -> UUID:
    """Query the lake's `rounds` table and publish the round report as a markdown artifact."""
    from warehouse.query import query

    metrics = query(root, "SELECT * FROM rounds WHERE run_id = ? AND round = ?", [run_id, int(round)]).to_pylist()
    md = round_report_markdown(run_id, round, metrics, sections)
    return publish_markdown(key, md, description=f"round {round} of {run_id}")


ProgressFn = Callable[[int], None]
