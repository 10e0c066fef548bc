"""A migrated Prefect database to start a fresh Prefect home from, so a server's first start skips Alembic.

A Prefect server on a PREFECT_HOME with no prefect.db spends more than half of its first start migrating an empty
SQLite file (benchmarks/server_start.py measures it). `seed(home)` instead copies a template, migrated once per
installed Prefect version, into `home/prefect.db`; the server then finds its database at the head revision and only
checks it.

The template lives in the user's cache, `$XDG_CACHE_HOME/flywheel/prefect-db/prefect-VERSION.db` (default
`~/.cache`). It is built on first need by `python -m flows.prefect_db DIR` (Prefect's own `create_db`, the call the
server makes on start, in a scratch home), folded into one file, and renamed into place under a file lock, so
concurrent first commands build it once and each copy a whole template. A home is seeded only when it has no
database file of its own (prefect.db or its -wal, -shm, -journal) and the environment names no other database
(PREFECT_SERVER_DATABASE_CONNECTION_URL or PREFECT_API_DATABASE_CONNECTION_URL); the copy is linked into place
without replacing a file, so a user's database is never touched. When the template cannot be built or copied (a
read-only cache, a failed migration), `seed` returns False and the server migrates its database itself as before,
reporting any failure in its own log.

This module does not import prefect; the build subprocess does.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

from flows.prefect_home import pythonpath_with_repo

DB_NAME = "prefect.db"
_DB_URL_VARS = ("PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_API_DATABASE_CONNECTION_URL")
BUILD_TIMEOUT_S = 300.0


def template_path() -> Path:
    """Where the migrated template for the installed Prefect version lives (it may not exist yet)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "flywheel" / "prefect-db" / f"prefect-{importlib.metadata.version('prefect')}.db"


def wanted(home: Path) -> bool:
    """True when `home` would get Prefect's default SQLite database and has no database file yet."""
    if any(os.environ.get(v) for v in _DB_URL_VARS):
        return False
    return not any((home / f"{DB_NAME}{suffix}").exists() for suffix in ("", "-wal", "-shm", "-journal"))


def ensure_template() -> Path:
    """The template's path, after building it when it does not exist. OSError or subprocess errors when it cannot
    be built."""
    target = template_path()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "a") as lock:  # one build at a time; a waiter then finds it built
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            _build_into(target)
    return target


def _build_into(target: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="build-", dir=target.parent) as scratch:
        env = {**os.environ, "PREFECT_HOME": scratch, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "PYTHONPATH": pythonpath_with_repo(os.environ.get("PYTHONPATH"))}
        for v in ("PREFECT_API_URL", *_DB_URL_VARS):
            env.pop(v, None)
        subprocess.run([sys.executable, "-m", "flows.prefect_db", scratch], env=env, check=True,
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=BUILD_TIMEOUT_S)
        built = Path(scratch) / DB_NAME
        _to_one_file(built)
        built.replace(target)  # atomic: a reader never sees half a template


def _to_one_file(db: Path) -> None:
    """Fold the write-ahead log into the database file and leave it in rollback-journal mode (Prefect's server sets
    WAL again on its first connection), so that copying the one file copies the whole database."""
    con = sqlite3.connect(db)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.execute("PRAGMA journal_mode=DELETE")
    finally:
        con.close()


def seed(home: Path) -> bool:
    """Copy the migrated template into `home/prefect.db` when `wanted(home)`; True when this call placed it."""
    if not wanted(home):
        return False
    try:
        template = ensure_template()
        home.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f"{DB_NAME}.seed-", dir=home)
        os.close(fd)
        tmp = Path(name)
        shutil.copyfile(template, tmp)
        try:
            os.link(tmp, home / DB_NAME)  # never replaces a database another process placed meanwhile
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def _build(home: str) -> None:
    """Migrate a new SQLite database in `home` (PREFECT_HOME) to the head revision, as the server does on start."""
    import asyncio

    from prefect.server.database import provide_database_interface

    async def migrate() -> None:
        db = provide_database_interface()
        await db.create_db()
        await (await db.engine()).dispose()

    if os.path.realpath(os.environ.get("PREFECT_HOME", "")) != os.path.realpath(home):
        raise SystemExit(f"PREFECT_HOME must be {home} for the build")
    asyncio.run(migrate())


if __name__ == "__main__":
    _build(sys.argv[1])
