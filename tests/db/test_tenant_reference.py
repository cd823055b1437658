"""Revision 0013: the jobs-to-tenants reference without a per-row foreign key check. A job
names a registered tenant, whatever path wrote it; a tenant with jobs cannot be deleted or
renamed; and a tenant being used by an uncommitted insert cannot be deleted under it."""

from __future__ import annotations

import psycopg
import pytest

from tests.db.tenant_support import delete_after_commit

INSERT = (
    "INSERT INTO pgqueue.jobs (tenant_id, origin, priority, payload)"
    " SELECT t, 'user_action', 'critical', '{}'::jsonb FROM unnest(%s::text[]) AS t"
)


def test_direct_inserts_of_unknown_tenants_fail_and_write_nothing(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("INSERT INTO pgqueue.tenants (tenant_id) VALUES ('a'), ('b')")
        c.execute(INSERT, (["a", "b", "a"],))
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="unknown tenant 'ghost'"):
            c.execute(INSERT, (["a", "ghost", "b"] * 400,))
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="'ghost'"):
            c.execute(INSERT, (["ghost"],))
        assert c.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (3,)
        assert c.execute("SELECT sum(queued) FROM pgqueue.queue_counts").fetchone() == (6,)
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="'ghost'"):
            c.execute("UPDATE pgqueue.jobs SET tenant_id = 'ghost' WHERE tenant_id = 'a'")
        c.execute("UPDATE pgqueue.jobs SET tenant_id = 'b' WHERE tenant_id = 'a'")  # known: fine


def test_a_tenant_with_jobs_cannot_be_deleted_or_renamed(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("INSERT INTO pgqueue.tenants (tenant_id) VALUES ('a'), ('idle')")
        c.execute(INSERT, (["a"],))
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="still has jobs"):
            c.execute("DELETE FROM pgqueue.tenants WHERE tenant_id = 'a'")
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="still has jobs"):
            c.execute("UPDATE pgqueue.tenants SET tenant_id = 'a2' WHERE tenant_id = 'a'")
        c.execute("UPDATE pgqueue.tenants SET plan = 'pro' WHERE tenant_id = 'a'")
        c.execute("DELETE FROM pgqueue.tenants WHERE tenant_id = 'idle'")
        assert c.execute("SELECT tenant_id FROM pgqueue.tenants").fetchall() == [("a",)]


@pytest.mark.timeout(60)
def test_a_delete_waits_for_an_uncommitted_insert_then_fails(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("INSERT INTO pgqueue.tenants (tenant_id) VALUES ('a')")
    with psycopg.connect(db_dsn) as producer:
        producer.execute(INSERT, (["a"],))  # holds tenant 'a' FOR KEY SHARE until commit
        error = delete_after_commit(db_dsn, producer, "a")
    assert isinstance(error, psycopg.errors.ForeignKeyViolation)
    with psycopg.connect(db_dsn) as c:
        assert c.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (1,)


def test_tenants_are_deleted_in_read_committed_only(db_dsn: str) -> None:
    """The check reads the transaction's snapshot: in REPEATABLE READ a delete could miss a job
    committed after it (the foreign key read the newest rows), and left orphan jobs."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("INSERT INTO pgqueue.tenants (tenant_id) VALUES ('x'), ('idle')")
    with psycopg.connect(db_dsn) as deleter:
        deleter.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        deleter.execute("SELECT 1")  # the snapshot is taken
        with psycopg.connect(db_dsn, autocommit=True) as producer:
            producer.execute(INSERT, (["x"],))
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="READ COMMITTED"):
            deleter.execute("DELETE FROM pgqueue.tenants WHERE tenant_id = 'x'")
        deleter.rollback()
        deleter.execute("DELETE FROM pgqueue.tenants WHERE tenant_id = 'idle'")  # RC: fine
        deleter.commit()
    with psycopg.connect(db_dsn) as c:
        assert c.execute("SELECT count(*) FROM pgqueue.jobs WHERE tenant_id = 'x'").fetchone()
        assert c.execute("SELECT tenant_id FROM pgqueue.tenants").fetchall() == [("x",)]


def test_truncating_tenants_alone_keeps_no_orphans(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("INSERT INTO pgqueue.tenants (tenant_id) VALUES ('a')")
        c.execute(INSERT, (["a"],))
        # CASCADE follows the foreign keys that remain (demotions, throttle events, usage);
        # pgqueue.jobs has none any more, so it was kept, orphaned: now refused
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="truncate it"):
            c.execute("TRUNCATE pgqueue.tenants CASCADE")
        c.execute("TRUNCATE pgqueue.jobs, pgqueue.tenants CASCADE")
        assert c.execute("SELECT count(*) FROM pgqueue.tenants").fetchone() == (0,)
