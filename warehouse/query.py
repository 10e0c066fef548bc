"""Reading the trajectory lake with SQL: an in-memory DuckDB with views over the Parquet tree.

Views (each exists, possibly empty, even before any file is written):
  trajectories      one row per trajectory_id (the earliest-written copy wins if racing writers stored two;
                    only partitions whose files' seen-digests show a race pay for the de-duplication window)
  trajectories_raw  every stored row, with `filename`: shows duplicates and where each row lives
  messages          one row per message: trajectory_id, idx, role, content, tool_call_id, name, n_tool_calls
  tool_calls        one row per call: trajectory_id, message_idx, call_idx, id, name, arguments
  datasets, manifests, rounds, checkpoints   side tables (latest row per key for datasets/rounds/checkpoints)
  verifier_health                            per task: oracle/null/mutant/flake figures of `flywheel tasks audit`
                                             (latest row per task id, task version, verifier version)
  task_synthesis                             per candidate of `flywheel tasks synthesize`: writer, decision,
                                             reason codes, audit figures, cost

Before the views are built every data file is checked (integrity.py: magic bytes and footer length on each
connect, a full footer parse once per file). A bad file is moved to ROOT/quarantine/ with a .reason.txt beside
it, a warning names it, and the views skip it; query()
also quarantines a file that DuckDB reports as corrupt while scanning, then runs the query again.
Schema evolution: files that differ from the current schema are read with union_by_name, and columns of the
current schema that no file carries yet read as NULL.

This module does not write trajectories (lake.py does) and keeps no DuckDB file on disk.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from warehouse.integrity import (
    CURRENT_FINGERPRINT,
    FileCheck,
    QuarantineRecord,
    load_footer_cache,
    save_footer_cache,
    quarantine_file,
    seen_digest,
    validate_or_quarantine,
)
from warehouse.lakefs import FileInfo, open_lake
from warehouse.record import TRAJECTORY_SCHEMA, Trajectory, from_dict
from warehouse.tables import (
    MANIFEST_FILE,
    MANIFEST_SCHEMA,
    SIDE_TABLES,
    SNAPSHOTS_DIR,
    TRAJECTORIES_DIR,
)

log = logging.getLogger(__name__)

VIEWS = ("trajectories", "trajectories_raw", "messages", "tool_calls", "datasets", "manifests", "rounds",
         "checkpoints")
_HIVE_REL = re.compile(r"^run=[A-Za-z0-9._-]+/round=\d+/[^/]+\.parquet$")


class QueryError(Exception):
    """A query could not run: bad SQL, unknown column or view. The message names the views to use."""


@dataclass
class ScanResult:
    """Good files per table (urls DuckDB reads), their schema fingerprints, what was quarantined, and the
    trajectory files split into partitions known free of duplicate ids (`clean`) and the others (`suspect`)."""

    files: dict[str, list[str]]
    fingerprints: dict[str, set[str]]
    quarantined: list[QuarantineRecord]
    clean: list[str]
    suspect: list[str]


def _split_clean(by_folder: dict[str, list[tuple[str, str, FileCheck]]]) -> tuple[list[str], list[str]]:
    """A partition is clean when each file's writer saw exactly the files sorted before it (see lake.SEEN_KEY)."""
    clean: list[str] = []
    suspect: list[str] = []
    for _folder, entries in sorted(by_folder.items()):
        entries.sort(key=lambda e: e[0])
        ok = True
        for k, (_name, _url, fc) in enumerate(entries):
            if fc.seen != seen_digest(e[0] for e in entries[:k]):
                ok = False
                break
        (clean if ok else suspect).extend(url for _n, url, _fc in entries)
    return clean, suspect


def scan(root: str, read_only: bool = False) -> ScanResult:
    """List every data file of the lake, check each, quarantine bad ones (read_only: skip them, move nothing)."""
    lake = open_lake(root)
    persisted = load_footer_cache(lake)
    before = dict(persisted)
    quarantined: list[QuarantineRecord] = []
    files: dict[str, list[str]] = {}
    fps: dict[str, set[str]] = {}
    groups: dict[str, list[FileInfo]] = {
        "trajectories": lake.list_files(lake.join(TRAJECTORIES_DIR)),
        "manifests": [f for f in lake.list_files(lake.join(SNAPSHOTS_DIR)) if f.path.endswith("/" + MANIFEST_FILE)],
    }
    for t in SIDE_TABLES:
        groups[t] = lake.list_files(lake.join(t))
    traj_top = lake.join(TRAJECTORIES_DIR)
    by_folder: dict[str, list[tuple[str, str, FileCheck]]] = {}
    for table, infos in groups.items():
        good: list[str] = []
        seen_fps: set[str] = set()
        for info in infos:
            rel = ""
            if table == "trajectories":
                rel = info.path[len(traj_top) + 1 :].replace(os.sep, "/")
                if not _HIVE_REL.match(rel):
                    log.warning("ignoring %s: trajectory files belong in trajectories/run=<run_id>/round=<n>/",
                                info.path)
                    continue
            fc = validate_or_quarantine(lake, info, table, quarantined, persisted, move=not read_only)
            if fc is not None:
                url = lake.url(info.path)
                good.append(url)
                seen_fps.add(fc.fingerprint)
                if table == "trajectories":
                    folder, name = rel.rsplit("/", 1)
                    by_folder.setdefault(folder, []).append((name, url, fc))
        files[table] = good
        fps[table] = seen_fps
    if persisted != before:
        live = {u for fl in files.values() for u in fl}
        save_footer_cache(lake, {u: e for u, e in persisted.items() if u in live})
    clean, suspect = _split_clean(by_folder)
    return ScanResult(files=files, fingerprints=fps, quarantined=quarantined, clean=clean, suspect=suspect)


# ----------------------------------------------------------------------------- views
# The file lists reach read_parquet as connection variables (SET VARIABLE name = ?, a bound parameter), never as
# SQL text: a view cannot hold a prepared parameter, but it can read getvariable() when it is bound.
def _file_list(con: duckdb.DuckDBPyConnection, name: str, urls: list[str]) -> str:
    """Bind urls to the connection variable `name`; returns the SQL expression that reads it."""
    con.execute(f"SET VARIABLE {name} = ?", [urls])
    return f"getvariable('{name}')"


def _traj_select(con: duckdb.DuckDBPyConnection, name: str, urls: list[str], fingerprints: set[str]) -> str:
    """SQL for all rows of the given trajectory files, with every current column (NULL where a file lacks it),
    columns a newer writer added, and `filename`."""
    if not urls:
        return "SELECT *, NULL::VARCHAR AS filename FROM _empty_trajectories"
    files = _file_list(con, f"_files_{name}", urls)
    cols = ", ".join(f'"{n}"' for n in TRAJECTORY_SCHEMA.names)
    hive = "hive_partitioning=true, hive_types={'run': VARCHAR, 'round': INTEGER}, filename=true"
    if fingerprints == {CURRENT_FINGERPRINT}:
        # Every file has exactly the current schema: no need to read all footers at bind time.
        return (f"SELECT {cols}, filename FROM (SELECT * EXCLUDE (run), run AS run_id "
                f"FROM read_parquet({files}, {hive}))")
    return (f"SELECT * FROM _empty_trajectories UNION ALL BY NAME SELECT * EXCLUDE (run), run AS run_id "
            f"FROM read_parquet({files}, {hive}, union_by_name=true)")


def _create_views(con: duckdb.DuckDBPyConnection, result: ScanResult) -> None:
    con.register("_empty_trajectories", TRAJECTORY_SCHEMA.empty_table())
    fps = result.fingerprints["trajectories"]
    # Partitions whose files provably hold distinct ids are read as they are; the others are de-duplicated
    # (earliest-written file wins; names sort in write order).
    con.execute(f"CREATE VIEW _traj_clean AS {_traj_select(con, 'clean', result.clean, fps)}")
    con.execute(f"CREATE VIEW _traj_suspect AS {_traj_select(con, 'suspect', result.suspect, fps)}")
    con.execute("CREATE VIEW trajectories_raw AS SELECT * FROM _traj_clean UNION ALL BY NAME "
                "SELECT * FROM _traj_suspect")
    if not result.suspect:
        body = "SELECT * EXCLUDE (filename) FROM _traj_clean"
    elif not result.clean:
        body = ("SELECT * EXCLUDE (filename) FROM _traj_suspect "
                "QUALIFY row_number() OVER (PARTITION BY trajectory_id ORDER BY filename) = 1")
    else:
        body = ("SELECT * EXCLUDE (filename) FROM _traj_clean UNION ALL BY NAME "
                "SELECT * EXCLUDE (filename) FROM _traj_suspect "
                "QUALIFY row_number() OVER (PARTITION BY trajectory_id ORDER BY filename) = 1")
    con.execute(f"CREATE VIEW trajectories AS {body}")
    con.execute(
        """CREATE VIEW messages AS
        SELECT trajectory_id, idx, m.role AS role, m.content AS content, m.tool_call_id AS tool_call_id,
               m.name AS name, m.reasoning AS reasoning, coalesce(len(m.tool_calls), 0)::INTEGER AS n_tool_calls
        FROM (SELECT trajectory_id, unnest(messages) AS m, (generate_subscripts(messages, 1) - 1)::INTEGER AS idx
              FROM trajectories)"""
    )
    con.execute(
        """CREATE VIEW tool_calls AS
        SELECT trajectory_id, message_idx, call_idx, tc.id AS id, tc.function.name AS name,
               tc.function.arguments AS arguments
        FROM (SELECT trajectory_id, message_idx, unnest(m.tool_calls) AS tc,
                     (generate_subscripts(m.tool_calls, 1) - 1)::INTEGER AS call_idx
              FROM (SELECT trajectory_id, unnest(messages) AS m,
                           (generate_subscripts(messages, 1) - 1)::INTEGER AS message_idx
                    FROM trajectories)
              WHERE len(m.tool_calls) > 0)"""
    )
    side = {name: (schema, key, order) for name, (schema, key, order) in SIDE_TABLES.items()}
    side["manifests"] = (MANIFEST_SCHEMA, (), "")
    for name, (schema, key, order) in side.items():
        con.register(f"_empty_{name}", schema.empty_table())
        urls = result.files.get(name, [])
        body = f"SELECT * FROM _empty_{name}"
        if urls:
            body += (f" UNION ALL BY NAME SELECT * FROM read_parquet({_file_list(con, f'_files_{name}', urls)}, "
                     f"hive_partitioning=false, union_by_name=true)")
        if key:
            part = ", ".join(f'"{k}"' for k in key)
            body = (f"SELECT * FROM ({body}) QUALIFY row_number() OVER (PARTITION BY {part} "
                    f'ORDER BY "{order}" DESC NULLS LAST) = 1')
        con.execute(f"CREATE VIEW {name} AS {body}")


def connect(root: str, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the lake's views (see the module docstring). Corrupt files are
    quarantined first (read_only: skipped, left in place); each view exists even when no file has been written."""
    lake = open_lake(root)
    result = scan(root, read_only=read_only)
    con = duckdb.connect(":memory:")
    con.execute("SET parquet_metadata_cache = true")
    if not lake.local:
        assert lake.fs is not None
        con.register_filesystem(lake.fs)
    _create_views(con, result)
    return con


_FILE_IN_ERROR = re.compile(r"""(?:file|File)\s*["'`]?([^"'`\s]+\.parquet)""")


def _corrupt_file_in(root: str, err: Exception) -> str | None:
    """The lake data file a DuckDB scan error names, if the error is about a file's contents."""
    msg = str(err)
    lake = open_lake(root)
    base = lake.base if lake.local else lake.url(lake.base)
    for m in _FILE_IN_ERROR.finditer(msg):
        p = m.group(1)
        if p.startswith(base):
            return p
    for tok in re.findall(r"[^\s\"'`]+\.parquet", msg):
        if tok.startswith(base):
            return tok
    return None


# Errors about the SQL itself: never a reason to suspect a file.
_SQL_ERRORS = (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException, duckdb.SyntaxException,
               duckdb.NotImplementedException, duckdb.PermissionException)
# (url, size, mtime) of files whose every page was decoded and checksummed.
_FULLY_VERIFIED: set[tuple[str, int, float | None]] = set()


def find_unreadable_files(root: str) -> list[QuarantineRecord]:
    """Decode every page of every data file not verified before (page checksums on) and quarantine those that
    fail. Costs a full read of the lake: query() calls it only after a scan error that names no file."""
    lake = open_lake(root)
    out: list[QuarantineRecord] = []
    result = scan(root)
    out.extend(result.quarantined)
    for urls in result.files.values():
        for url in urls:
            path = url if lake.local else url.split("://", 1)[-1]
            info = lake.stat(path)
            if info is None:
                continue
            key = (url, info.size, info.mtime)
            if key in _FULLY_VERIFIED:
                continue
            try:
                pf = pq.ParquetFile(path, filesystem=lake.arrow_fs, page_checksum_verification=True)
                for i in range(pf.num_row_groups):
                    pf.read_row_group(i)
            except FileNotFoundError:
                continue
            except (pa.ArrowException, OSError, ValueError) as e:
                rec = quarantine_file(root, path, f"pages cannot be decoded: {e}")
                if rec is not None:
                    out.append(rec)
                continue
            _FULLY_VERIFIED.add(key)
    return out


Params = list[object] | dict[str, object] | None


def query(root: str, sql: str, params: Params = None, max_retries: int = 10) -> pa.Table:
    """Run one SQL statement over the lake's views and return the result as an Arrow table. Values go in params
    (`?` placeholders and a list, or `$name` and a dict), never into the SQL text.

    If the scan fails on a file that is corrupt beyond its footer, that file is quarantined (the one DuckDB names,
    or every file a full checksummed read rejects) and the query runs again, up to max_retries times.
    Raises QueryError for bad SQL, naming the views.
    """
    for _ in range(max_retries + 1):
        con = connect(root)
        try:
            rel = con.sql(sql, params=params)
            if rel is None:
                return pa.table({})
            return rel.to_arrow_table()
        except _SQL_ERRORS as e:
            raise QueryError(f"{e}\n(views: {', '.join(VIEWS)})") from e
        except duckdb.Error as e:
            if isinstance(e, duckdb.InvalidInputException) and "parameter" in str(e).lower():
                # placeholders and params do not match: the caller's mistake, not a file's
                raise QueryError(f"{e} (params: {params!r})") from e
            first = str(e).splitlines()[0]
            bad = _corrupt_file_in(root, e)
            if bad is not None:
                lake = open_lake(root)
                path = bad if lake.local else bad.split("://", 1)[-1]
                if lake.stat(path) is not None:  # else: vanished meanwhile (quarantined, compacted): just retry
                    quarantine_file(root, path, f"DuckDB could not read it: {first}")
                continue
            if not find_unreadable_files(root):
                raise QueryError(f"query failed: {e}\n(views: {', '.join(VIEWS)})") from e
        finally:
            con.close()
    raise QueryError(f"query kept failing on corrupt files under {root} after {max_retries} retries")


def _trajectories_sql(where: str | None, order_by: str | None) -> str:
    sql = "SELECT * FROM trajectories"
    if where:
        sql += f" WHERE {where}"
    if order_by:
        sql += f" ORDER BY {order_by}"
    return sql


def iter_trajectories(root: str, where: str | None = None, params: Params = None, batch_size: int = 1024,
                      order_by: str = "run_id, round, created_at, trajectory_id") -> Iterator[pa.RecordBatch]:
    """Stream the de-duplicated trajectories matching a SQL WHERE clause (values as `?` and params) as Arrow
    record batches (files found corrupt at connect are quarantined; a scan error mid-stream raises QueryError,
    with no retry)."""
    con = connect(root)
    try:
        reader = con.sql(_trajectories_sql(where, order_by), params=params).to_arrow_reader(batch_size)
        yield from reader
    except duckdb.Error as e:
        raise QueryError(f"reading trajectories WHERE {where!r} (params {params!r}) failed: {e}") from e
    finally:
        con.close()


def read_trajectories(root: str, where: str | None = None, params: Params = None) -> list[Trajectory]:
    """The de-duplicated trajectories matching a SQL WHERE clause with `?` placeholders for values (e.g.
    read_trajectories(root, "task_id = ? AND round = ?", [task_id, 2])), as typed records, in (run_id, round,
    created_at, trajectory_id) order. Corrupt files are quarantined and the read retried, as in query(). Loads
    everything in memory: use iter_trajectories for large selections."""
    sql = _trajectories_sql(where, "run_id, round, created_at, trajectory_id")
    return [from_dict(d) for d in query(root, sql, params).to_pylist()]


# ----------------------------------------------------------------------------- `flywheel sql`
SQL_FORMATS = ("table", "json", "jsonl", "csv", "parquet")


def _jsonable(v: object) -> object:
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    try:  # Decimal, date, time, timedelta...
        return float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(v)


def _flatten_nested(table: pa.Table) -> pa.Table:
    """CSV cannot hold lists or structs: turn nested columns into JSON strings."""
    cols = []
    for name, col in zip(table.column_names, table.columns, strict=True):
        if pa.types.is_nested(col.type):
            col = pa.array([None if v is None else json.dumps(_jsonable(v)) for v in col.to_pylist()], pa.string())
        cols.append(col)
    return pa.table(cols, names=table.column_names)


def format_result(table: pa.Table, fmt: str, max_rows: int = 200, max_width: int = 80) -> str:
    """Render a result as text: table (rich), json (one JSON array of row objects), jsonl (one object per line)
    or csv (header line; nested values as JSON strings)."""
    if fmt == "json":
        return json.dumps([_jsonable(r) for r in table.to_pylist()], ensure_ascii=False)
    if fmt == "jsonl":
        return "\n".join(json.dumps(_jsonable(r), ensure_ascii=False) for r in table.to_pylist())
    if fmt == "csv":
        import io

        import pyarrow.csv as pacsv

        buf = io.BytesIO()
        pacsv.write_csv(_flatten_nested(table), buf)
        return buf.getvalue().decode("utf-8").rstrip("\n")
    if fmt == "table":
        from rich.console import Console
        from rich.table import Table

        t = Table(show_lines=False)
        for c in table.column_names:
            t.add_column(c, overflow="fold", max_width=max_width)
        for r in table.slice(0, max_rows).to_pylist():
            cells = []
            for v in r.values():
                s = "NULL" if v is None else json.dumps(_jsonable(v)) if isinstance(v, (list, dict)) else str(v)
                cells.append(s if len(s) <= max_width else s[: max_width - 1] + "…")
            t.add_row(*cells)
        if table.num_rows > max_rows:
            t.caption = f"{max_rows} of {table.num_rows} rows shown (use --format csv/json/parquet for all)"
        else:
            t.caption = f"{table.num_rows} row{'s' if table.num_rows != 1 else ''}"
        import io

        buf = io.StringIO()
        Console(file=buf, width=max(100, min(250, 24 * len(table.column_names))), force_terminal=False,
                color_system=None).print(t)
        return buf.getvalue()
    raise QueryError(f"unknown output format {fmt!r}: choose one of {', '.join(SQL_FORMATS)}")


def sql_command(root: str, sql: str, fmt: str = "table", output: str | None = None) -> pa.Table:
    """`flywheel sql`: run sql over the lake and print the result (table, json, jsonl, csv) or write it to
    output (any format; parquet needs output). The query runs before any file is written, so a bad query leaves
    no partial output. Returns the result table."""
    if fmt not in SQL_FORMATS:
        raise QueryError(f"unknown output format {fmt!r}: choose one of {', '.join(SQL_FORMATS)}")
    if fmt == "parquet" and not output:
        raise QueryError("--format parquet writes a file: pass --output PATH.parquet")
    table = query(root, sql)
    if output:
        folder = os.path.dirname(os.path.abspath(output))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(output)}.", suffix=".tmp")
        os.close(fd)
        try:
            if fmt == "parquet":
                pq.write_table(table, tmp, compression="zstd")
            else:
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(format_result(table, fmt, max_rows=table.num_rows) + "\n")
            os.replace(tmp, output)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    else:
        print(format_result(table, fmt), end="" if fmt == "table" else "\n")
    return table
