"""Decontamination: drop training rows that overlap the held-out split, looking at the whole episode.

Every text is normalised first (curate/normalise.py: case, whitespace, number formats). A row is contaminated by
held-out task H when one of these rules fires (checked in this order; the first one is reported with H's id):

- task_id: the row's task is H itself.
- expression: H's defining expression (metadata "expression", e.g. `55 + 28`; else the argument values of H's
  reference tool calls, at least 6 tokens with 2 numbers) occurs as a token run in what the episode did: its
  tool-call arguments or its assistant messages, whatever the prompt says.
- answer_tuple: the row's final answer states H's answer and its tool calls and earlier assistant messages hold
  every number H is defined by (metadata "params", else the expression's numbers; at least two of them, and at
  least 6 digits with the answer: `C(6, 5) = 6` is too common to name one task).
- prompt_ngram: the share of H's prompt n-grams found anywhere in the row (every message, tool-call arguments
  included), each n-gram weighted by its rarity across all task prompts (smoothed inverse document frequency), is
  at least `threshold`. Short n-grams suit short prompts; a prompt shorter than n is one n-gram whole.
- prompt_minhash: a user message of the row has a token-shingle Jaccard similarity of at least
  `minhash_threshold` with H's prompt (MinHash/LSH candidates, each confirmed by the exact Jaccard).

The prompt rules also require H's defining constants (numbers, quoted literals, code identifiers of H's prompt) to
occur in the row's user and system messages (the tool calls of another problem often repeat a number), each with
its left or right neighbour token (so a look-alike that swaps two numbers' roles does not pass): procedural
suites share templates, so an honest train task of the same template differs from H in exactly those, while a
paraphrase of H keeps them. Thresholds are measured on a planted set
(benchmarks/decontam.py). This module reads no files.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from datasketch import MinHash, MinHashLSH

from curate.config import DecontamConfig
from curate.dedup import call_text, row_text
from curate.normalise import constants_in_context, contains, grams, held_in_context, normalise, numbers, tokens
from tasks.spec import Task
from warehouse.record import Trajectory

HELDOUT_TASK = "heldout_task"
CONTAMINATED = "contaminated"
RULE_TASK_ID = "task_id"
RULE_EXPRESSION = "expression"
RULE_ANSWER = "answer_tuple"
RULE_NGRAM = "prompt_ngram"
RULE_MINHASH = "prompt_minhash"
_MINHASH_SEED = 7
_MIN_CALL_TOKENS = 6    # a reference tool call shorter than this is too generic to name one held-out task
_MIN_TUPLE_DIGITS = 6   # digits of (defining numbers + answer) below which an answer tuple is too common


@dataclass(frozen=True)
class Contamination:
    """Why one row was dropped: the reason (heldout_task or contaminated), the rule and the held-out task."""

    reason: str
    rule: str
    heldout_id: str
    score: float = 1.0


def _first_user(row: Trajectory) -> str:
    for m in row.messages:
        if m.role == "user" and m.content:
            return m.content
    return ""


def _defining_numbers(t: Task) -> Counter[str]:
    params = t.metadata.get("params")
    if isinstance(params, dict):
        vals = [normalise(str(v)) for v in params.values() if isinstance(v, int | float) and not isinstance(v, bool)]
        return Counter(vals)
    expr = t.metadata.get("expression")
    return numbers(tokens(expr)) if isinstance(expr, str) else Counter()


def _episode_parts(row: Trajectory) -> tuple[list[str], list[str], list[str]]:
    """(tokens of the user messages, of what the episode did: tool calls and assistant text, of the final answer)."""
    user: list[str] = []
    acted: list[str] = []
    final: list[str] = []
    for m in row.messages:
        if m.role == "user":
            user += tokens(m.content or "")
        elif m.role == "assistant":
            if m.content:
                final = tokens(m.content)
                acted += final
            for c in m.tool_calls or []:
                acted += tokens(call_text(c))
    return user, acted, final


class Decontaminator:
    """An index of held-out tasks; `match(row)` gives the first rule that fires, or None."""

    def __init__(self, heldout_tasks: list[Task], cfg: DecontamConfig, corpus_prompts: Iterable[str] = ()):
        self.cfg = cfg
        self.heldout_ids = {t.id for t in heldout_tasks}
        held = [(t, tokens(t.prompt)) for t in heldout_tasks]
        held = [(t, toks) for t, toks in held if toks]
        self.consts = {t.id: constants_in_context(toks) for t, toks in held}
        # prompt n-grams, weighted by rarity
        self.sizes = sorted({min(cfg.ngram, len(toks)) for _, toks in held})
        docs = [toks for _, toks in held] + [d for d in (tokens(p) for p in corpus_prompts) if d]
        df: dict[tuple[str, ...], int] = defaultdict(int)
        for d in docs:
            for n in self.sizes:
                for g in grams(d, n):
                    df[g] += 1
        self.index: dict[tuple[str, ...], list[tuple[str, float]]] = defaultdict(list)
        self.total: dict[str, float] = defaultdict(float)
        for t, toks in held:
            for g in grams(toks, min(cfg.ngram, len(toks))):
                w = math.log((len(docs) + 1) / (df[g] + 1)) + 1.0
                self.index[g].append((t.id, w))
                self.total[t.id] += w
        # expressions and answer tuples
        self.expressions: dict[tuple[str, ...], list[str]] = defaultdict(list)
        self.answers: dict[str, list[tuple[str, Counter[str]]]] = defaultdict(list)
        for t, _ in held:
            if not cfg.expression:
                break
            expr = t.metadata.get("expression")
            et = tokens(expr) if isinstance(expr, str) else \
                [tok for st in t.reference.steps for tok in tokens(" ".join(str(v) for v in st.arguments.values()))]
            if len(numbers(et)) >= 2 and (isinstance(expr, str) or len(et) >= _MIN_CALL_TOKENS):
                self.expressions[tuple(et)].append(t.id)
            nums = _defining_numbers(t)
            answer = normalise(t.verifier.answer or "")
            digits = sum(len(k) * n for k, n in nums.items()) + len(answer)
            if answer and sum(nums.values()) >= 2 and digits >= _MIN_TUPLE_DIGITS:
                self.answers[answer].append((t.id, nums))
        self.expr_sizes = sorted({len(e) for e in self.expressions})
        # MinHash of the prompts
        self.shingles = {t.id: grams(toks, cfg.minhash_shingle) for t, toks in held}
        self.lsh: MinHashLSH | None = None
        if cfg.minhash and held:
            self.lsh = MinHashLSH(threshold=max(0.05, cfg.minhash_threshold - 0.15), num_perm=cfg.num_perm)
            ids = [t.id for t, _ in held]
            for tid, mh in zip(ids, self._minhashes([self.shingles[i] for i in ids])):
                if tid not in self.lsh:
                    self.lsh.insert(tid, mh)

    def _minhashes(self, sets: list[set[tuple[str, ...]]]) -> list[MinHash]:
        enc = [[" ".join(g).encode() for g in s] or [b""] for s in sets]
        return list(MinHash.bulk(enc, num_perm=self.cfg.num_perm, seed=_MINHASH_SEED))

    def score(self, row: Trajectory) -> tuple[float, str | None]:
        """Best (weighted n-gram share, held-out task id) over held-out tasks whose constants the row holds."""
        toks = tokens(row_text(row, include_system=True))
        have = [c for m in row.messages if m.role in ("user", "system")
                for c in constants_in_context(tokens(m.content or ""))]
        acc: dict[str, float] = defaultdict(float)
        for n in self.sizes:
            for g in grams(toks, n):
                for tid, w in self.index.get(g, ()):
                    acc[tid] += w
        best, best_id = 0.0, None
        for tid, a in sorted(acc.items()):
            s = a / self.total[tid]
            if s > best and held_in_context(have, self.consts[tid]):
                best, best_id = s, tid
        return best, best_id

    def _expression(self, acted: list[str]) -> str | None:
        for k in self.expr_sizes:
            for i in range(len(acted) - k + 1):
                hit = self.expressions.get(tuple(acted[i : i + k]))
                if hit:
                    return min(hit)
        return None

    def _answer(self, acted: list[str], final: list[str]) -> str | None:
        have = numbers(acted[: len(acted) - len(final)])  # the defining numbers, from before the final answer
        for tok in dict.fromkeys(t for t in final if t[0].isdigit()):
            for tid, nums in sorted(self.answers.get(tok, ())):
                if contains(have, nums):
                    return tid
        return None

    def _minhash(self, row: Trajectory) -> tuple[float, str | None]:
        if self.lsh is None:
            return 0.0, None
        best, best_id = 0.0, None
        for m in row.messages:
            if m.role != "user" or not m.content:
                continue
            toks = tokens(m.content)
            sh, have = grams(toks, self.cfg.minhash_shingle), constants_in_context(toks)
            if not sh:
                continue
            for tid in sorted(self.lsh.query(self._minhashes([sh])[0])):
                other = self.shingles[tid]
                j = len(sh & other) / len(sh | other)
                if j > best and j >= self.cfg.minhash_threshold - 1e-9 and held_in_context(have, self.consts[tid]):
                    best, best_id = j, tid
        return best, best_id

    def match(self, row: Trajectory) -> Contamination | None:
        """The first rule that fires for this row (see the module docstring), or None for a clean row."""
        if row.task_id in self.heldout_ids:
            return Contamination(HELDOUT_TASK, RULE_TASK_ID, row.task_id)
        _, acted, final = _episode_parts(row)
        tid = self._expression(acted) if self.expressions else None
        if tid:
            return Contamination(CONTAMINATED, RULE_EXPRESSION, tid)
        tid = self._answer(acted, final) if self.answers else None
        if tid:
            return Contamination(CONTAMINATED, RULE_ANSWER, tid)
        s, tid = self.score(row)
        if tid and s >= self.cfg.threshold - 1e-9:
            return Contamination(CONTAMINATED, RULE_NGRAM, tid, round(s, 4))
        s, tid = self._minhash(row)
        if tid:
            return Contamination(CONTAMINATED, RULE_MINHASH, tid, round(s, 4))
        return None

    def reason(self, row: Trajectory) -> tuple[str | None, str | None]:
        """(drop reason or None, the held-out task id it overlaps)."""
        hit = self.match(row)
        return (hit.reason, hit.heldout_id) if hit else (None, None)


def find_contamination(rows: list[Trajectory], heldout_tasks: list[Task], cfg: DecontamConfig
                       ) -> dict[str, Contamination]:
    """{trajectory id: why it is contaminated} for the contaminated rows (none when disabled or no held-out)."""
    if not cfg.enabled or not heldout_tasks:
        return {}
    corpus = {r.task_id: _first_user(r) for r in rows}
    dec = Decontaminator(heldout_tasks, cfg, corpus.values())
    hits = {}
    for r in rows:
        hit = dec.match(r)
        if hit is not None:
            hits[r.trajectory_id] = hit
    return hits


def decontaminate(
    rows: list[Trajectory], heldout_tasks: list[Task], cfg: DecontamConfig
) -> tuple[list[Trajectory], dict[str, str], dict[str, str]]:
    """(kept rows in input order, {dropped id: reason}, {dropped id: held-out task id it overlaps}).

    Reasons: heldout_task (the row's task is held out), contaminated (any other rule; find_contamination says
    which). With cfg.enabled off or no held-out tasks, every row is kept.
    """
    hits = find_contamination(rows, heldout_tasks, cfg)
    kept = [r for r in rows if r.trajectory_id not in hits]
    return kept, {k: h.reason for k, h in hits.items()}, {k: h.heldout_id for k, h in hits.items()}
