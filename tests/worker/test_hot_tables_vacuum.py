"""Workers vacuum the scheduler's small, hot tables, about once per interval for a whole fleet
(``pgqueue.worker.upkeep``)."""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from pgqueue.worker import upkeep

CURSOR_PAGES = "SELECT pg_relation_size('pgqueue.cursors') / 8192"


def _bloat_the_cursors(dsn: str) -> int:
    """What many claimers' moves leave behind: the cursors' dead rows, many pages."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgqueue.cursors (lane, tier, worker_id, key_round, key_place, key_seq)"
            " SELECT 'pgqueue.noop', 'standard', 'w' || i, i, 0, i"
            " FROM generate_series(1, 20000) AS i"
        )
        conn.execute("DELETE FROM pgqueue.cursors")
        row = conn.execute(CURSOR_PAGES).fetchone()
        assert row is not None
        return int(row[0])


async def _pool(dsn: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.mark.timeout(60)
async def test_a_worker_vacuums_the_hot_tables_unless_someone_just_did(db_dsn: str) -> None:
    """Found while profiling claims (scheduler v1): between autovacuum rounds every claim read
    all the dead rows of a hot table (its inbox: 120 pages after one minute of single
    enqueues at ~560 per second). Now every claim moves its cursor row."""
    before = _bloat_the_cursors(db_dsn)
    assert before > 50
    async for pool in _pool(db_dsn):
        assert await upkeep.vacuum_hot_tables(pool, 60.0) == "vacuumed"  # never vacuumed: due
        with psycopg.connect(db_dsn, autocommit=True) as other:
            row = other.execute(CURSOR_PAGES).fetchone()
            assert row is not None and row[0] <= 1
        # Found by a tester: every worker of a fleet vacuumed each interval; now the date of
        # the last vacuum (by anyone) decides.
        assert await upkeep.vacuum_hot_tables(pool, 60.0) == "not due"
        for _ in range(6):  # more than psycopg's prepare threshold: VACUUM is never prepared
            assert await upkeep.vacuum_hot_tables(pool, 0.0) == "vacuumed"


@pytest.mark.timeout(60)
async def test_a_role_that_may_not_vacuum_stops_trying_and_says_so(
    db_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by a tester: a worker role that does not own the tables got a server WARNING per
    table each round (five per worker per interval in the server log), and logged nothing."""
    role = f"pgq_nonowner_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'GRANT USAGE ON SCHEMA pgqueue TO "{role}"')
        admin.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA pgqueue TO "{role}"')
    try:
        dsn = make_conninfo(db_dsn, user=role)
        async for pool in _pool(dsn):
            assert await upkeep.vacuum_hot_tables(pool) == "not allowed"
            with caplog.at_level(logging.WARNING, logger="pgqueue.worker"):
                await upkeep.vacuum_loop(pool, 0.01, random.Random(0))  # returns: no retry
            assert "may not VACUUM" in caplog.text
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as admin:
            admin.execute(f'DROP OWNED BY "{role}"')
            admin.execute(f'DROP ROLE "{role}"')


@pytest.mark.timeout(60)
async def test_pgqueue_grant_lets_workers_vacuum_on_postgres_17_and_newer(db_dsn: str) -> None:
    """Found by a tester: the least-privilege worker role could never vacuum (Postgres 17 has
    the MAINTAIN privilege for that; `pgqueue grant` did not give it)."""
    from pgqueue.db import queries

    role = f"pgq_worker_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_dsn, autocommit=True) as admin:
        queries.run(admin, "security_grant")
        admin.execute(f'CREATE ROLE "{role}" LOGIN IN ROLE pgqueue_worker')
        row = admin.execute("SELECT current_setting('server_version_num')::int").fetchone()
        assert row is not None
        version = int(row[0])
    try:
        async for pool in _pool(make_conninfo(db_dsn, user=role)):
            expected = "vacuumed" if version >= 170000 else "not allowed"
            assert await upkeep.vacuum_hot_tables(pool) == expected
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as admin:
            admin.execute(f'DROP ROLE "{role}"')


async def _jobs_stat_reaches(pool: AsyncConnectionPool[Any], column: str, at_least: int) -> int:
    """``column`` of pg_stat_user_tables for pgqueue.jobs once it is ``at_least`` (a backend's
    table counters reach the shared stats within ~1 s), or its last value after 5 s."""
    value = -1
    for _ in range(50):
        async with pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {column} FROM pg_stat_user_tables WHERE relid = 'pgqueue.jobs'::regclass"
            )
            row = await cur.fetchone()
        value = -1 if row is None else int(row[0])
        if value >= at_least:
            break
        await asyncio.sleep(0.1)
    return value


@pytest.mark.timeout(60)
async def test_a_worker_analyzes_a_queue_filled_since_its_last_analyze(db_dsn: str) -> None:
    """Found by `pgqueue bench`: a worker started on 10,000 jobs just enqueued made its
    claim's generic plans with no statistics (the fold's probe read a tenant index whole:
    6.9 ms a claim of 10 instead of 1.6 ms) and kept them until autovacuum's next round."""
    import pgqueue

    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue_many(
            conn,
            [
                pgqueue.JobSpec(
                    tenant_id=f"t{i % 7}", origin="user_action", payload={}, kind="pgqueue.noop"
                )
                for i in range(3000)
            ],
        )
        conn.commit()
    async for pool in _pool(db_dsn):
        await _jobs_stat_reaches(pool, "n_live_tup", 3000)
        assert await upkeep.analyze_jobs_if_stale(pool) == "analyzed"
        assert await upkeep.analyze_jobs_if_stale(pool) == "not due"  # statistics fit now
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT reltuples FROM pg_class WHERE oid = 'pgqueue.jobs'::regclass"
            )
            row = await cur.fetchone()
        assert row is not None and row[0] == 3000


@pytest.mark.timeout(60)
async def test_a_drain_does_not_make_the_statistics_stale(db_dsn: str) -> None:
    """Found by pg_stat_statements on `bench/cpu_per_job.py`: counting rows written since the
    last ANALYZE, a drain (each job written by its stamp, claim and success, the table's size
    unchanged) ran an ANALYZE every few thousand jobs, 4-7 % of its Postgres time."""
    import pgqueue

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.enqueue_many(
            conn,
            [
                pgqueue.JobSpec(
                    tenant_id=f"t{i % 7}", origin="user_action", payload={}, kind="pgqueue.noop"
                )
                for i in range(3000)
            ],
        )
    # a backend's counters reach the shared stats when it exits at the latest: the fill's,
    # flushed after the ANALYZE, would add its 3,000 rows to the live rows the ANALYZE counted
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("ANALYZE pgqueue.jobs")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM pgqueue.claim(500, 'w', 60)").fetchone() != (0,):
            conn.execute(
                "UPDATE pgqueue.jobs SET state = 'succeeded', finished_at = now(),"
                " lease_expires_at = NULL WHERE state = 'running'"
            )
    async for pool in _pool(db_dsn):
        # claimed and succeeded: each job written twice
        assert await _jobs_stat_reaches(pool, "n_mod_since_analyze", 6000) >= 6000
        assert await upkeep.analyze_jobs_if_stale(pool) == "not due"


@pytest.mark.timeout(60)
async def test_a_role_that_may_not_analyze_is_told_so(db_dsn: str) -> None:
    role = f"pgq_nonowner_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'GRANT USAGE ON SCHEMA pgqueue TO "{role}"')
    try:
        async for pool in _pool(make_conninfo(db_dsn, user=role)):
            assert await upkeep.analyze_jobs_if_stale(pool) == "not allowed"
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as admin:
            admin.execute(f'DROP OWNED BY "{role}"')
            admin.execute(f'DROP ROLE "{role}"')
