"""Writing the trajectory lake: atomic, idempotent Parquet batches in a hive-partitioned tree.

Layout under ROOT (a local folder, a file:// URL, or any fsspec URL such as s3://... or memory://...):
  trajectories/run=<run_id>/round=<r>/part-<uuid>.parquet   rows of TRAJECTORY_SCHEMA minus run_id and round
  datasets|rounds|checkpoints/part-<uuid>.parquet           side tables (schemas in tables.py)
  snapshots/<snapshot_id>/manifest.parquet                  one row per training example of a snapshot
  quarantine/                                               corrupt files moved aside (integrity.py)

Guarantees. A batch becomes visible whole or not at all (lakefs.py: a hidden temp name, fsync, rename, folder
fsync on a local disk; one PUT on an object store). Ingestion is idempotent: ids
already present in the (run, round) partition are skipped, so a retried batch or a restarted run adds no rows.
If two writers race on the same ids both files land; readers (query.py) de-duplicate by trajectory_id. Each file
records (Parquet key-value metadata `flywheel.seen`) a digest of the files its writer saw, so readers can tell
race-free partitions (every file saw exactly the files before it) and skip de-duplicating them. compact() merges
a partition's files into one.

This module does not read for analysis (query.py does), check files (integrity.py does) or open DuckDB.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from warehouse.integrity import SEEN_KEY, quarantine_file, seen_digest, validate_or_quarantine
from warehouse.lakefs import FILE_SCHEMA, TEMP_SUFFIX, FileInfo, Lake, LakeError, fsync_dir, open_lake
from warehouse.record import (
    FUNCTION_TYPE,
    MESSAGE_TYPE,
    TOOL_CALL_TYPE,
    Trajectory,
)
from warehouse.tables import (
    MANIFEST_FILE,
    MANIFEST_SCHEMA,
    QUARANTINE_DIR,
    REQUIRED_COLUMNS,
    SIDE_TABLES,
    SNAPSHOTS_DIR,
    TRAJECTORIES_DIR,
)

log = logging.getLogger(__name__)

_PARTITION_VALUE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


@dataclass(frozen=True)
class WriteResult:
    """What write_trajectories did: rows written, rows skipped (already present or repeated in the batch), files."""

    written: int
    skipped: int
    paths: list[str] = field(default_factory=list)


def check_partition_value(name: str, value: str) -> str:
    if not isinstance(value, str) or not _PARTITION_VALUE.match(value):
        raise LakeError(
            f"{name} {value!r} cannot name a lake partition folder: use 1-200 letters, digits, '.', '_' or '-'"
        )
    return value


def partition_dir(lake: Lake, run_id: str, round: int | None = None) -> str:
    check_partition_value("run_id", run_id)
    if round is None:
        return lake.join(TRAJECTORIES_DIR, f"run={run_id}")
    if not isinstance(round, int) or round < 0:
        raise LakeError(f"round {round!r} must be a non-negative integer")
    return lake.join(TRAJECTORIES_DIR, f"run={run_id}", f"round={round}")


# Ids per immutable data file, keyed by (path, size, mtime): a file never changes once renamed into place.
_ID_CACHE: dict[tuple[str, int, float | None], frozenset[str]] = {}


def _file_ids(lake: Lake, info: FileInfo) -> frozenset[str] | None:
    """Ids in one file, or None when the file is gone or was quarantined (its rows then count as missing)."""
    key = (lake.url(info.path), info.size, info.mtime)
    ids = _ID_CACHE.get(key)
    if ids is None:
        if validate_or_quarantine(lake, info, table="trajectories") is None:
            return None
        try:
            # ParquetFile, not pq.read_table: the latter imports pyarrow.dataset and pandas (0.3 s per process).
            col = pq.ParquetFile(info.path, filesystem=lake.arrow_fs).read(columns=["trajectory_id"]).column(0)
        except FileNotFoundError:
            return None
        except (pa.ArrowException, OSError) as e:  # corrupt past the footer: its rows count as missing
            quarantine_file(lake.root, info.path, f"trajectory_id column cannot be read: {e}")
            return None
        ids = frozenset(col.to_pylist())
        _ID_CACHE[key] = ids
    return ids


def _basename(path: str) -> str:
    return path.rsplit("/", 1)[-1].rsplit(os.sep, 1)[-1]


def _partition_state(lake: Lake, top: str) -> tuple[set[str], list[str]]:
    """Ids stored under `top` and the base names of the readable files they came from."""
    ids: set[str] = set()
    names: list[str] = []
    for info in lake.list_files(top):
        got = _file_ids(lake, info)
        if got is not None:
            ids |= got
            names.append(_basename(info.path))
    return ids, names


def existing_ids(root: str, run_id: str, round: int | None = None) -> set[str]:
    """Trajectory ids already in the lake for run_id (and round, when given). Corrupt files are quarantined first
    (their rows then count as missing, so a re-run writes them again)."""
    lake = open_lake(root)
    return _partition_state(lake, partition_dir(lake, run_id, round))[0]


def _new_part_name() -> str:
    """part-<32 hex>.parquet: 16 hex of time_ns then 16 random hex, so names sort in write order (readers keep
    the earliest-written copy of a duplicated id)."""
    return f"part-{time.time_ns():016x}{secrets.token_hex(8)}.parquet"


def _offsets(lengths: Iterable[int]) -> pa.Array:
    out, acc = [0], 0
    for n in lengths:
        acc += n
        out.append(acc)
    return pa.array(out, pa.int32())


def _messages_array(rows: list[Trajectory]) -> pa.Array:
    """The messages column, built from flat per-field lists plus offsets (no per-row dicts)."""
    msgs = [m for r in rows for m in r.messages]
    calls = [c for m in msgs if m.tool_calls for c in m.tool_calls]
    function = pa.StructArray.from_arrays(
        [pa.array([c.function.name for c in calls], pa.string()),
         pa.array([c.function.arguments for c in calls], pa.string())], fields=list(FUNCTION_TYPE))
    call = pa.StructArray.from_arrays(
        [pa.array([c.id for c in calls], pa.string()), pa.array([c.type for c in calls], pa.string()), function],
        fields=list(TOOL_CALL_TYPE))
    tool_calls = pa.ListArray.from_arrays(_offsets(len(m.tool_calls or ()) for m in msgs), call,
                                          mask=pa.array([m.tool_calls is None for m in msgs], pa.bool_()))
    message = pa.StructArray.from_arrays(
        [pa.array([m.role for m in msgs], pa.string()), pa.array([m.content for m in msgs], pa.string()),
         tool_calls, pa.array([m.tool_call_id for m in msgs], pa.string()),
         pa.array([m.name for m in msgs], pa.string()), pa.array([m.reasoning for m in msgs], pa.string())],
        fields=list(MESSAGE_TYPE))
    return pa.ListArray.from_arrays(_offsets(len(r.messages) for r in rows), message)


def trajectories_to_file_table(rows: list[Trajectory]) -> pa.Table:
    """Rows -> an Arrow table with FILE_SCHEMA (the record minus partition columns).

    Same values as record.to_table (a test holds them equal), about 2x faster: each column is built from one
    list of attribute values, messages from flat per-field lists and offsets, with no per-row dict or JSON.
    """
    cols = [_messages_array(rows) if f.name == "messages" else pa.array([getattr(r, f.name) for r in rows], f.type)
            for f in FILE_SCHEMA]
    return pa.Table.from_arrays(cols, schema=FILE_SCHEMA)


_WARM_LOCK = threading.Lock()
_WARMED: list[threading.Thread] = []


def warm_writer() -> None:
    """Start, once per process, a thread that pays pyarrow's first-array cost now (its first pa.array imports
    pandas: about 0.5 s), so that it overlaps the episodes, which mostly wait on sandboxes, instead of delaying the
    first write. Nothing depends on it: a write that comes first waits on the import as it would anyway."""
    with _WARM_LOCK:
        if not _WARMED:
            _WARMED.append(threading.Thread(target=pa.array, args=([], pa.string()), name="flywheel-warm-arrow"))
            _WARMED[0].start()


def write_trajectories(root: str, rows: Iterable[Trajectory]) -> WriteResult:
    """Write rows into the lake, one atomic file per (run_id, round) group, skipping ids already present.

    Rows repeated within the batch (same trajectory_id) are written once. Returns counts and the new file paths.
    Raises LakeError for rows that are not Trajectory objects or whose run_id cannot name a folder.
    """
    lake = open_lake(root)
    groups: dict[tuple[str, int], list[Trajectory]] = {}
    skipped = 0
    seen: set[str] = set()
    for r in rows:
        if not isinstance(r, Trajectory):
            raise LakeError(
                f"write_trajectories takes warehouse.record.Trajectory objects, got {type(r).__name__}; "
                f"build one with Trajectory(...) or warehouse.record.from_dict(d)"
            )
        if r.trajectory_id in seen:
            skipped += 1
            continue
        seen.add(r.trajectory_id)
        check_partition_value("run_id", r.run_id)
        groups.setdefault((r.run_id, r.round), []).append(r)

    written = 0
    paths: list[str] = []
    for (run_id, rnd), group in groups.items():
        folder = partition_dir(lake, run_id, rnd)
        present, seen_names = _partition_state(lake, folder)
        new = [r for r in group if r.trajectory_id not in present]
        skipped += len(group) - len(new)
        if not new:
            continue
        table = trajectories_to_file_table(new).replace_schema_metadata({SEEN_KEY: seen_digest(seen_names)})
        path = folder + "/" + _new_part_name()
        url = lake.write_parquet_atomic(table, path)
        info = lake.stat(path)
        if info is not None:  # remember our own ids without re-reading the file
            _ID_CACHE[(lake.url(path), info.size, info.mtime)] = frozenset(r.trajectory_id for r in new)
        written += len(new)
        paths.append(url)
    return WriteResult(written=written, skipped=skipped, paths=paths)


def _rows_to_table(table_name: str, schema: pa.Schema, rows: list[dict[str, Any]]) -> pa.Table:
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise LakeError(f"rows for table {table_name!r} must be a list of dicts")
    names = set(schema.names)
    now = datetime.now(UTC)
    fixed = []
    for i, r in enumerate(rows):
        unknown = set(r) - names
        if unknown:
            raise LakeError(
                f"row {i} for table {table_name!r} has unknown columns {sorted(unknown)}; "
                f"known columns: {schema.names}"
            )
        missing = [c for c in REQUIRED_COLUMNS.get(table_name, ()) if r.get(c) is None]
        if missing:
            raise LakeError(f"row {i} for table {table_name!r} lacks required columns {missing}")
        if "created_at" in names and r.get("created_at") is None:
            r = {**r, "created_at": now}
        fixed.append(r)
    try:
        return pa.Table.from_pylist(fixed, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
        raise LakeError(f"rows for table {table_name!r} do not fit its schema: {e}") from e


def write_rows(root: str, table: str, rows: list[dict[str, Any]]) -> str:
    """Append rows to a side table (datasets | rounds | checkpoints) as one atomic file; returns its path.

    Columns are those of tables.SIDE_TABLES[table]; missing optional columns are null, created_at defaults to now.
    Readers keep the latest row per key (e.g. per snapshot_id), so re-writing a row after a retry is harmless.
    """
    if table not in SIDE_TABLES:
        raise LakeError(f"unknown side table {table!r}: choose one of {sorted(SIDE_TABLES)} "
                        f"(trajectories go through write_trajectories, manifests through write_manifest)")
    if not rows:
        raise LakeError(f"write_rows({table!r}) got no rows: nothing to write")
    lake = open_lake(root)
    schema = SIDE_TABLES[table][0]
    t = _rows_to_table(table, schema, rows)
    return lake.write_parquet_atomic(t, lake.join(table, _new_part_name()))


def manifest_path(root: str, snapshot_id: str) -> str:
    """Where the manifest of snapshot_id lives (local path, or URL for object stores)."""
    lake = open_lake(root)
    check_partition_value("snapshot_id", snapshot_id)
    return lake.url(lake.join(SNAPSHOTS_DIR, snapshot_id, MANIFEST_FILE))


def write_manifest(root: str, snapshot_id: str, rows: list[dict[str, Any]]) -> str:
    """Write (or atomically replace) the manifest of one training snapshot; returns its path.

    Each row names one example: trajectory_id, source, run_id, round, task_id, suite, policy, weight
    (snapshot_id is filled in). An empty snapshot is allowed and writes an empty manifest.
    """
    lake = open_lake(root)
    check_partition_value("snapshot_id", snapshot_id)
    path = lake.join(SNAPSHOTS_DIR, snapshot_id, MANIFEST_FILE)
    rows = [{**r, "snapshot_id": snapshot_id} for r in rows]
    t = _rows_to_table("manifests", MANIFEST_SCHEMA, rows)
    return lake.write_parquet_atomic(t, path)


def sweep_temp_files(root: str, older_than_s: float = 3600.0) -> list[str]:
    """Remove temp files left by writers killed mid-write (only local roots leave them). Readers never see them;
    this only reclaims disk. Returns the removed paths."""
    lake = open_lake(root)
    if not lake.local:
        return []
    removed = []
    cutoff = time.time() - older_than_s
    for dirpath, _dirs, files in os.walk(lake.base):
        if os.path.basename(dirpath) == QUARANTINE_DIR:
            continue
        for name in files:
            if name.startswith(".") and name.endswith(TEMP_SUFFIX):
                p = os.path.join(dirpath, name)
                try:
                    if os.stat(p).st_mtime < cutoff:
                        os.unlink(p)
                        removed.append(p)
                except FileNotFoundError:
                    pass
    return removed


@dataclass(frozen=True)
class CompactResult:
    partitions: int
    files_before: int
    files_after: int
    rows: int
    duplicates_dropped: int


def compact(root: str, run_id: str | None = None, round: int | None = None, min_files: int = 2) -> CompactResult:
    """Merge the files of each trajectory partition (run_id, round) that has at least min_files files into one
    file, dropping duplicate ids (the earliest-written copy wins, as on read), then delete the merged files.

    Safe beside readers and writers: the merged file is written atomically before any old file is deleted, so a
    reader sees every row at every moment (possibly twice for a moment, which the trajectories view hides), and
    files a writer adds meanwhile are left alone. Corrupt files are quarantined, not merged.
    """
    lake = open_lake(root)
    top = lake.join(TRAJECTORIES_DIR) if run_id is None else partition_dir(lake, run_id, round)
    by_part: dict[str, list[FileInfo]] = {}
    for info in lake.list_files(top):
        folder = os.path.dirname(info.path) if lake.local else info.path.rsplit("/", 1)[0]
        by_part.setdefault(folder, []).append(info)
    parts = files_before = files_after = rows = dropped = 0
    for folder, infos in sorted(by_part.items()):
        files_before += len(infos)
        if len(infos) < min_files:
            files_after += len(infos)
            continue
        good = [i for i in infos if validate_or_quarantine(lake, i, "trajectories") is not None]
        tables = [pq.ParquetFile(i.path, filesystem=lake.arrow_fs).read() for i in good]  # sorted = write order
        merged = pa.concat_tables(tables, promote_options="permissive")
        ids = merged.column("trajectory_id").to_pylist()
        seen: set[str] = set()
        keep = [not (t in seen or seen.add(t)) for t in ids]  # type: ignore[func-returns-value]
        if not all(keep):
            merged = merged.filter(pa.array(keep))
        dropped += len(ids) - merged.num_rows
        seen = [_basename(i.path) for i in infos if i not in good and lake.stat(i.path) is not None]
        merged = merged.replace_schema_metadata({SEEN_KEY: seen_digest(seen)})
        lake.write_parquet_atomic(merged, folder + "/" + _new_part_name())
        for i in good:
            try:
                lake.remove(i.path)
            except FileNotFoundError:  # another compactor got there first
                pass
        if lake.local:
            fsync_dir(folder)
        parts += 1
        files_after += 1
        rows += merged.num_rows
    return CompactResult(partitions=parts, files_before=files_before, files_after=files_after, rows=rows,
                         duplicates_dropped=dropped)
