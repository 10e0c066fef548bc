"""Mixing curated rows into a training snapshot, and registering the snapshot in the lake.

`mix` weights rows by source, applies per-task and per-suite caps, then difficulty shares, then source shares (each
share met by the largest selection that needs no repeated row) and the size cap. Every choice among rows follows one
order: the hash of (seed, example key), where the example key (warehouse.record.example_key) is a row's run-
independent identity, so the same rows and config give the same snapshot in any process, any input order and any run
of the same config and seed. `manifest_hash` is that snapshot's fingerprint across runs. `write_snapshot` writes the
manifest (one row per example with its provenance and weight) and one datasets-table row carrying the config hash;
`read_snapshot` gives a snapshot's rows back with their weights (what SFT trains on). This module does not filter or
de-duplicate."""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from curate.config import MixConfig
from warehouse.record import Trajectory, example_key

# Reasons a kept row is left out of the snapshot.
UNWEIGHTED = "source_unweighted"
CAP_TASK = "cap_task"
CAP_SUITE = "cap_suite"
DIFFICULTY_SHARE = "difficulty_share"
SOURCE_SHARE = "source_share"
MAX_EXAMPLES = "max_examples"


@dataclass
class MixResult:
    """Selected rows with their training weights (manifest order), and {left-out id: reason}."""

    selected: list[tuple[Trajectory, float]] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)


def order_key(seed: int, key: str) -> str:
    """The mixing order of a row: the hash of the seed and its example key."""
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()


def _cap(rows: list[Trajectory], key: Callable[[Trajectory], Hashable], cap: int | None, reason: str,
         left_out: dict[str, str]) -> list[Trajectory]:
    if cap is None:
        return rows
    seen: Counter[Hashable] = Counter()
    out = []
    for r in rows:
        k = key(r)
        if seen[k] >= cap:
            left_out[r.trajectory_id] = reason
        else:
            seen[k] += 1
            out.append(r)
    return out


def quotas(available: dict[Any, int], shares: dict[Any, float], limit: int | None = None) -> dict[Any, int]:
    """Rows to take per group: the largest total N (at most limit) with share*N rows available in every group
    whose share is positive; groups without a positive share get 0."""
    total = sum(v for v in shares.values() if v > 0)
    norm = {k: v / total for k, v in shares.items() if v > 0}
    if not norm:
        return {k: 0 for k in available}
    n = min(available.get(k, 0) / s for k, s in norm.items())
    if limit is not None:
        n = min(n, limit)
    return {k: math.floor(norm.get(k, 0.0) * n + 1e-9) for k in set(available) | set(norm)}


def _share(rows: list[Trajectory], key: Callable[[Trajectory], Any], shares: dict[Any, float] | None,
           limit: int | None, reason: str, left_out: dict[str, str]) -> list[Trajectory]:
    if shares is None:
        return rows
    q = quotas(Counter(key(r) for r in rows), shares, limit)
    taken: Counter[Any] = Counter()
    out = []
    for r in rows:
        k = key(r)
        if taken[k] >= q.get(k, 0):
            left_out[r.trajectory_id] = reason
        else:
            taken[k] += 1
            out.append(r)
    return out


def mix(rows: Iterable[Trajectory], cfg: MixConfig) -> MixResult:
    """Choose and weight the snapshot's rows (see the module docstring for the order of the steps)."""
    res = MixResult()
    ordered = sorted(rows, key=lambda r: order_key(cfg.seed, example_key(r)))
    weighted = []
    for r in ordered:
        if cfg.source_weights.get(r.source, 0.0) > 0:
            weighted.append(r)
        else:
            res.left_out[r.trajectory_id] = UNWEIGHTED
    rows_ = _cap(weighted, lambda r: (r.suite, r.task_id), cfg.max_per_task, CAP_TASK, res.left_out)
    rows_ = _cap(rows_, lambda r: r.suite, cfg.max_per_suite, CAP_SUITE, res.left_out)
    difficulty_shares = {int(k): v for k, v in cfg.difficulty_ratios.items()} if cfg.difficulty_ratios else None
    last_share = "source" if cfg.source_ratios else ("difficulty" if difficulty_shares else None)
    rows_ = _share(rows_, lambda r: r.difficulty, difficulty_shares,
                   cfg.max_examples if last_share == "difficulty" else None, DIFFICULTY_SHARE, res.left_out)
    rows_ = _share(rows_, lambda r: r.source, cfg.source_ratios, cfg.max_examples, SOURCE_SHARE, res.left_out)
    if last_share is None and cfg.max_examples is not None:
        for r in rows_[cfg.max_examples :]:
            res.left_out[r.trajectory_id] = MAX_EXAMPLES
        rows_ = rows_[: cfg.max_examples]
    rows_.sort(key=lambda r: (r.source, r.suite, r.task_id, r.round, example_key(r)))
    res.selected = [(r, float(cfg.source_weights[r.source])) for r in rows_]
    return res


def snapshot_id(run_id: str, round: int, cfg_hash: str, trajectory_ids: Iterable[str]) -> str:
    """Deterministic: the same run, round, config and examples name the same snapshot."""
    blob = json.dumps([run_id, round, cfg_hash, sorted(trajectory_ids)], separators=(",", ":"))
    return f"{run_id}-r{round}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def manifest_rows(selected: list[tuple[Trajectory, float]]) -> list[dict[str, Any]]:
    return [
        {"trajectory_id": r.trajectory_id, "source": r.source, "run_id": r.run_id, "round": r.round,
         "task_id": r.task_id, "suite": r.suite, "policy": r.policy, "weight": w, "example_key": example_key(r)}
        for r, w in selected
    ]


def manifest_hash(selected: list[tuple[Trajectory, float]]) -> str:
    """A snapshot's fingerprint across runs: sha256 (16 hex) of its examples' keys (warehouse.record.example_key)
    and weights, in manifest order. Two runs of one config and seed that made the same snapshot have the same hash,
    though their trajectory ids differ (those hold the run id)."""
    blob = json.dumps([[example_key(r), w] for r, w in selected], separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def write_snapshot(
    root: str, *, run_id: str, round: int, selected: list[tuple[Trajectory, float]], cfg_hash: str,
    config_json: str, counts: dict[str, Any], parent_snapshot_id: str | None,
) -> tuple[str, str]:
    """Write the manifest and the datasets row of a snapshot; returns (snapshot_id, manifest path).

    Idempotent: the id is a hash of the inputs and the manifest is replaced atomically; the datasets table keeps
    the latest row per snapshot_id.
    """
    from warehouse.lake import write_manifest, write_rows

    sid = snapshot_id(run_id, round, cfg_hash, (r.trajectory_id for r, _ in selected))
    path = write_manifest(root, sid, manifest_rows(selected))
    write_rows(root, "datasets", [{
        "snapshot_id": sid, "run_id": run_id, "round": round, "config_hash": cfg_hash, "config_json": config_json,
        "manifest_hash": manifest_hash(selected),
        "n_rows": len(selected), "counts_json": json.dumps(counts, sort_keys=True), "manifest_path": path,
        "parent_snapshot_id": parent_snapshot_id,
    }])
    return sid, path


class SnapshotError(LookupError):
    """A snapshot named by id is not registered in the lake, or its manifest names rows the lake lacks."""


def read_snapshot(root: str, snapshot_id: str) -> list[tuple[Trajectory, float]]:
    """The snapshot's rows with their weights, in manifest order. Raises SnapshotError when the snapshot is not
    in the datasets table or a manifest row has no trajectory in the lake."""
    from warehouse.query import connect
    from warehouse.record import from_dict

    con = connect(root)
    try:
        found = con.execute("SELECT n_rows FROM datasets WHERE snapshot_id = ?", [snapshot_id]).fetchall()
        known = found[0] if found else None
        if known is None:
            raise SnapshotError(f"snapshot {snapshot_id!r} is not in the datasets table of {root!r}; list them with "
                                f"SELECT snapshot_id, run_id, round FROM datasets")
        got = con.sql(
            "SELECT t.*, m.weight AS _weight FROM (SELECT *, row_number() OVER () AS _pos FROM manifests "
            "WHERE snapshot_id = ?) m JOIN trajectories t USING (trajectory_id) ORDER BY m._pos",
            params=[snapshot_id],
        ).to_arrow_table().to_pylist()
    finally:
        con.close()
    if len(got) != known[0]:
        raise SnapshotError(f"snapshot {snapshot_id!r} lists {known[0]} rows but the lake holds {len(got)} of "
                            f"them: trajectories were deleted or quarantined after the snapshot was made")
    return [(from_dict(d), float(d["_weight"])) for d in got]
