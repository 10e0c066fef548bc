"""flows/prefect_db.py: a fresh Prefect home gets the migrated template database; a home with a database of its own,
or an environment that names another database, is left alone; a template that cannot be built leaves nothing behind.
Every Prefect server the suite starts (conftest's prefect_api, the CLI's shared and own servers) starts on a seeded
home, so the servers' own tests cover that Prefect accepts it."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from flows import prefect_db


def _revision(db: Path) -> str:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT version_num FROM alembic_version").fetchone()[0]


def _sqlite_heads() -> list[str]:
    """The head revisions of Prefect's SQLite migrations, read from its migration scripts."""
    import prefect.server.database
    from alembic.script import ScriptDirectory

    migrations = Path(prefect.server.database.__file__).parent / "_migrations"
    return ScriptDirectory(str(migrations), version_locations=[str(migrations / "versions" / "sqlite")]).get_heads()


@pytest.mark.slow
def test_the_template_is_built_once_as_one_migrated_file(tmp_path, monkeypatch):
    """A build from nothing (a cache of its own): Prefect's migrations at their head, one file in rollback-journal
    mode (nothing left in a write-ahead log a copy would miss), the scratch home removed, and a second call reuses
    it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    template = prefect_db.ensure_template()
    assert template == tmp_path / "cache" / "flywheel" / "prefect-db" / template.name
    with sqlite3.connect(template) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"flow_run", "concurrency_limit_v2", "alembic_version"} <= tables
    assert [_revision(template)] == _sqlite_heads()
    assert sorted(p.name for p in template.parent.iterdir()) == [template.name, template.with_suffix(".lock").name]
    mtime = template.stat().st_mtime_ns
    assert prefect_db.ensure_template() == template and template.stat().st_mtime_ns == mtime


def test_a_fresh_home_gets_a_copy_of_the_template(tmp_path):
    home = tmp_path / "home"
    assert prefect_db.seed(home)
    assert (home / "prefect.db").read_bytes() == prefect_db.template_path().read_bytes()
    assert [p.name for p in home.iterdir()] == ["prefect.db"]  # no copy left behind
    assert not prefect_db.seed(home)  # seeded once


def test_concurrent_seeds_place_one_whole_database(tmp_path):
    prefect_db.ensure_template()
    home = tmp_path / "home"
    home.mkdir()
    placed: list[bool] = []
    threads = [threading.Thread(target=lambda: placed.append(prefect_db.seed(home))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(placed) == [False] * 5 + [True]
    assert (home / "prefect.db").read_bytes() == prefect_db.template_path().read_bytes()
    assert [p.name for p in home.iterdir()] == ["prefect.db"]


@pytest.mark.parametrize("existing", ["prefect.db", "prefect.db-wal", "prefect.db-journal"])
def test_a_home_with_a_database_of_its_own_is_left_alone(tmp_path, existing):
    (tmp_path / existing).write_bytes(b"the user's")
    assert not prefect_db.seed(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [existing]
    assert (tmp_path / existing).read_bytes() == b"the user's"


@pytest.mark.parametrize("var", ["PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_API_DATABASE_CONNECTION_URL"])
def test_a_configured_database_is_not_seeded(tmp_path, monkeypatch, var):
    monkeypatch.setenv(var, "postgresql+asyncpg://flywheel@127.0.0.1:5432/prefect")
    assert not prefect_db.seed(tmp_path)
    assert not list(tmp_path.iterdir())


def test_a_template_that_cannot_be_built_leaves_the_home_to_the_server(tmp_path, monkeypatch):
    """A cache that cannot be written (here a file where the folder should be): seed says no and writes nothing,
    and the server then migrates its own database as without a template."""
    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    home = tmp_path / "home"
    assert not prefect_db.seed(home)
    assert not home.exists()
