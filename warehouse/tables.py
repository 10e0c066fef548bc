"""Schemas of the lake's side tables (datasets, snapshot manifests, rounds, checkpoints,
verifier_health, task_synthesis) and the lake layout names.

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
        ("mutant_survivors", pa.list_(pa.string())),  # the mutants that passed
        ("k_regrades", pa.int32()),
        ("flake_rate", pa.float64()),
        ("wall_s", pa.float64()),
        ("error", pa.string()),
        ("created_at", _TS),
    ]
)

TASK_SYNTHESIS_SCHEMA = pa.schema(
    [
        ("synthesis_id", pa.string()),
        ("candidate_id", pa.string()),
        ("writer", pa.string()),  # reference | openai
        ("family", pa.string()),
        ("task_id", pa.string()),  # null: the writer's reply was no task
        ("decision", pa.string()),  # admitted | refused
        ("reason_codes", pa.list_(pa.string())),
        ("detail", pa.string()),
        ("folder", pa.string()),
        ("seed_tasks", pa.list_(pa.string())),
        ("oracle_pass", pa.bool_()),
        ("null_pass", pa.bool_()),
        ("k_regrades", pa.int32()),
        ("flake_rate", pa.float64()),
        ("n_perturbed", pa.int32()),
        ("perturbed_killed", pa.int32()),
        ("prompt_tokens", pa.int64()),  # the writer's
        ("completion_tokens", pa.int64()),
        ("writer_usd", pa.float64()),
        ("writer_s", pa.float64()),
        ("build_s", pa.float64()),
        ("audit_s", pa.float64()),
        ("run_id", pa.string()),  # lineage (flywheel.synthesize): the run, the round and the frontier cell that
        ("round", pa.int32()),  # asked for the candidate, and the failed trajectories of that cell;
        ("frontier", pa.string()),  # null from `flywheel tasks synthesize`
        ("asked_by", pa.list_(pa.string())),
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
    "task_synthesis": (TASK_SYNTHESIS_SCHEMA, ("synthesis_id", "candidate_id"), "created_at"),
}

# Columns that must never be null in a side-table row (a write without them is refused).
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "datasets": ("snapshot_id", "run_id", "round"),
    "rounds": ("run_id", "round", "metric", "value"),
    "checkpoints": ("checkpoint_id", "run_id", "path"),
    "manifests": ("snapshot_id", "trajectory_id"),
    "verifier_health": ("task_id", "task_version", "verifier_version", "oracle_pass", "null_pass", "flake_rate"),
    "task_synthesis": ("synthesis_id", "candidate_id", "writer", "decision", "reason_codes"),
}

TRAJECTORIES_DIR = "trajectories"
SNAPSHOTS_DIR = "snapshots"
QUARANTINE_DIR = "quarantine"
MANIFEST_FILE = "manifest.parquet"
