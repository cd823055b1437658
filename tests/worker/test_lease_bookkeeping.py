"""What a worker concludes about leases: a heartbeat that races the worker's own completion is
not a lost lease, and a burst worker does not exit while its rescuer is putting jobs back.
Both found by a tester running several workers against one database."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import pgqueue
from pgqueue import JobSpec
from pgqueue.db import queries
from pgqueue.models import Job, Succeeded
from pgqueue.settings import Settings
from pgqueue.worker.completer import Completer, success_batch
from pgqueue.worker.leases import held_leases
from pgqueue.worker.runtime import Worker

CLAIM = {"limit": 2, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []}


async def _never() -> None:
    await asyncio.Event().wait()


@pytest.mark.timeout(60)
async def test_a_job_completed_while_the_heartbeat_waited_is_not_a_lost_lease(
    db_dsn: str,
) -> None:
    """The batched completion committed while the heartbeat waited on the row: the heartbeat
    no longer found the lease and flagged 'lease lost; its outcome will be dropped' for a job
    whose success was recorded (48 false warnings in 15 s with 0.2 s heartbeats)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.enqueue_many(
            conn, [JobSpec("t", "scheduled", {"n": i}, kind="pgqueue.noop") for i in range(2)]
        )
        rows = queries.run(conn, "job_claim", CLAIM)
        assert len(rows) == 2
        done, lost = (Job.from_row(r) for r in rows)
        # both leases are gone from the database: `done` by this worker's own completion,
        # `lost` by someone else (a rescue and another claim, say)
        batch = success_batch(
            (j.id, j.tenant_id, j.lease_token, None, None, None) for j in (done, lost)
        )
        assert len(queries.run(conn, "job_complete_many", batch)) == 2
    worker = Worker(db_dsn, Settings())
    worker._pool = AsyncConnectionPool(db_dsn, min_size=1, max_size=2, open=False)
    await worker._pool.open()
    task = asyncio.create_task(_never())
    try:
        worker._jobs.flushing[done.lease] = (done, task)  # its success was being written
        worker._jobs.recording.add(done.lease)
        worker._jobs.running[lost.lease] = (lost, task)  # its handler still runs
        await worker._leases.heartbeat_once(worker._pool)
    finally:
        task.cancel()
        await worker._pool.close()
    assert worker._jobs.lost == {lost.lease}
    assert worker.stats.lost_leases == 1


@pytest.mark.timeout(120)
async def test_a_burst_worker_runs_the_jobs_its_rescuer_puts_back(db_dsn: str) -> None:
    """Jobs whose leases expired before a `--burst` worker started: its background rescuer put
    them back while the producer decided nothing was left, and the worker exited with them
    queued (4 runs in 5)."""
    for _round in range(3):
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            pgqueue.enqueue_many(
                conn,
                [JobSpec("t", "scheduled", {"n": i}, kind="pgqueue.noop") for i in range(20)],
            )
            claimed = queries.run(
                conn,
                "job_claim",
                {"limit": 20, "worker_id": "dead", "lease_seconds": 0.1, "skip_kinds": []},
            )
            assert len(claimed) == 20
        await asyncio.sleep(0.3)
        worker = Worker(db_dsn, Settings(poll_interval_seconds=0.2), burst=True)
        stats = await worker.run(install_signal_handlers=False)
        assert stats.outcomes["succeeded"] == 20, stats
        with psycopg.connect(db_dsn) as conn:
            left: Any = conn.execute(
                "SELECT count(*) FROM pgqueue.jobs WHERE state <> 'succeeded'"
            ).fetchone()
        assert left[0] == 0


def test_a_heartbeat_skips_a_row_another_transaction_holds(db_dsn: str) -> None:
    """A heartbeat waited for rows a batched completion had locked, while the completion
    waited for rows the heartbeat had locked (each in its own heap order): a deadlock, seen
    once by a tester under stress. The heartbeat now never waits: it skips a locked row (and
    extends the lease at its next round)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.enqueue_many(
            conn, [JobSpec("t", "scheduled", {"n": i}, kind="pgqueue.noop") for i in range(2)]
        )
        first, second = (Job.from_row(r) for r in queries.run(conn, "job_claim", CLAIM))
    with psycopg.connect(db_dsn) as other:
        other.execute("SET lock_timeout = '5s'")
        other.execute("SELECT 1 FROM pgqueue.jobs WHERE id = %s FOR UPDATE", (first.id,))
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '2s'")  # a wait would fail the test, not hang it
            rows = queries.run(
                conn, "job_heartbeat", {**held_leases([first, second]), "lease_seconds": 60}
            )
        assert [r["id"] for r in rows] == [second.id]
        other.rollback()


async def test_a_job_moved_to_another_tenant_is_a_lost_lease_not_a_held_row(db_dsn: str) -> None:
    """Found by a tester: a running job moved to another tenant by hand was judged "held" at
    every heartbeat (its lease token still matched), never extended, and lost silently when
    its lease ran out. Every write is fenced by the tenant too: it is lost at once."""
    from pgqueue.worker import leases

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.enqueue_many(
            conn,
            [pgqueue.JobSpec(t, "scheduled", {}, kind="pgqueue.noop") for t in ("a", "b", "c")],
        )
        rows = queries.run(
            conn, "job_claim", {"limit": 3, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []}
        )
        moved, kept, deleted = (Job.from_row(r) for r in rows)
        conn.execute(
            "UPDATE pgqueue.jobs SET tenant_id = %s WHERE id = %s", (kept.tenant_id, moved.id)
        )
        conn.execute("DELETE FROM pgqueue.jobs WHERE id = %s", (deleted.id,))
    pool = AsyncConnectionPool(db_dsn, min_size=1, max_size=2, open=False)
    await pool.open()
    try:
        verdicts = await leases.why_not_extended(pool, [moved, kept, deleted])
        # a success of the deleted job, written after the delete: withdrawn, not a lost lease
        # (found by a tester: counted lease_lost, with the lost-lease warning)
        completer = Completer(pool, Settings())
        completer.start()
        state = await completer.record(deleted, Succeeded({}))
        await completer.aclose()
    finally:
        await pool.close()
    assert verdicts == {moved.lease: "lost", kept.lease: "held", deleted.lease: "deleted"}
    assert state == "cancelled"
