"""The lake's filesystem: a resolved root (a local folder with fsync, or an fsspec filesystem for object stores),
its listing, stat and atomic Parquet writes, and the on-disk schema of trajectory files.

Used by the writer (lake.py), the file checks (integrity.py) and the readers (query.py, viewer.py). A batch
becomes visible whole or not at all: on a local disk it is written under a hidden temp name (`.NAME.<hex>.tmp`,
which no reader globs) in its destination folder, fsynced, renamed into place, and the folder is fsynced; on an
object store the file is built in memory and sent in one PUT (`pipe_file`), so a write that fails part-way sends
nothing (a stream left open would publish what it had written when closed). Listings of an object store start
from a fresh view: fsspec's listing cache is dropped first, since another process (a worker, a Ray node) may have
written files since this process last listed, and the cached listing would call them missing when they are
opened. This module knows nothing of rows, partitions or DuckDB.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlparse

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from warehouse.record import PARTITION_COLUMNS, TRAJECTORY_SCHEMA

# Files inside a partition hold the record minus the partition columns (they live in the folder names).
FILE_SCHEMA = pa.schema([f for f in TRAJECTORY_SCHEMA if f.name not in PARTITION_COLUMNS])

PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "row_group_size": 64 * 1024,
    "write_page_checksum": True,
}
TEMP_SUFFIX = ".tmp"


class LakeError(Exception):
    """A write or read of the lake was refused: bad root, bad partition value, bad table name, bad rows."""


@dataclass(frozen=True)
class FileInfo:
    """One data file of the lake: its path (as the filesystem names it), size and modification time."""

    path: str
    size: int
    mtime: float | None


class Lake:
    """A resolved lake root: local folder (plain os calls, fsync) or an fsspec filesystem (object stores)."""

    def __init__(self, root: str):
        if not isinstance(root, str) or not root.strip():
            raise LakeError(f"lake root {root!r} is empty: pass a folder path or a URL such as file:///data/lake")
        self.root = root
        parsed = urlparse(root)
        if "://" not in root or parsed.scheme in ("", "file", "local"):
            path = parsed.path if "://" in root else root
            if "://" in root and parsed.netloc not in ("", "localhost"):
                raise LakeError(f"lake root {root!r}: a file:// URL needs three slashes, e.g. file:///data/lake")
            self.local = True
            self.fs: fsspec.AbstractFileSystem | None = None
            self.base = os.path.abspath(os.path.expanduser(path))
            self.arrow_fs: pafs.FileSystem = pafs.LocalFileSystem()
        else:
            try:
                fs, path = fsspec.core.url_to_fs(root)
            except (ImportError, ValueError) as e:
                raise LakeError(
                    f"lake root {root!r}: no filesystem for scheme {parsed.scheme!r} ({e}); "
                    f"install the fsspec backend for it (e.g. s3fs for s3://) or use a local folder"
                ) from e
            self.local = False
            self.fs = fs
            self.base = path.rstrip("/")
            self.arrow_fs = pafs.PyFileSystem(pafs.FSSpecHandler(fs))

    # ----- paths
    def join(self, *parts: str) -> str:
        if self.local:
            return os.path.join(self.base, *parts)
        return "/".join([self.base, *parts])

    def url(self, path: str) -> str:
        """The name DuckDB reads a path by (local path, or protocol://path with the fsspec fs registered)."""
        if self.local:
            return path
        assert self.fs is not None
        return self.fs.unstrip_protocol(path)

    def relpath(self, path: str) -> str:
        if self.local:
            return os.path.relpath(path, self.base)
        return path[len(self.base) :].lstrip("/")

    # ----- listing
    def list_files(self, top: str, suffix: str = ".parquet") -> list[FileInfo]:
        """All visible files under the folder `top` (a path from join()) ending in suffix, hidden temp files
        excluded, sorted by path."""
        out: list[FileInfo] = []
        if self.local:
            stack = [top]
            while stack:
                d = stack.pop()
                try:
                    entries = list(os.scandir(d))
                except (FileNotFoundError, NotADirectoryError):
                    continue
                for e in entries:
                    if e.name.startswith("."):
                        continue
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.name.endswith(suffix):
                        try:
                            st = e.stat()
                        except FileNotFoundError:  # moved away (quarantined) meanwhile
                            continue
                        out.append(FileInfo(e.path, st.st_size, st.st_mtime))
        else:
            assert self.fs is not None
            # A listing cached by an earlier find/ls misses what other processes wrote since, and s3fs answers
            # info()/open() of such a file from that cache: FileNotFoundError, and the file would be skipped as
            # vanished. Start from a fresh view; find() then fills the cache that open() reads sizes from.
            self.fs.invalidate_cache()
            try:
                found = self.fs.find(top, detail=True)
            except FileNotFoundError:
                found = {}
            for p, info in found.items():
                name = p.rsplit("/", 1)[-1]
                if name.startswith(".") or not name.endswith(suffix) or info.get("type") == "directory":
                    continue
                out.append(FileInfo(p, int(info.get("size") or 0), _mtime(info)))
        out.sort(key=lambda f: f.path)
        return out

    def stat(self, path: str) -> FileInfo | None:
        if self.local:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return None
            return FileInfo(path, st.st_size, st.st_mtime)
        assert self.fs is not None
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        return FileInfo(path, int(info.get("size") or 0), _mtime(info))

    # ----- writing
    def makedirs(self, path: str) -> None:
        if self.local:
            missing = []
            p = path
            while not os.path.isdir(p):
                missing.append(p)
                p = os.path.dirname(p)
            os.makedirs(path, exist_ok=True)
            for d in reversed(missing):  # make each new directory entry durable in its parent
                fsync_dir(os.path.dirname(d))
        else:
            assert self.fs is not None
            self.fs.makedirs(path, exist_ok=True)

    def write_parquet_atomic(self, table: pa.Table, path: str) -> str:
        """Write table to path so that readers see either nothing or the whole file. Returns its name as a
        local path or a URL (object stores)."""
        folder = os.path.dirname(path) if self.local else path.rsplit("/", 1)[0]
        self.makedirs(folder)
        if not self.local:
            # Object stores publish an object when its upload completes, and closing a stream completes it, also
            # after a failed write: build the file in memory and send it whole (one PUT), or nothing.
            assert self.fs is not None
            buf = pa.BufferOutputStream()
            pq.write_table(table, buf, **PARQUET_OPTIONS)
            self.fs.pipe_file(path, buf.getvalue().to_pybytes())
            return self.url(path)
        name = os.path.basename(path)
        tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")
        try:
            with open(tmp, "wb") as f:
                pq.write_table(table, f, **PARQUET_OPTIONS)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        fsync_dir(folder)
        return self.url(path)

    def move(self, src: str, dst: str) -> None:
        if self.local:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.replace(src, dst)
            fsync_dir(os.path.dirname(dst))
            fsync_dir(os.path.dirname(src))
        else:
            assert self.fs is not None
            self.fs.makedirs(dst.rsplit("/", 1)[0], exist_ok=True)
            self.fs.mv(src, dst)

    def write_text(self, path: str, text: str) -> None:
        if self.local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        else:
            assert self.fs is not None
            self.fs.pipe_file(path, text.encode("utf-8"))  # one PUT: whole or nothing

    def remove(self, path: str) -> None:
        if self.local:
            os.unlink(path)
        else:
            assert self.fs is not None
            self.fs.rm(path)


def _mtime(info: dict[str, Any]) -> float | None:
    """Modification time of an fsspec info dict as a timestamp (s3fs: LastModified; local/memory: mtime or
    created), the same for a listing and a stat of one file, so caches keyed by it match."""
    mtime = info.get("mtime") or info.get("LastModified") or info.get("created")
    if isinstance(mtime, datetime):
        mtime = mtime.timestamp()
    return float(mtime) if mtime is not None else None


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_LAKES: dict[str, Lake] = {}


def open_lake(root: str) -> Lake:
    """Resolve a root (path or URL) once per process."""
    lake = _LAKES.get(root)
    if lake is None:
        lake = _LAKES[root] = Lake(root)
    return lake
