"""Outcome writes that wait on rows another transaction holds (a user's cancel or UPDATE in an
open transaction) must not take every pooled connection: the heartbeat still needs one, or the
leases of the worker's other jobs run out and those jobs run twice."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue import JobSpec, Registry
from pgqueue.models import Job
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker

FAILING = 12  # more than the pool's 10 connections


def _lease(dsn: str, job_id: int) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT lease_expires_at FROM pgqueue.jobs WHERE id = %s", (job_id,)
        ).fetchone()
    assert row is not None
    return row[0]


@pytest.mark.timeout(90)
async def test_writes_blocked_on_locked_rows_leave_the_heartbeat_a_connection(
    db_dsn: str,
) -> None:
    registry = Registry()
    release = asyncio.Event()
    started = 0
    all_started = asyncio.Event()

    @registry.handler("test.gate")
    async def gate(job: Job) -> dict[str, Any]:
        nonlocal started
        started += 1
        if started == FAILING + 1:
            all_started.set()
        await release.wait()
        if job.payload.get("fail"):
            raise RuntimeError("boom")  # a retry: an outcome write of its own
        await asyncio.Event().wait()  # the held job runs on
        return {}

    specs = [JobSpec("t", "scheduled", {"fail": True}, kind="test.gate")] * FAILING
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        failing = pgqueue.enqueue_many(conn, specs)
        [held] = pgqueue.enqueue_many(conn, [JobSpec("t", "scheduled", {}, kind="test.gate")])
    assert held is not None
    settings = Settings(heartbeat_seconds=0.3, poll_interval_seconds=0.3)
    worker = Worker(db_dsn, settings, registry, concurrency=FAILING + 1)
    run = asyncio.create_task(worker.run(install_signal_handlers=False))
    locker = await psycopg.AsyncConnection.connect(db_dsn)
    try:
        await asyncio.wait_for(all_started.wait(), 30)
        await locker.execute("SET statement_timeout = '60s'")
        await locker.execute(
            "SELECT id FROM pgqueue.jobs WHERE id = ANY(%s) FOR UPDATE", (failing,)
        )
        before = await asyncio.to_thread(_lease, db_dsn, held)
        release.set()  # the failing jobs' writes now wait on the locked rows
        await asyncio.sleep(2.5)  # several heartbeats
        after = await asyncio.to_thread(_lease, db_dsn, held)
        assert after > before, "the heartbeat found no pooled connection"
    finally:
        await locker.rollback()
        await locker.close()
        worker.request_stop(hard=True)
        await asyncio.wait_for(run, 60)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        states = conn.execute(
            "SELECT state::text, count(*) FROM pgqueue.jobs GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert states == [("queued", FAILING + 1)]  # retried, and the held one interrupted


@pytest.mark.timeout(90)
async def test_held_rows_do_not_keep_the_write_slots_from_other_jobs(db_dsn: str) -> None:
    """Found by a fresh tester: seven rows held open (a cancel or UPDATE left in a user's
    transaction) took all seven write slots, waiting on their locks, and every other job's
    failure, retry or limiter-teaching success queued behind them: the worker stopped for every
    tenant. A write now waits for a held row briefly, then lets go of its slot and connection
    and tries again later."""
    registry = Registry()
    release = asyncio.Event()
    started = 0
    all_started = asyncio.Event()
    held_count, other_count = 10, 10

    @registry.handler("test.gate")
    async def gate(job: Job) -> dict[str, Any]:
        nonlocal started
        started += 1
        if started == held_count:
            all_started.set()
        await release.wait()
        raise RuntimeError("boom")  # a retry: an outcome write of its own

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        held = pgqueue.enqueue_many(
            conn, [JobSpec("held", "scheduled", {}, kind="test.gate")] * held_count
        )
    settings = Settings(heartbeat_seconds=0.3, poll_interval_seconds=0.2, shutdown_grace_seconds=1)
    worker = Worker(db_dsn, settings, registry, concurrency=20)
    run = asyncio.create_task(worker.run(install_signal_handlers=False))
    locker = await psycopg.AsyncConnection.connect(db_dsn)
    try:
        await asyncio.wait_for(all_started.wait(), 30)
        await locker.execute("SET statement_timeout = '60s'")
        await locker.execute("SELECT id FROM pgqueue.jobs WHERE id = ANY(%s) FOR UPDATE", (held,))
        release.set()  # ten writes now meet held rows
        await asyncio.sleep(1.0)
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            others = pgqueue.enqueue_many(
                conn, [JobSpec("other", "scheduled", {}, kind="test.gate")] * other_count
            )
        recorded = 0
        for _ in range(100):  # the other tenant's failures are recorded during the hold
            await asyncio.sleep(0.1)
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                row: Any = conn.execute(
                    "SELECT count(*) FROM pgqueue.jobs WHERE id = ANY(%s) AND attempts >= 1"
                    " AND state = 'queued'",
                    (others,),
                ).fetchone()
            recorded = row[0]
            if recorded == other_count:
                break
        assert recorded == other_count, "held rows kept the other jobs' writes waiting"
    finally:
        await locker.rollback()
        await locker.close()
        worker.request_stop(hard=True)
        await asyncio.wait_for(run, 60)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        left: Any = conn.execute(
            "SELECT count(*) FROM pgqueue.jobs WHERE id = ANY(%s) AND state = 'running'", (held,)
        ).fetchone()
    assert left == (0,)  # the held ones were written once the rows were let go


@pytest.mark.timeout(60)
async def test_a_success_held_past_the_retry_window_is_never_recorded_as_failed(
    db_dsn: str,
) -> None:
    """Found by a tester: a success whose row stayed held past the write's retry window raised
    lock_not_available, which the completer took for "a result that cannot be stored" and
    recorded as a permanent failure once the hold ended. Now it is given up like any write
    the database would not take: the job stays running and comes back when its lease
    expires."""
    from psycopg_pool import AsyncConnectionPool

    from pgqueue.db import queries
    from pgqueue.models import Succeeded
    from pgqueue.worker.completer import Completer

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.enqueue_many(conn, [JobSpec("t", "scheduled", {}, kind="pgqueue.noop")])
        [row] = queries.run(
            conn, "job_claim", {"limit": 1, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []}
        )
    job = Job.from_row(row)
    pool = AsyncConnectionPool(
        db_dsn, min_size=1, max_size=3, kwargs={"autocommit": True}, open=False
    )
    await pool.open()
    locker = await psycopg.AsyncConnection.connect(db_dsn)
    try:
        completer = Completer(pool, Settings(), write_slots=1)
        completer._retry_seconds = 1.0  # the window, shortened for the test
        await locker.execute("SET statement_timeout = '30s'")
        await locker.execute("SELECT id FROM pgqueue.jobs WHERE id = %s FOR UPDATE", (job.id,))
        record = completer._record

        async def record_then_let_go(*args: Any) -> Any:
            try:
                return await record(*args)
            except psycopg.errors.LockNotAvailable:
                await locker.rollback()  # the hold ends right after the window ran out
                raise

        completer._record = record_then_let_go  # type: ignore[method-assign]
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        write = asyncio.create_task(completer._record_alone(job, Succeeded({"ok": 1}), future))
        await asyncio.wait_for(write, 20)
        assert future.done() and isinstance(future.exception(), psycopg.errors.LockNotAvailable)
    finally:
        await locker.close()
        await pool.close()
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        state: Any = conn.execute(
            "SELECT state::text, last_error FROM pgqueue.jobs WHERE id = %s", (job.id,)
        ).fetchone()
    assert state == ("running", None)
