"""The one scorer: pass@1 and pass@k of episodes, overall and per suite label, from their verdicts.

Every score the project reports goes through here: the flows' rounds-table metrics (flows/stages.py), the
curriculum's per-task history (curate/curriculum.py), `training.scoring` (the flywheel's scoring stages and the
benchmarks), the viewer's pages and `flywheel stats` (their SQL aggregate, `PASS_RATE_SQL`). The rules, written once:
  - only scored verdicts count (warehouse.record.SCORED_VERDICTS): an infra_error says nothing about the model;
  - pass@1 = passes / scored episodes;
  - pass@k is the unbiased estimator of Chen et al. 2021 per task (n samples, c passes), averaged over the tasks
    with at least k scored samples;
  - a suite label is `SUITE-dDIFFICULTY`, and `all` covers every scored episode.
It reads no files; callers bring the rows (records or anything with verdict, task_id, suite, difficulty).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from math import comb
from typing import Any

from warehouse.record import SCORED_VERDICTS


PASS_RATE_SQL = ("avg(CASE WHEN verdict = 'pass' THEN 1.0 ELSE 0.0 END) FILTER (WHERE verdict IN ("
                 + ", ".join(f"'{v}'" for v in SCORED_VERDICTS) + "))")
"""pass@1 as a DuckDB aggregate over the lake's trajectories (NULL when none is scored), for the lake-side
summaries (`flywheel stats`, the viewer's run pages); built from the constant verdict names, no user input."""


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """Unbiased pass@k from n samples with c successes (Chen et al. 2021); None when n < k."""
    if n < k or n <= 0:
        return None
    if n - c < k:
        return 1.0
    if k == 1:
        return c / n  # the same value, without the float error of 1 - (n - c) / n
    return 1.0 - comb(n - c, k) / comb(n, k)


def scored(rows: Iterable[Any]) -> list[Any]:
    """The rows whose verdict is scored (infra_error left out)."""
    return [r for r in rows if r.verdict in SCORED_VERDICTS]


def pass_rate(rows: Iterable[Any]) -> float:
    """pass@1 of the rows: passes / scored episodes; 0.0 when none is scored."""
    s = scored(rows)
    return pass_at_k(len(s), sum(r.verdict == "pass" for r in s), 1) if s else 0.0


def pass_rate_of_counts(verdicts: dict[str, int]) -> float:
    """pass@1 from verdict counts (a GROUP BY verdict of the lake): passes / scored; 0.0 when none is scored."""
    n = sum(c for v, c in verdicts.items() if v in SCORED_VERDICTS)
    return pass_at_k(n, verdicts.get("pass", 0), 1) if n else 0.0


def mean_pass_at_k(rows: Iterable[Any], k: int) -> float:
    """pass@k averaged over the tasks of the rows that have at least k scored samples; 0.0 when none has."""
    per_task: dict[str, list[bool]] = {}
    for r in scored(rows):
        per_task.setdefault(r.task_id, []).append(r.verdict == "pass")
    vals = [v for v in (pass_at_k(len(p), sum(p), k) for p in per_task.values()) if v is not None]
    return sum(vals) / len(vals) if vals else 0.0


@dataclass(frozen=True)
class SuiteScore:
    suite: str
    metric: str
    value: float
    episodes: int


def suite_label(row: Any) -> str:
    return f"{row.suite}-d{row.difficulty}"


def score_by_suite(rows: Iterable[Any], k: int = 1) -> list[SuiteScore]:
    """pass@1 (k <= 1) or pass@k per suite label and over `all`, sorted by label; scored episodes only."""
    by_suite: dict[str, list[Any]] = {}
    for r in scored(rows):
        by_suite.setdefault(suite_label(r), []).append(r)
        by_suite.setdefault("all", []).append(r)
    metric = "pass@1" if k <= 1 else f"pass@{k}"
    return [SuiteScore(suite, metric, pass_rate(rs) if k <= 1 else mean_pass_at_k(rs, k), len(rs))
            for suite, rs in sorted(by_suite.items())]
