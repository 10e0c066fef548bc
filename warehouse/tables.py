"""Schemas of the lake's side tables (datasets, snapshot manifests, rounds, checkpoints,
verifier_health) and the lake layout names.

Trajectories have their schema in record.py; this module holds the others, as pyarrow schemas, with one dict
that maps each table name to its schema, folder and de-duplication key. It does not read or write files.
"""

from __future__ import annotations

import pyarrow as pa

_TS = pa.timestamp("us", tz="UTC")

DATASETS_SCHEMA = pa.schema(
    [
        ("snapshot_id", pa.string()),
        ("run_id", pa.string()),
        ("round", pa.int32()),
        ("created_at", _TS),
        ("config_hash", pa.string()),
        ("config_json", pa.string()),
        ("n_rows", pa.int64()),
        ("counts_json", pa.string()),
        ("manifest_path", pa.string()),
        ("parent_snapshot_id", pa.string()),
        ("manifest_hash", pa.string()),  # curate.mixing.manifest_hash: the same snapshot across runs
    ]
)

MANIFEST_SCHEMA = pa.schema(
    [
        ("snapshot_id", pa.string()),
        ("trajectory_id", pa.string()),
        ("source", pa.string()),
        ("run_id", pa.string()),
        ("round", pa.int32()),
        ("task_id", pa.string()),
        ("suite", pa.string()),
        ("policy", pa.string()),
        ("weight", pa.float64()),
        ("example_key", pa.string()),  # warehouse.record.example_key: the row's run-independent identity
    ]
)

ROUNDS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("round", pa.int32()),
        ("stage", pa.string()),
        ("subject", pa.string()),  # base | student | teacher
        ("split", pa.string()),
        ("suite", pa.string()),
        ("metric", pa.string()),
        ("value", pa.float64()),
        ("created_at", _TS),
    ]
)

CHECKPOINTS_SCHEMA = pa.schema(
    [
        ("checkpoint_id", pa.string()),
        ("parent_id", pa.string()),
        ("run_id", pa.string()),
        ("round", pa.int32()),
        ("stage", pa.string()),  # base | sft | grpo
        ("path", pa.string()),
        ("snapshot_id", pa.string()),
        ("metrics_json", pa.string()),
        ("created_at", _TS),
    ]
)

VERIFIER_HEALTH_SCHEMA = pa.schema(
    [
        ("task_id", pa.string()),
        ("suite", pa.string()),
        ("task_version", pa.string()),
        ("verifier", pa.string()),
        ("verifier_version", pa.string()),
        ("oracle_pass", pa.bool_()),
        ("null_pass", pa.bool_()),
        ("n_mutants", pa.int32()),
        ("mutants_killed", pa.int32()),
        ("mutant_kill_rate", pa.float64()),  # null: the task has no code to mutate
        ("k_regrades", pa.int32()),
        ("flake_rate", pa.float64()),
        ("wall_s", pa.float64()),
        ("error", pa.string()),
        ("created_at", _TS),
    ]
)

# Side tables written with lake.write_rows: name -> (schema, key columns for read-side de-duplication,
# column that picks the surviving row: the latest by it wins).
SIDE_TABLES: dict[str, tuple[pa.Schema, tuple[str, ...], str]] = {
    "datasets": (DATASETS_SCHEMA, ("snapshot_id",), "created_at"),
    "rounds": (ROUNDS_SCHEMA, ("run_id", "round", "stage", "subject", "split", "suite", "metric"), "created_at"),
    "checkpoints": (CHECKPOINTS_SCHEMA, ("checkpoint_id",), "created_at"),
    "verifier_health": (VERIFIER_HEALTH_SCHEMA, ("task_id", "task_version", "verifier_version"), "created_at"),
}

# Columns that must never be null in a side-table row (a write without them is refused).
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "datasets": ("snapshot_id", "run_id", "round"),
    "rounds": ("run_id", "round", "metric", "value"),
    "checkpoints": ("checkpoint_id", "run_id", "path"),
    "manifests": ("snapshot_id", "trajectory_id"),
    "verifier_health": ("task_id", "task_version", "verifier_version", "oracle_pass", "null_pass", "flake_rate"),
}

TRAJECTORIES_DIR = "trajectories"
SNAPSHOTS_DIR = "snapshots"
QUARANTINE_DIR = "quarantine"
MANIFEST_FILE = "manifest.parquet"
