"""A job cancelled while its handler runs (``pgqueue.cancel``): the worker stops the handler at
its next heartbeat, writes nothing, and frees the slot."""

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


@pytest.mark.timeout(60)
async def test_a_running_job_cancelled_stops_its_handler_and_frees_its_slot(db_dsn: str) -> None:
    registry = Registry()
    started = asyncio.Event()
    stopped: list[int] = []

    @registry.handler("test.hold")
    async def hold(job: Job) -> dict[str, Any]:
        started.set()
        try:
            await asyncio.sleep(45)  # far past the heartbeat
        except asyncio.CancelledError:
            stopped.append(job.id)
            raise
        return {}

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
