"""Prefect artifacts of the flows: a progress bar updated during rollouts, tables per stage, markdown, viewer links.

Thin helpers over `prefect.artifacts`: keys are checked against Prefect's rule (lowercase letters, digits,
dashes) with an error naming the fix, table cells are made JSON-safe, and calls are forced synchronous so that
they also work from inside a running event loop (the rollout loop). Each helper must run inside a flow or task
run (that is where Prefect attaches the artifact). The round report itself is warehouse/report.py's markdown.
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


ProgressFn = Callable[[int], None]
