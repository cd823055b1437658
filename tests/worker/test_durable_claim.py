"""A crash of Postgres does not lose a claim whose handler runs (issue 32, defect 8).

The claim commits without waiting for its WAL flush. Found by a fault run: ``pg_ctl stop -m
immediate`` lost claims already handed to a worker, and 4 jobs ran twice with attempts 1. The
worker now makes each claim durable (``job_claim_durable``) before its handlers start. Here the
WAL writer is slowed to 10 s, so that nothing else flushes the claim before the crash.
"""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest

import pgqueue
from pgqueue.handlers.registry import Registry
from pgqueue.models import Job
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker
from tests.apps.harness import wait_until
from tests.worker.test_faults import _pg_ctl, private_server  # noqa: F401 - the fixture


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_claim_survives_a_crash_of_postgres(private_server) -> None:  # noqa: F811
    dsn, pgdata = private_server
    from pgqueue.db import migrate

    migrate.upgrade(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
        conn.execute("SELECT pg_reload_conf()")
        job_id = pgqueue.enqueue(
            conn, tenant_id="t", origin="scheduled", payload={}, kind="test.block"
        )
    started, release = threading.Event(), threading.Event()
    registry = Registry()

    @registry.handler("test.block")
    async def block(job: Job) -> dict[str, bool]:
        started.set()
        await asyncio.to_thread(release.wait, 60)
        return {"ok": True}

    settings = Settings(
        poll_interval_seconds=0.1,
        counters_compact_interval_seconds=None,  # no other writes to flush the claim
        hot_tables_vacuum_interval_seconds=None,
        heartbeat_seconds=30,
        lease_seconds=120,
    )
    worker = Worker(dsn, settings, registry, concurrency=1, listen=False)
    run = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        assert await asyncio.to_thread(started.wait, 60)
        await asyncio.to_thread(_pg_ctl, pgdata, "restart", "-m", "immediate")

        def row() -> tuple[str, int] | None:
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    found = conn.execute(
                        "SELECT state::text, attempts FROM pgqueue.jobs WHERE id = %s", (job_id,)
                    ).fetchone()
                    return None if found is None else (str(found[0]), int(found[1]))
            except psycopg.OperationalError:
                return None

        # the claim survived the crash: the job is still running, its attempt counted
        assert await asyncio.to_thread(wait_until, row, timeout=60) == ("running", 1)
    finally:
        release.set()
        worker.request_stop()
        await asyncio.wait_for(run, 60)
    assert await asyncio.to_thread(row) == ("succeeded", 1)
