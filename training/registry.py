"""Checkpoint registry over the lake's `checkpoints` table: which model folder came from which parent, data and stage.

`register_checkpoint` writes one row (id, parent, run, round, stage, snapshot, path, metrics) through
warehouse.lake.write_rows (atomic Parquet); `checkpoint_id` is deterministic (run, round, stage), so registering a
stage again after a crash replaces the row (readers keep the latest per id) instead of duplicating it.
`get_checkpoint` / `list_checkpoints` / `latest_checkpoint` read it back through warehouse.query.
`model_dir(root, checkpoint_id)` is where a checkpoint's folder lives under the lake (models/<id>/).
This module does not train or copy weights.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

Stage = Literal["base", "sft", "grpo"]
STAGES: tuple[str, ...] = ("base", "sft", "grpo")


class RegistryError(LookupError):
    """A checkpoint the caller named is not registered (the message says how to list them)."""


class Checkpoint(BaseModel):
    checkpoint_id: str
    parent_id: str | None = None
    run_id: str
    round: int
    stage: Stage
    path: str = Field(description="Model folder (save_pretrained) or hub id.")
    snapshot_id: str | None = Field(default=None, description="Training snapshot it was trained on (None for base).")
    metrics: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime | None = None


def checkpoint_id(run_id: str, round: int, stage: str) -> str:
    """Deterministic id of the checkpoint a run's round and stage produce."""
    key = json.dumps([run_id, round, stage], separators=(",", ":"))
    return f"{stage}-r{round}-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def model_dir(root: str, checkpoint_id: str) -> str:
    """Folder of a checkpoint's weights under the lake: ROOT/models/<checkpoint_id> (local roots)."""
    return f"{root.rstrip('/')}/models/{checkpoint_id}"


def register_checkpoint(root: str, *, run_id: str, round: int, stage: Stage, path: str,
                        parent_id: str | None = None, snapshot_id: str | None = None,
                        metrics: dict[str, Any] | None = None, checkpoint_id_: str | None = None) -> Checkpoint:
    """Record a checkpoint in ROOT/checkpoints and return it. Idempotent per (run_id, round, stage)."""
    from warehouse.lake import write_rows

    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, not {stage!r}")
    cid = checkpoint_id_ or checkpoint_id(run_id, round, stage)
    ck = Checkpoint(checkpoint_id=cid, parent_id=parent_id, run_id=run_id, round=round, stage=stage, path=str(path),
                    snapshot_id=snapshot_id, metrics=metrics or {}, created_at=datetime.now(UTC))
    write_rows(root, "checkpoints", [{
        "checkpoint_id": ck.checkpoint_id, "parent_id": ck.parent_id, "run_id": ck.run_id, "round": ck.round,
        "stage": ck.stage, "path": ck.path, "snapshot_id": ck.snapshot_id,
        "metrics_json": json.dumps(ck.metrics, default=str), "created_at": ck.created_at,
    }])
    return ck


def _from_row(r: dict[str, Any]) -> Checkpoint:
    return Checkpoint(checkpoint_id=r["checkpoint_id"], parent_id=r.get("parent_id"), run_id=r["run_id"],
                      round=int(r["round"]), stage=r["stage"], path=r["path"], snapshot_id=r.get("snapshot_id"),
                      metrics=json.loads(r.get("metrics_json") or "{}"), created_at=r.get("created_at"))


def list_checkpoints(root: str, run_id: str | None = None) -> list[Checkpoint]:
    """Registered checkpoints (latest row per id), ordered by round then stage order."""
    from warehouse.query import query

    if run_id is None:
        rows = query(root, "SELECT * FROM checkpoints").to_pylist()
    else:
        rows = query(root, "SELECT * FROM checkpoints WHERE run_id = ?", [run_id]).to_pylist()
    cks = [_from_row(r) for r in rows]
    return sorted(cks, key=lambda c: (c.run_id, c.round, STAGES.index(c.stage)))


def get_checkpoint(root: str, checkpoint_id: str) -> Checkpoint:
    for c in list_checkpoints(root):
        if c.checkpoint_id == checkpoint_id:
            return c
    raise RegistryError(f"no checkpoint {checkpoint_id!r} under {root!r}; list them with "
                        f"`flywheel sql --root {root} \"SELECT checkpoint_id, stage, round FROM checkpoints\"`")


def latest_checkpoint(root: str, run_id: str, *, before_round: int | None = None) -> Checkpoint | None:
    """The newest checkpoint of a run (highest round, then grpo > sft > base), optionally before a round."""
    cks = [c for c in list_checkpoints(root, run_id) if before_round is None or c.round < before_round]
    return cks[-1] if cks else None
