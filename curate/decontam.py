"""Decontamination: drop training rows that overlap the held-out split.

A row is contaminated when it belongs to a held-out task (its task id, or the held-out split), or when its text
(every message, tool-call arguments included) contains a held-out task's problem. The second test measures, for
each held-out prompt, the share of its token n-grams found in the row, each n-gram weighted by its rarity across
all task prompts (held-out prompts and the rows' first user messages: smoothed inverse document frequency).
Procedural suites share templates ("X has A apples and gets B more..."): an n-gram long enough to span the
numbers belongs to one problem, and phrases common to many prompts weigh little, so an honest train task of the
same template scores well below the threshold while a leaked held-out problem scores 1.0.
A held-out prompt shorter than n tokens is matched as one n-gram of its own length.
This module reads no files.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from curate.config import DecontamConfig
from curate.dedup import row_text, tokens
from tasks.spec import Task
from warehouse.record import Trajectory

HELDOUT_TASK = "heldout_task"
CONTAMINATED = "contaminated"


def _grams(toks: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)}


def _first_user(row: Trajectory) -> str:
    for m in row.messages:
        if m.role == "user" and m.content:
            return m.content
    return ""


class Decontaminator:
    """An index of held-out prompts; `score(row)` gives the best (share, held-out task id) for a row."""

    def __init__(self, heldout_tasks: list[Task], cfg: DecontamConfig, corpus_prompts: Iterable[str] = ()):
        self.cfg = cfg
        self.heldout_ids = {t.id for t in heldout_tasks}
        held = [(t.id, tokens(t.prompt)) for t in heldout_tasks]
        held = [(tid, toks) for tid, toks in held if toks]
        self.sizes = sorted({min(cfg.ngram, len(toks)) for _, toks in held})
        docs = [toks for _, toks in held] + [tokens(p) for p in corpus_prompts]
        docs = [d for d in docs if d]
        df: dict[tuple[str, ...], int] = defaultdict(int)
        for d in docs:
            for n in self.sizes:
                for g in _grams(d, n):
                    df[g] += 1
        n_docs = len(docs)
        self.index: dict[tuple[str, ...], list[tuple[str, float]]] = defaultdict(list)
        self.total: dict[str, float] = {}
        for tid, toks in held:
            n = min(cfg.ngram, len(toks))
            total = 0.0
            for g in _grams(toks, n):
                w = math.log((n_docs + 1) / (df[g] + 1)) + 1.0
                self.index[g].append((tid, w))
                total += w
            self.total[tid] = self.total.get(tid, 0.0) + total

    def score(self, row: Trajectory) -> tuple[float, str | None]:
        toks = tokens(row_text(row, include_system=True))
        acc: dict[str, float] = defaultdict(float)
        for n in self.sizes:
            for g in _grams(toks, n):
                for tid, w in self.index.get(g, ()):
                    acc[tid] += w
        best, best_id = 0.0, None
        for tid, a in sorted(acc.items()):
            s = a / self.total[tid]
            if s > best:
                best, best_id = s, tid
        return best, best_id

    def reason(self, row: Trajectory) -> tuple[str | None, str | None]:
        """(drop reason or None, the held-out task id it overlaps)."""
        if row.task_id in self.heldout_ids:
            return HELDOUT_TASK, row.task_id
        s, tid = self.score(row)
        if s >= self.cfg.threshold - 1e-9:
            return CONTAMINATED, tid
        return None, None


def decontaminate(
    rows: list[Trajectory], heldout_tasks: list[Task], cfg: DecontamConfig
) -> tuple[list[Trajectory], dict[str, str], dict[str, str]]:
    """(kept rows in input order, {dropped id: reason}, {dropped id: held-out task id it overlaps}).

    Reasons: heldout_task (the row's task is held out), contaminated (n-gram overlap with a held-out prompt).
    With cfg.enabled off or no held-out tasks, every row is kept.
    """
    if not cfg.enabled or not heldout_tasks:
        return list(rows), {}, {}
    corpus = {r.task_id: _first_user(r) for r in rows}
    dec = Decontaminator(heldout_tasks, cfg, corpus.values())
    kept: list[Trajectory] = []
    dropped: dict[str, str] = {}
    matched: dict[str, str] = {}
    for r in rows:
        reason, tid = dec.reason(r)
        if reason is None:
            kept.append(r)
        else:
            dropped[r.trajectory_id] = reason
            matched[r.trajectory_id] = tid or ""
    return kept, dropped, matched
