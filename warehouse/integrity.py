"""File integrity of the lake: cheap and footer checks of each data file, the footer cache, and quarantine.

Every data file is checked before it is read (magic bytes and footer length each time; a full footer parse once
per file, remembered by path+size+mtime in-process and in a small cache file under FLYWHEEL_CACHE_DIR or
~/.cache/flywheel). A bad file is moved to ROOT/quarantine/ with a .reason.txt beside it and a warning naming it
(or, for read-only readers, skipped in place). Also here: the `flywheel.seen` digest each trajectory file's writer
records of the files it saw, which readers use to skip de-duplication. Used by the writer (lake.py) and the
readers (query.py); this module writes no rows and runs no SQL.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq

from warehouse.lakefs import FILE_SCHEMA, FileInfo, Lake, open_lake
from warehouse.tables import QUARANTINE_DIR

log = logging.getLogger(__name__)

_MAGIC = b"PAR1"

# Parquet key-value metadata each trajectory file carries: a digest of the names of the files its writer saw in
# the partition (and whose ids it skipped). When every file of a partition saw exactly the files sorted before
# it, no two files share an id and readers skip de-duplication for that partition.
SEEN_KEY = b"flywheel.seen"


def seen_digest(names: Iterable[str]) -> str:
    """Digest of a set of file base names (order-free)."""
    return hashlib.sha1("\n".join(sorted(names)).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class QuarantineRecord:
    path: str
    moved_to: str
    reason: str


def _canonical_type(t: pa.DataType) -> str:
    if pa.types.is_list(t) or pa.types.is_large_list(t):  # list item names differ by writer: item / element
        return f"list<{_canonical_type(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{_canonical_type(f.type)}" for f in t) + ">"
    return str(t)


def schema_fingerprint(schema: pa.Schema) -> str:
    """Short hash of a schema's column names and types (metadata and list item names ignored)."""
    text = ";".join(f"{f.name}:{_canonical_type(f.type)}" for f in schema)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


CURRENT_FINGERPRINT = schema_fingerprint(FILE_SCHEMA)

# ----------------------------------------------------------------------------- validation and quarantine
# (url, size, mtime) -> what the footer of a deep-checked good file told.
_CHECKED: dict[tuple[str, int, float | None], FileCheck] = {}
_PERSISTED: dict[str, dict[str, list]] = {}  # root -> {url: [size, mtime, fingerprint]} as loaded from disk


def _cache_file(lake: Lake) -> str:
    base = os.environ.get("FLYWHEEL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "flywheel"
    )
    key = hashlib.sha1((lake.base if lake.local else lake.url(lake.base)).encode()).hexdigest()[:20]
    return os.path.join(base, "lake-footers", f"{key}.json")


def load_footer_cache(lake: Lake) -> dict[str, list]:
    path = _cache_file(lake)
    if path not in _PERSISTED:
        try:
            with open(path, encoding="utf-8") as f:
                _PERSISTED[path] = json.load(f)
        except (OSError, ValueError):
            _PERSISTED[path] = {}
    return _PERSISTED[path]


def save_footer_cache(lake: Lake, entries: dict[str, list]) -> None:
    path = _cache_file(lake)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entries, f)
        os.replace(tmp, path)
    except OSError as e:  # the cache only saves time; a read-only home must not break queries
        log.debug("could not save footer cache %s: %s", path, e)


def _read_ends(lake: Lake, path: str, size: int) -> tuple[bytes, bytes]:
    if lake.local:
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(max(size - 8, 0))
            tail = f.read(8)
    else:
        assert lake.fs is not None
        with lake.fs.open(path, "rb") as f:
            head = f.read(4)
            f.seek(max(size - 8, 0))
            tail = f.read(8)
    return head, tail


def cheap_check(lake: Lake, info: FileInfo) -> str | None:
    """The reason a file is not a whole Parquet file (magic bytes, footer length), or None when it looks whole."""
    if info.size < 12:
        return f"file is {info.size} bytes, too small for a Parquet header and footer (truncated)"
    head, tail = _read_ends(lake, info.path, info.size)
    if head != _MAGIC:
        return "no Parquet magic bytes at the start of the file"
    if len(tail) != 8 or tail[4:] != _MAGIC:
        return "no Parquet magic bytes at the end of the file (truncated or torn write)"
    footer_len = int.from_bytes(tail[:4], "little")
    if footer_len <= 0 or footer_len > info.size - 12:
        return f"footer length {footer_len} does not fit in a file of {info.size} bytes (corrupt footer)"
    return None


@dataclass(frozen=True)
class FileCheck:
    """What a good file's footer told: its schema fingerprint and its writer's seen-files digest ('' if none)."""

    fingerprint: str
    seen: str


def deep_check(lake: Lake, info: FileInfo, required: tuple[str, ...] = ()) -> tuple[str | None, FileCheck | None]:
    """Parse the footer. Returns (reason, None) for a bad file, (None, FileCheck) for a good one."""
    try:
        md = pq.read_metadata(info.path, filesystem=lake.arrow_fs)
        schema = md.schema.to_arrow_schema()
    except (pa.ArrowException, OSError, ValueError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        return f"footer cannot be parsed: {e}", None
    missing = [c for c in required if c not in schema.names]
    if missing:
        return f"lacks required columns {missing}", None
    seen = (md.metadata or {}).get(SEEN_KEY, b"").decode("utf-8", "replace")
    return None, FileCheck(schema_fingerprint(schema), seen)


def quarantine_file(root: str, path: str, reason: str) -> QuarantineRecord | None:
    """Move a bad file to ROOT/quarantine/ (name keeps its old relative path), write PATH.reason.txt beside it,
    and log a warning naming it. Returns None when the file was already gone (another reader moved it)."""
    lake = open_lake(root)
    rel = lake.relpath(path).replace("/", "__").replace(os.sep, "__")
    dest = lake.join(QUARANTINE_DIR, rel)
    n = 1
    while lake.stat(dest) is not None:
        dest = lake.join(QUARANTINE_DIR, f"{rel}.{n}")
        n += 1
    try:
        lake.move(path, dest)
    except FileNotFoundError:
        return None
    when = datetime.now(UTC).isoformat()
    lake.write_text(dest + ".reason.txt", f"file: {path}\nquarantined_at: {when}\nreason: {reason}\n")
    log.warning("quarantined corrupt lake file %s: %s (moved to %s)", path, reason, dest)
    return QuarantineRecord(path=path, moved_to=dest, reason=reason)


def validate_or_quarantine(
    lake: Lake, info: FileInfo, table: str = "trajectories", quarantined: list[QuarantineRecord] | None = None,
    persisted: dict[str, list] | None = None, move: bool = True,
) -> FileCheck | None:
    """Check one file (cheap checks always, a footer parse once per path+size+mtime); quarantine it when bad
    (with move=False: leave it where it is, skip it and warn). Returns what its footer told when good, None when
    it was bad or vanished."""
    url = lake.url(info.path)
    key = (url, info.size, info.mtime)
    try:
        reason = cheap_check(lake, info)
        fc = _CHECKED.get(key)
        if reason is None and fc is None and persisted is not None:
            entry = persisted.get(url)
            if entry and len(entry) == 4 and entry[0] == info.size and entry[1] == info.mtime:
                fc = FileCheck(entry[2], entry[3])
        if reason is None and fc is None:
            required = ("trajectory_id",) if table == "trajectories" else ()
            reason, fc = deep_check(lake, info, required)
            if fc is not None and persisted is not None:
                persisted[url] = [info.size, info.mtime, fc.fingerprint, fc.seen]
    except FileNotFoundError:
        return None
    if (reason is not None or fc is None) and not move:
        log.warning("skipping corrupt lake file %s: %s (left in place; `flywheel sql` moves it to quarantine/)",
                    info.path, reason or "unreadable")
        return None
    if reason is not None or fc is None:
        rec = quarantine_file(lake.root, info.path, reason or "unreadable")
        if rec is not None and quarantined is not None:
            quarantined.append(rec)
        _CHECKED.pop(key, None)
        return None
    _CHECKED[key] = fc
    return fc
