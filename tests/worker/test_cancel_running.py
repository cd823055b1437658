"""A job cancelled while its handler runs (``pgqueue.cancel``): the worker stops the handler at
its next heartbeat, writes nothing, and frees the slot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue import JobSpec, Registry
from pgqueue.models import Job
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker, WorkerStats


def _holding() -> tuple[Registry, asyncio.Event, list[int]]:
    """A registry whose ``test.hold`` handler notes its start, then waits 45 s (far past the
    heartbeat), noting its job id if it is stopped: (registry, started, stopped)."""
    registry = Registry()
    started = asyncio.Event()
    stopped: list[int] = []

    @registry.handler("test.hold")
    async def hold(job: Job) -> dict[str, Any]:
        started.set()
        try:
            await asyncio.sleep(45)
        except asyncio.CancelledError:
            stopped.append(job.id)
            raise
        return {}

    return registry, started, stopped


async def _until(check: Callable[[], bool]) -> None:
    """Wait up to 10 s for ``check()``."""
    for _ in range(100):
        if check():
            return
        await asyncio.sleep(0.1)


@pytest.mark.timeout(60)
async def test_a_running_job_cancelled_stops_its_handler_and_frees_its_slot(db_dsn: str) -> None:
    registry, started, stopped = _holding()

    @registry.handler("test.quick")
    async def quick(job: Job) -> dict[str, Any]:
        return {}

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        [held] = pgqueue.enqueue_many(conn, [JobSpec("t", "scheduled", {}, kind="test.hold")])
    assert held is not None
    settings = Settings(heartbeat_seconds=0.2, poll_interval_seconds=0.2)
    worker = Worker(db_dsn, settings, registry, concurrency=1, burst=True)
    run = asyncio.create_task(worker.run(install_signal_handlers=False))
    await asyncio.wait_for(started.wait(), 20)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert pgqueue.cancel(conn, held, reason="test") == "cancelled"
        # the one slot must free up for this job, and the burst worker then exit
        [quick_id] = pgqueue.enqueue_many(conn, [JobSpec("t", "scheduled", {}, kind="test.quick")])
    stats = await asyncio.wait_for(run, 30)
    assert stopped == [held]
    assert stats.outcomes["cancelled"] == 1, stats
    assert stats.outcomes["succeeded"] == 1, stats
    assert stats.lost_leases == 0
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        states = dict(conn.execute("SELECT id, state::text FROM pgqueue.jobs").fetchall())
        last_error = conn.execute(
            "SELECT last_error FROM pgqueue.jobs WHERE id = %s", (held,)
        ).fetchone()
    assert states == {held: "cancelled", quick_id: "succeeded"}
    assert last_error == ("cancelled: test",)


def _one_job_and_a_worker(
    db_dsn: str, registry: Registry, kind: str, concurrency: int
) -> tuple[int, Worker, asyncio.Task[Any]]:
    """One job of ``kind``, and a worker (heartbeat 0.2 s) started on it."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        [held] = pgqueue.enqueue_many(conn, [JobSpec("a", "scheduled", {}, kind=kind)])
    assert held is not None
    settings = Settings(heartbeat_seconds=0.2, poll_interval_seconds=0.2)
    worker = Worker(db_dsn, settings, registry, concurrency=concurrency)
    return held, worker, asyncio.create_task(worker.run(install_signal_handlers=False))


async def _stopped(worker: Worker, run: asyncio.Task[Any]) -> WorkerStats:
    """Stop ``worker`` and return its stats."""
    worker.request_stop()
    stats: WorkerStats = await asyncio.wait_for(run, 30)
    return stats


def _cancelled_once(stats: WorkerStats) -> None:
    """The job was stopped as cancelled, not counted as a lost lease."""
    assert stats.outcomes["cancelled"] == 1, stats
    assert stats.lost_leases == 0, stats


async def _succeeded(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row: Any = conn.execute(
            "SELECT count(*) FROM pgqueue.jobs WHERE state = 'succeeded'"
        ).fetchone()
    return int(row[0])


@pytest.mark.timeout(90)
async def test_a_cancel_held_open_does_not_stop_the_other_completions(db_dsn: str) -> None:
    """Found by a tester: `BEGIN; SELECT pgqueue.cancel(J); ...` held open while J's handler
    finished stopped the worker for every tenant: J's success went into the batched
    completion, which waited on J's row. Now the batch skips the held row and J's success is
    written on its own; once the cancel commits, J counts as cancelled, not as a lost lease."""
    registry = Registry()
    started, release = asyncio.Event(), asyncio.Event()

    @registry.handler("test.gate")
    async def gate(job: Job) -> dict[str, Any]:
        started.set()
        await release.wait()
        return {}

    held, worker, run = _one_job_and_a_worker(db_dsn, registry, "test.gate", 4)
    try:
        await asyncio.wait_for(started.wait(), 20)
        async with await psycopg.AsyncConnection.connect(db_dsn) as canceller:
            await canceller.execute("SET statement_timeout = '30s'")
            assert await pgqueue.cancel(canceller, held) == "cancelled"  # not committed yet
            release.set()  # J's success now waits on its row
            await asyncio.sleep(0.3)
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                pgqueue.enqueue_many(
                    conn,
                    [JobSpec(f"t{i % 3}", "scheduled", {}, kind="pgqueue.noop") for i in range(30)],
                )
            for _ in range(100):
                if await _succeeded(db_dsn) == 30:
                    break
                await asyncio.sleep(0.1)
            assert await _succeeded(db_dsn) == 30, "the held cancel stopped the worker"
            await canceller.commit()
    finally:
        stats = await _stopped(worker, run)
    assert stats.outcomes["cancelled"] == 1, stats
    assert stats.outcomes["lease_lost"] == 0 and stats.lost_leases == 0, stats
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row: Any = conn.execute("SELECT state::text FROM pgqueue.jobs WHERE id = %s", (held,))
        assert row.fetchone() == ("cancelled",)


@pytest.mark.timeout(90)
async def test_a_heartbeat_during_an_uncommitted_cancel_still_stops_the_handler(
    db_dsn: str,
) -> None:
    """Found by a tester: a heartbeat that met the row held by an uncommitted cancel flagged
    the job as lost for good, so once the cancel committed its handler was never stopped. Now
    a held row with our lease still committed is asked about again at the next heartbeat."""
    registry, started, stopped = _holding()

    held, worker, run = _one_job_and_a_worker(db_dsn, registry, "test.hold", 2)
    try:
        await asyncio.wait_for(started.wait(), 20)
        async with await psycopg.AsyncConnection.connect(db_dsn) as canceller:
            await canceller.execute("SET statement_timeout = '30s'")
            assert await pgqueue.cancel(canceller, held) == "cancelled"
            await asyncio.sleep(1.2)  # several heartbeats meet the held row
            assert stopped == [] and worker.stats.lost_leases == 0
            await canceller.commit()
        await _until(lambda: bool(stopped))
        assert stopped == [held]
    finally:
        stats = await _stopped(worker, run)
    _cancelled_once(stats)


@pytest.mark.timeout(60)
async def test_a_running_job_deleted_by_hand_stops_its_handler(db_dsn: str) -> None:
    """Found by a tester: a running job whose row was deleted (a hand ``DELETE``) kept its
    handler running to the end, spending the provider's time on an answer nobody can store.
    The heartbeat that finds no row stops the handler, as for a cancel."""
    registry, started, stopped = _holding()

    held, worker, run = _one_job_and_a_worker(db_dsn, registry, "test.hold", 2)
    try:
        await asyncio.wait_for(started.wait(), 20)
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM pgqueue.jobs WHERE id = %s", (held,))
        await _until(lambda: bool(stopped))
        assert stopped == [held]
    finally:
        stats = await _stopped(worker, run)
    _cancelled_once(stats)
