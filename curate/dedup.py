"""De-duplication of training rows: exact (hash of the normalised conversation) and near (MinHash/LSH).

Exact: tool-call ids, whitespace runs and the key order and spacing of JSON arguments are dropped before hashing.
Near: datasketch's MinHash and MinHashLSH over token shingles of the normalised conversation (curate/normalise.py:
case, whitespace, number formats, so `178.0` is `178`; system messages left out by default: shared tool
instructions would make every pair alike), each LSH candidate confirmed by the exact Jaccard similarity of the two
shingle sets (the estimate's noise never drops a row) and, by default, by equal defining constants of the user
messages (the same problem). Shingle size and threshold are measured on a labelled set (benchmarks/decontam.py).
Rows from earlier snapshots can be loaded as "prior": a candidate matching one is dropped with its own reason.
Which copy survives is deterministic and independent of the run's id (DedupConfig.prefer, then round, sample index,
example key: warehouse.record.example_key).
This module reads no files and does not filter on quality.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable

from datasketch import MinHash, MinHashLSH

from curate.config import DedupConfig
from curate.normalise import constants, grams, tokens
from warehouse.record import Message, ToolCall, Trajectory, example_key

DUP_EXACT = "dup_exact"
DUP_NEAR = "dup_near"
DUP_EXACT_EARLIER = "dup_exact_earlier_snapshot"
DUP_NEAR_EARLIER = "dup_near_earlier_snapshot"

_WS = re.compile(r"\s+")
_MINHASH_SEED = 1


def _canon_args(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (json.JSONDecodeError, TypeError):
        return _WS.sub(" ", arguments or "").strip()


def normalised(messages: list[Message]) -> list[list[object]]:
    """The conversation without ids and formatting noise: [role, content, [[tool, canonical args], ...]]."""
    out: list[list[object]] = []
    for m in messages:
        content = _WS.sub(" ", m.content or "").strip()
        calls = [[c.function.name, _canon_args(c.function.arguments)] for c in (m.tool_calls or [])]
        out.append([m.role, content, calls])
    return out


def content_hash(row: Trajectory) -> str:
    """sha256 of the normalised conversation: equal for exact duplicates."""
    blob = json.dumps(normalised(row.messages), separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def row_text(row: Trajectory, *, include_system: bool = False) -> str:
    """Contents and tool-call arguments of the conversation, one message per line."""
    parts: list[str] = []
    for m in row.messages:
        if m.role == "system" and not include_system:
            continue
        if m.content:
            parts.append(m.content)
        parts += [call_text(c) for c in m.tool_calls or []]
    return "\n".join(parts)


def call_text(call: ToolCall) -> str:
    """A tool call as text: its name, then its argument values (JSON decoded; the raw string when not JSON)."""
    try:
        args = json.loads(call.function.arguments)
        vals = [str(v) for v in args.values()] if isinstance(args, dict) else [str(args)]
    except (json.JSONDecodeError, TypeError):
        vals = [call.function.arguments or ""]
    return " ".join([call.function.name, *vals])


def shingles(text: str, size: int) -> set[bytes]:
    """Token shingles of the normalised text (curate/normalise.py: case, whitespace, number formats)."""
    return {" ".join(g).encode() for g in grams(tokens(text), size)}


def problem_key(row: Trajectory) -> tuple[tuple[str, int | str], ...]:
    """The defining constants (numbers, quoted literals, identifiers, paths) of the row's user messages, sorted: two
    episodes of one problem share it, two problems of one template differ in it. A Harbor task's problem is also
    its environment (the files its instruction talks about): its task_version (a hash of the folder) is part of it."""
    toks = [t for m in row.messages if m.role == "user" for t in tokens(m.content or "")]
    env: tuple[tuple[str, int | str], ...] = (("@environment", row.task_version),) if row.verifier == "harbor" else ()
    return env + tuple(sorted(constants(toks).items()))


def minhashes(sets: list[set[bytes]], cfg: DedupConfig) -> list[MinHash | None]:
    """One MinHash per shingle set (None for an empty set)."""
    present = [s for s in sets if s]
    hashed = iter(MinHash.bulk([list(s) for s in present], num_perm=cfg.num_perm, seed=_MINHASH_SEED))
    return [next(hashed) if s else None for s in sets]


def jaccard(a: set[bytes], b: set[bytes]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def preference_key(row: Trajectory, cfg: DedupConfig) -> tuple[int, int, int, str]:
    """Survivor order within a duplicate group: preferred source, earlier round, lower sample index, smaller example
    key (run-independent, unlike the trajectory id)."""
    order = {s: i for i, s in enumerate(cfg.prefer)}
    return (order.get(row.source, len(order)), row.round, row.sample_index, example_key(row))


def dedup_rows(
    rows: Iterable[Trajectory], cfg: DedupConfig, prior: Iterable[Trajectory] = ()
) -> tuple[list[Trajectory], dict[str, str], dict[str, str]]:
    """Remove exact and near-duplicates among rows, and rows that duplicate a prior (earlier snapshot) row.

    Returns (kept rows in preference order, {dropped id: reason}, {dropped id: id of the row it duplicates}).
    Reasons: dup_exact, dup_near, dup_exact_earlier_snapshot, dup_near_earlier_snapshot.
    """
    rows = sorted(rows, key=lambda r: preference_key(r, cfg))
    prior = list(prior)
    kept: list[Trajectory] = []
    dropped: dict[str, str] = {}
    dup_of: dict[str, str] = {}
    if not cfg.exact and not cfg.near:
        return rows, dropped, dup_of

    exact_seen: dict[str, tuple[str, bool]] = {}  # hash -> (id, is_prior)
    # LSH finds candidates with a lower threshold (recall); each is confirmed by its exact Jaccard similarity.
    lsh = MinHashLSH(threshold=max(0.05, cfg.threshold - 0.15), num_perm=cfg.num_perm) if cfg.near else None
    # example key -> (shingles, is_prior, task key, problem, trajectory id); LSH keys are example keys, so which
    # near-duplicate a row is matched to (the best similarity, ties by key) does not depend on the run's id
    indexed: dict[str, tuple[set[bytes], bool, str, tuple, str]] = {}

    def shingle_sets(rs: list[Trajectory]) -> list[set[bytes]]:
        return [shingles(row_text(r, include_system=cfg.include_system), cfg.shingle) for r in rs]

    prior_sets = shingle_sets(prior) if cfg.near else [set() for _ in prior]
    for p, sh, mh in zip(prior, prior_sets, minhashes(prior_sets, cfg) if cfg.near else [None] * len(prior)):
        if cfg.exact:
            exact_seen.setdefault(content_hash(p), (p.trajectory_id, True))
        pk = example_key(p)
        if lsh is not None and mh is not None and pk not in indexed:
            lsh.insert(pk, mh)
            indexed[pk] = (sh, True, f"{p.suite}/{p.task_id}", problem_key(p), p.trajectory_id)

    row_sets = shingle_sets(rows) if cfg.near else [set() for _ in rows]
    for r, sh, mh in zip(rows, row_sets, minhashes(row_sets, cfg) if cfg.near else [None] * len(rows)):
        h = content_hash(r) if cfg.exact else ""
        if cfg.exact:
            hit = exact_seen.get(h)
            if hit is not None:
                dropped[r.trajectory_id] = DUP_EXACT_EARLIER if hit[1] else DUP_EXACT
                dup_of[r.trajectory_id] = hit[0]
                continue
        task_key = f"{r.suite}/{r.task_id}"
        if lsh is not None and mh is not None:
            best: tuple[float, str, bool, str] | None = None
            problem = problem_key(r) if cfg.same_problem else ()
            for key in lsh.query(mh):
                other, is_prior, other_task, other_problem, other_id = indexed[key]
                if cfg.near_scope == "task" and other_task != task_key:
                    continue
                if cfg.same_problem and other_problem != problem:
                    continue
                j = jaccard(sh, other)
                if j >= cfg.threshold and (best is None or (j, key) > (best[0], best[1])):
                    best = (j, key, is_prior, other_id)
            if best is not None:
                dropped[r.trajectory_id] = DUP_NEAR_EARLIER if best[2] else DUP_NEAR
                dup_of[r.trajectory_id] = best[3]
                continue
            rk = example_key(r)
            if rk not in indexed:
                lsh.insert(rk, mh)
                indexed[rk] = (sh, False, task_key, problem, r.trajectory_id)
        if cfg.exact:
            exact_seen[h] = (r.trajectory_id, False)
        kept.append(r)
    return kept, dropped, dup_of
