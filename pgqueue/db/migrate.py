"""Schema management through alembic: upgrade to head, and check the revision at start-up."""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import psycopg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from pgqueue.db import queries
from pgqueue.errors import NotUtf8Database, SchemaOutOfDate


def schema_files() -> list[Traversable]:
    """The files of ``pgqueue/sql/schema`` (``*.sql``) in the order the baseline revision
    applies them: by file name. Together they define every table, function, trigger and view of
    the schema at the baseline, each once (docs/schema.md)."""
    folder = resources.files("pgqueue") / "sql" / "schema"
    return sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)


def alembic_config(dsn: str) -> Config:
    """An alembic ``Config`` for pgqueue's own migrations (shipped in the package)."""
    cfg = Config()
    cfg.set_main_option("script_location", "pgqueue:migrations")
    cfg.attributes["dsn"] = dsn
    return cfg


def head_revision() -> str:
    """The newest revision this version of pgqueue ships."""
    head = ScriptDirectory.from_config(alembic_config("")).get_current_head()
    assert head is not None
    return head


def known_revisions() -> set[str]:
    """Every revision this version of pgqueue ships."""
    script = ScriptDirectory.from_config(alembic_config(""))
    return {rev.revision for rev in script.walk_revisions()}


def base_revision() -> str:
    """The baseline revision (0030): the schema of ``pgqueue/sql/schema`` as one revision."""
    base = ScriptDirectory.from_config(alembic_config("")).get_base()
    assert base is not None
    return base


def _unknown_revision(current: str) -> SchemaOutOfDate:
    if current.isdigit() and len(current) == 4 and current < base_revision():
        # a revision of the chain the baseline replaced (issue 27): its text is gone
        return SchemaOutOfDate(
            f"the pgqueue schema is at revision {current}, older than this pgqueue's baseline "
            f"{base_revision()}: upgrade it with the pgqueue release that created it first, or "
            "drop the schema pgqueue (its jobs with it) and run `pgqueue migrate`"
        )
    return SchemaOutOfDate(
        f"the database schema is at revision {current}, newer than this pgqueue knows "
        f"(its newest is {head_revision()}); upgrade the pgqueue package, do not downgrade "
        "the database"
    )


def check_encoding(conn: psycopg.Connection[Any]) -> None:
    """Raise unless the database of ``conn`` is encoded in UTF8 (its ``server_encoding``).

    Found by a tester: on a SQL_ASCII database `pgqueue migrate` failed with a traceback
    (text came back as bytes), and on a LATIN1 one with a misleading "text that is not valid
    UTF-8".

    Raises:
        NotUtf8Database: naming the database, its encoding and how to create a UTF8 one.
    """
    encoding = conn.info.parameter_status("server_encoding")
    if encoding == "UTF8":
        return
    name = conn.info.dbname
    raise NotUtf8Database(
        f"database {name!r} is encoded in {encoding}, but pgqueue needs a UTF8 database; "
        "create one with CREATE DATABASE <name> ENCODING 'UTF8' TEMPLATE template0 (with "
        "LC_COLLATE and LC_CTYPE of a UTF-8 locale, or 'C'), and point pgqueue at it"
    )


def upgrade(dsn: str, revision: str = "head") -> None:
    """Bring the ``pgqueue`` schema to ``revision``; safe to run from many processes at once.

    Raises:
        NotUtf8Database: the database is not encoded in UTF8 (nothing is done).
        SchemaOutOfDate: the database is at a revision newer than this pgqueue, or at one of
            the revisions before the baseline (0001-0029), whose text is no longer shipped.
        psycopg.Error: the database refused a statement (the transaction is rolled back).
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        check_encoding(conn)
        current = current_revision(conn)
        granted = _granted(conn)
    if current is not None and current not in known_revisions():
        raise _unknown_revision(current)
    command.upgrade(alembic_config(dsn), revision)
    _regrant(dsn, granted, current)


def downgrade(dsn: str, revision: str) -> None:
    """Undo migrations down to ``revision`` (``base`` empties the schema).

    Raises:
        psycopg.Error: the database refused a statement (the transaction is rolled back).
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        current = current_revision(conn)
        granted = _granted(conn)
    command.downgrade(alembic_config(dsn), revision)
    _regrant(dsn, granted, current)


def _granted(conn: psycopg.Connection[Any]) -> bool:
    row = queries.run(conn, "security_granted")
    return bool(row and row["granted"])


def _regrant(dsn: str, granted: bool, before: str | None) -> None:
    """Re-apply ``pgqueue grant`` when it had been run and the schema changed: a function that
    a migration replaced lost SECURITY DEFINER, and a new one is executable by PUBLIC."""
    if not granted:
        return
    with psycopg.connect(dsn, autocommit=True) as conn:
        if current_revision(conn) in (None, before):
            return  # schema gone (downgrade to base), or nothing applied (another process did)
        queries.run(conn, "security_grant")


def current_revision(conn: psycopg.Connection[Any]) -> str | None:
    """The revision recorded in ``pgqueue.alembic_version``, or None on a fresh database."""
    present = queries.run(conn, "schema_exists")
    if not present or not present["present"]:
        return None
    row = queries.run(conn, "schema_revision")
    return None if row is None else str(row["version_num"])


def check_schema(conn: psycopg.Connection[Any]) -> str:
    """Return the current revision, or raise if the schema is missing or behind.

    Raises:
        SchemaOutOfDate: with the command to run (``pgqueue migrate``).
    """
    current = current_revision(conn)
    head = head_revision()
    if current is None:
        raise SchemaOutOfDate(
            "the pgqueue schema is not installed in this database; run `pgqueue migrate` first"
        )
    if current not in known_revisions():
        raise _unknown_revision(current)
    if current != head:
        raise SchemaOutOfDate(
            f"the pgqueue schema is at revision {current} but this pgqueue needs {head}; "
            "run `pgqueue migrate`"
        )
    return current
