"""Workers vacuum the scheduler's small, hot tables, one worker at a time."""

from __future__ import annotations

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from pgqueue.settings import Settings
from pgqueue.worker.runtime import VACUUM_LOCK_KEY, Worker

INBOX_PAGES = "SELECT pg_relation_size('pgqueue.drr_inbox') / 8192"


def _bloat_the_inbox(dsn: str) -> int:
    """What a minute of single enqueues left behind: the inbox's dead rows, many pages."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgqueue.drr_inbox (tier, tenant_id)"
            " SELECT 'standard', 't' || i FROM generate_series(1, 20000) AS i"
        )
        conn.execute("DELETE FROM pgqueue.drr_inbox")
        row = conn.execute(INBOX_PAGES).fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.timeout(60)
async def test_a_worker_vacuums_the_hot_tables_unless_another_one_is(db_dsn: str) -> None:
    """Found while profiling claims: the claim drains the DRR inbox by a full scan, and between
    autovacuum rounds every claim read all the inbox's dead rows (120 pages after one minute
    of single enqueues at ~560 per second)."""
    before = _bloat_the_inbox(db_dsn)
    assert before > 50
    worker = Worker(db_dsn, Settings())
    pool: AsyncConnectionPool[psycopg.AsyncConnection[tuple[object, ...]]] = AsyncConnectionPool(
        db_dsn, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    worker._pool = pool
    try:
        with psycopg.connect(db_dsn, autocommit=True) as other:
            other.execute("SELECT pg_advisory_lock(%s)", (VACUUM_LOCK_KEY,))  # another worker
            assert await worker.vacuum_hot_tables() is False
            assert other.execute(INBOX_PAGES).fetchone() == (before,)
            other.execute("SELECT pg_advisory_unlock(%s)", (VACUUM_LOCK_KEY,))
            for _ in range(6):  # more than psycopg's prepare threshold: VACUUM is never prepared
                assert await worker.vacuum_hot_tables() is True
            row = other.execute(INBOX_PAGES).fetchone()
            assert row is not None and row[0] <= 1
            held = other.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()
            assert held == (0,)  # the lock is released after each round
    finally:
        await pool.close()
