"""Test fixtures: a real Postgres, a migrated template database, one fresh database per test.

``PGQUEUE_TEST_DSN`` points at a server (CI sets it); without it the embedded Postgres is
started in a folder of its own. Every test that touches SQL gets its own database, cloned from
a template migrated once per run, so tests can run in parallel (pytest-xdist).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import settings
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgqueue.db import migrate

# Property tests are deterministic and keep no example database: a red run is reproducible,
# and a CI run never fails on an example saved by an earlier run.
settings.register_profile("pgqueue", database=None, derandomize=True, deadline=None)
settings.load_profile("pgqueue")

_LOCK_KEY = 0x70717465_7374  # serialises template creation across xdist workers
_PACKAGE = Path(migrate.__file__).resolve().parents[1]
#: What the template database is built from: the revisions and the schema files the baseline
#: revision reads.
_SCHEMA_SOURCES = (_PACKAGE / "migrations" / "versions", _PACKAGE / "sql" / "schema")


def _schema_fingerprint() -> str:
    digest = hashlib.sha256()
    for folder in _SCHEMA_SOURCES:
        for path in sorted(folder.glob("*")):
            if path.suffix in {".py", ".sql"}:
                digest.update(f"{folder.name}/{path.name}".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def dsn_for(server_dsn: str, dbname: str) -> str:
    """The server's DSN pointed at another database."""
    return make_conninfo(server_dsn, dbname=dbname)


@pytest.fixture(scope="session")
def server_dsn() -> str:
    """A DSN for a database on the test server (not one tests write to)."""
    dsn = os.environ.get("PGQUEUE_TEST_DSN")
    if dsn:
        return dsn
    from pgqueue.db.embedded import embedded_dsn, suite_data_dir
    from pgqueue.settings import load_settings

    # `pgqueue embedded status | stop` show and stop this server too.
    return embedded_dsn(suite_data_dir(load_settings().embedded_data_dir))


@pytest.fixture(scope="session")
def template_db(server_dsn: str) -> str:
    """Name of a database migrated to head, used as the template of every test database."""
    name = f"pgqueue_tmpl_{_schema_fingerprint()}"
    building = name + "_building"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if found is None:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(building)
                    )
                )
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(building)))
                migrate.upgrade(dsn_for(server_dsn, building))
                conn.execute(
                    sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                        sql.Identifier(building), sql.Identifier(name)
                    )
                )
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return name


def _create_db(server_dsn: str, template: str | None) -> str:
    name = f"pgq_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        if template is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        else:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
    return name


def _drop_db(server_dsn: str, name: str) -> None:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture
def db_dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """DSN of a fresh database with the pgqueue schema at head, dropped after the test."""
    name = _create_db(server_dsn, template_db)
    try:
        yield dsn_for(server_dsn, name)
    finally:
        _drop_db(server_dsn, name)


@pytest.fixture
def empty_db_dsn(server_dsn: str) -> Iterator[str]:
    """DSN of a fresh, empty database (no pgqueue schema), dropped after the test."""
    name = _create_db(server_dsn, None)
    try:
        yield dsn_for(server_dsn, name)
    finally:
        _drop_db(server_dsn, name)


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A sync connection (not autocommit) to the test database."""
    with psycopg.connect(db_dsn) as connection:
        yield connection
