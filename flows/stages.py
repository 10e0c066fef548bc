"""The stage ledger of a flywheel run: which stages finished, and what they produced; and the rounds-table rows
that stages record (`metric`, `suite_rows`, `checkpoint_rows`, `score_rows`, `StageTimer`).

Each finished stage writes one small JSON file, ROOT/runs/RUN_ID/stages/RRR-NAME.json, atomically (temp name,
rename) and only after its outputs are durable. `flywheel run --resume RUN_ID` reads the ledger and skips the
stages it lists; an interrupted stage has no entry and runs again (its rollouts skip rows already written, its
training restarts into a fresh folder). This module does not run stages and does not import prefect.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import fsspec

if TYPE_CHECKING:
    from training.scoring import CheckpointScore
    from warehouse.score import SuiteScore


def metric(run_id: str, round: int, stage: str, subject: str, split: str, suite: str, metric: str,
           value: float) -> dict[str, Any]:
    """One row of the lake's rounds table."""
    return {"run_id": run_id, "round": round, "stage": stage, "subject": subject, "split": split, "suite": suite,
            "metric": metric, "value": float(value), "created_at": datetime.now(timezone.utc)}


def suite_rows(scores: list[SuiteScore], *, run_id: str, round: int, stage: str, subject: str, split: str,
               prefix: str = "", episodes: bool = True) -> list[dict[str, Any]]:
    """Rounds-table rows of scores per suite label (training.scoring's, the one scorer's): each metric named with
    `prefix` (e.g. sampled_), and with `episodes` the episodes scored beside it (metric PREFIXepisodes)."""
    out = []
    for s in scores:
        out.append(metric(run_id, round, stage, subject, split, s.suite, prefix + s.metric, s.value))
        if episodes:
            out.append(metric(run_id, round, stage, subject, split, s.suite, prefix + "episodes", s.episodes))
    return out


def checkpoint_rows(score: CheckpointScore, *, run_id: str, round: int, stage: str, subject: str,
                    split: str) -> list[dict[str, Any]]:
    """Rounds-table rows of a checkpoint's score (training.scoring.score_checkpoint): pass@1 and episodes per
    suite; when sampled, sampled_pass@1 and sampled_episodes, and pass@k (k > 1). HeldoutScores.from_metrics
    reads them back."""
    where = {"run_id": run_id, "round": round, "stage": stage, "subject": subject, "split": split}
    rows = suite_rows(score.greedy.scores, **where)
    if score.sampled is not None:
        rows += suite_rows(score.sampled.scores, prefix="sampled_", **where)
        rows += suite_rows(score.pass_k, episodes=False, **where)
    return rows


def score_rows(rows: list, *, run_id: str, round: int, stage: str, subject: str, split: str,
               k: int = 1) -> list[dict[str, Any]]:
    """Rounds-table rows of pass@1 (k <= 1) or pass@k per suite label and over all, with the episodes scored
    (the one scorer, warehouse.score: infra_error excluded)."""
    from warehouse.score import score_by_suite

    return suite_rows(score_by_suite(rows, k), run_id=run_id, round=round, stage=stage, subject=subject,
                      split=split)


class StageTimer:
    """Seconds since the stage started, rounded for the ledger."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    @property
    def s(self) -> float:
        return round(time.perf_counter() - self.t0, 2)


class Ledger:
    def __init__(self, root: str, run_id: str):
        self.fs, base = fsspec.core.url_to_fs(str(root))
        self.folder = f"{base.rstrip('/')}/runs/{run_id}/stages"
        self.fs.makedirs(self.folder, exist_ok=True)

    def _path(self, round: int, name: str) -> str:
        return f"{self.folder}/{round:03d}-{name}.json"

    def get(self, round: int, name: str) -> dict[str, Any] | None:
        p = self._path(round, name)
        if not self.fs.exists(p):
            return None
        with self.fs.open(p, "r") as f:
            return json.load(f)

    def done(self, round: int, name: str, outputs: dict[str, Any]) -> dict[str, Any]:
        p = self._path(round, name)
        tmp = f"{p}.{os.getpid()}.tmp"
        with self.fs.open(tmp, "w") as f:
            json.dump(outputs, f, default=str, indent=1)
        self.fs.mv(tmp, p)
        return outputs

    def entries(self) -> list[str]:
        return sorted(os.path.basename(p) for p in self.fs.ls(self.folder, detail=False) if p.endswith(".json"))
