"""Schema by alembic: concurrent migrations, downgrade, and the worker's revision check."""

from __future__ import annotations

import subprocess
import sys
import uuid

import psycopg
import pytest
from psycopg import sql

from pgqueue.db import migrate
from pgqueue.errors import NotUtf8Database, SchemaOutOfDate
from tests.conftest import _drop_db, dsn_for

MIGRATE = [sys.executable, "-c", "from pgqueue.cli import app; app()", "migrate", "--dsn"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ten_concurrent_migrations_on_an_empty_database(empty_db_dsn):
    procs = [
        subprocess.Popen([*MIGRATE, empty_db_dsn], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(10)
    ]
    results = [p.communicate(timeout=100) for p in procs]
    codes = [p.returncode for p in procs]
    assert codes == [0] * 10, [err.decode()[-500:] for _out, err in results]
    with psycopg.connect(empty_db_dsn) as conn:
        assert migrate.current_revision(conn) == migrate.head_revision()
        versions = conn.execute("SELECT count(*) FROM pgqueue.alembic_version").fetchone()[0]
        assert versions == 1
        schemas = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'pgqueue'"
        ).fetchone()[0]
        assert schemas == 1


def test_downgrade_to_base_and_upgrade_again(db_dsn):
    migrate.downgrade(db_dsn, "base")
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT to_regclass('pgqueue.jobs')").fetchone()[0] is None
        assert migrate.current_revision(conn) is None
    migrate.upgrade(db_dsn)
    with psycopg.connect(db_dsn) as conn:
        assert migrate.check_schema(conn) == migrate.head_revision()


def test_schema_check_names_the_command(empty_db_dsn, db_dsn):
    with (
        psycopg.connect(empty_db_dsn) as conn,
        pytest.raises(SchemaOutOfDate, match="pgqueue migrate"),
    ):
        migrate.check_schema(conn)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.alembic_version SET version_num = '0001'")
        with pytest.raises(SchemaOutOfDate, match="run `pgqueue migrate`"):
            migrate.check_schema(conn)
        conn.execute("UPDATE pgqueue.alembic_version SET version_num = 'ffff'")
        with pytest.raises(SchemaOutOfDate, match="newer than this pgqueue"):
            migrate.check_schema(conn)


def test_migrate_is_idempotent(db_dsn):
    migrate.upgrade(db_dsn)
    migrate.upgrade(db_dsn)
    with psycopg.connect(db_dsn) as conn:
        assert migrate.check_schema(conn) == migrate.head_revision()


def test_queue_tables_are_vacuumed_early(db_dsn):
    """bench/bloat.py: an unvacuumed jobs table made claims 2.30x slower; revision 0009 makes
    autovacuum visit the queue's tables long before Postgres' default 20 % of dead rows."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        rows = dict(
            conn.execute(
                "SELECT c.relname, c.reloptions FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'pgqueue' AND c.relkind = 'r'"
            ).fetchall()
        )
    assert "autovacuum_vacuum_scale_factor=0.02" in rows["jobs"]
    for table in ("queue_counts", "lane_tiers", "flows", "cursors", "rate_limits"):
        assert "autovacuum_vacuum_threshold=500" in rows[table], table


def test_enqueue_against_an_older_schema_names_the_command(db_dsn):
    """Found by a tester: new code against a schema at 0007 raised a raw UndefinedFunction
    (pgqueue.try_enqueue_batch); it is SchemaOutOfDate, which says to run migrate. (The schema
    without that function stands in for 0007, which is no longer shipped.)"""
    import pgqueue

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DROP FUNCTION pgqueue.try_enqueue_batch")
    payload = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    with (
        psycopg.connect(db_dsn, autocommit=True) as conn,
        pytest.raises(SchemaOutOfDate, match="pgqueue migrate"),
    ):
        pgqueue.enqueue_many(conn, [pgqueue.JobSpec("a", "batch_job", payload)])


def test_a_revision_before_the_baseline_is_named_as_such(db_dsn):
    """Revisions 0001-0029 were replaced by the baseline 0030 (issue 27): a database at one of
    them is told so, not that it is newer than this pgqueue, and nothing is changed."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.alembic_version SET version_num = '0029'")
    with pytest.raises(SchemaOutOfDate, match="older than this pgqueue's baseline 0030"):
        migrate.upgrade(db_dsn)
    with psycopg.connect(db_dsn) as conn:
        with pytest.raises(SchemaOutOfDate, match="run `pgqueue migrate`"):
            migrate.check_schema(conn)
        assert migrate.current_revision(conn) == "0029"


@pytest.mark.parametrize("encoding", ["SQL_ASCII", "LATIN1"])
def test_migrate_refuses_a_database_not_in_utf8(server_dsn, encoding):
    """Found by a tester: on SQL_ASCII `pgqueue migrate` printed a traceback (TypeError from
    SQLAlchemy's version parse, text read as bytes); on LATIN1 a misleading "InvalidArgument:
    text that is not valid UTF-8". Now one line before anything is done."""
    name = f"pgq_t_enc_{encoding.lower()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE DATABASE {} ENCODING {} TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'"
            ).format(sql.Identifier(name), sql.Literal(encoding))
        )
    dsn = dsn_for(server_dsn, name)
    try:
        with pytest.raises(NotUtf8Database, match=f"'{name}' is encoded in {encoding}"):
            migrate.upgrade(dsn)
        done = subprocess.run(
            [*MIGRATE, dsn], check=False, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 1
        assert done.stderr.startswith("NotUtf8Database: "), done.stderr
        assert "Traceback" not in done.stderr
        assert "ENCODING 'UTF8' TEMPLATE template0" in " ".join(done.stderr.split())
        with psycopg.connect(dsn) as conn:  # nothing was done
            assert conn.execute("SELECT to_regnamespace('pgqueue')").fetchone() == (None,)
    finally:
        _drop_db(server_dsn, name)
