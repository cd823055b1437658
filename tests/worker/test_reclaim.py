"""A job rescued while its handler still runs, and claimed again by the SAME worker: two leases
of one job id in one process. The worker's bookkeeping is keyed by lease (id and token), so the
old run neither frees the new run's slot nor hides the new lease from the heartbeat."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue import JobSpec, Registry
from pgqueue.db import queries
from pgqueue.models import Job
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker


def _expire_and_rescue(dsn: str, job_id: int) -> None:
    """What a lost heartbeat comes to: the lease runs out and a rescuer requeues the job."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "UPDATE pgqueue.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
            (job_id,),
        )
        rows = queries.run(conn, "job_rescue", {"limit": 10})
        assert [r["id"] for r in rows] == [job_id]


@pytest.mark.timeout(90)
async def test_a_job_claimed_again_by_its_own_worker_keeps_both_runs_apart(db_dsn: str) -> None:
    """Found in review: the worker kept its jobs by id. The second claim replaced the first
    run's entry, so the worker counted one slot for two handlers and claimed a third job
    into a worker of two slots; when the first run ended it dropped the second run's entry
    too, whose lease the heartbeat then stopped extending."""
    registry = Registry()
    first_started, second_started, finish_first, finish_second = (asyncio.Event() for _ in range(4))
    runs: list[str] = []
    running = 0
    most_running = 0

    async def track(body: Any) -> None:
        nonlocal running, most_running
        running += 1
        most_running = max(most_running, running)
        try:
            await body
        finally:
            running -= 1

    @registry.handler("test.twice")
    async def twice(job: Job) -> dict[str, Any]:
        if not runs:
            runs.append(job.lease_token)
            first_started.set()
            await track(finish_first.wait())
        else:
            runs.append(job.lease_token)
            second_started.set()
            await track(finish_second.wait())
        return {}

    @registry.handler("test.other")
    async def other(job: Job) -> dict[str, Any]:
        await track(asyncio.sleep(0.05))
        return {}

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        [job_id] = pgqueue.enqueue_many(conn, [JobSpec("a", "scheduled", {}, kind="test.twice")])
    assert job_id is not None
    settings = Settings(heartbeat_seconds=0.2, poll_interval_seconds=0.1)
    worker = Worker(db_dsn, settings, registry, concurrency=2)
    run = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        await asyncio.wait_for(first_started.wait(), 20)
        _expire_and_rescue(db_dsn, job_id)
        await asyncio.wait_for(second_started.wait(), 20)
        assert runs[0] != runs[1]
        # both slots are taken by the two runs: these wait for one to free
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            others = pgqueue.enqueue_many(
                conn, [JobSpec("b", "scheduled", {}, kind="test.other") for _ in range(3)]
            )
        await asyncio.sleep(1.0)  # several polls and heartbeats
        assert most_running == 2, "a third handler started in a worker of two slots"
        finish_first.set()  # the old run ends: its outcome is fenced off
        await asyncio.sleep(1.0)  # the others run in the freed slot; heartbeats go on
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            row: Any = conn.execute(
                "SELECT state::text, lease_token::text, lease_expires_at > now() + interval "
                "'100 seconds' FROM pgqueue.jobs WHERE id = %s",
                (job_id,),
            ).fetchone()
        assert row[0] == "running" and row[1] == runs[1]
        assert row[2], "the second run's lease was not extended by the heartbeat"
        assert most_running == 2
        finish_second.set()
        for _ in range(100):
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                states = dict(conn.execute("SELECT id, state::text FROM pgqueue.jobs").fetchall())
            if all(s == "succeeded" for s in states.values()):
                break
            await asyncio.sleep(0.1)
        assert states == {job_id: "succeeded", **{i: "succeeded" for i in others}}
    finally:
        finish_first.set()
        finish_second.set()
        worker.request_stop()
        stats = await asyncio.wait_for(run, 30)
    assert stats.outcomes["succeeded"] == 4, stats
    assert stats.outcomes["lease_lost"] == 1, stats
    assert most_running == 2


@pytest.mark.timeout(90)
async def test_a_stop_does_not_wait_for_a_run_whose_lease_is_lost(db_dsn: str) -> None:
    """Found by a tester: with two runs of one job in a worker, a stop (and a burst exit) waited
    for the earlier run for the whole grace period, though nothing it returns can be stored.
    A run whose lease is lost is stopped at once when the worker stops."""
    registry = Registry()
    runs: list[str] = []
    second_started = asyncio.Event()
    earlier_stopped = asyncio.Event()

    @registry.handler("test.twice")
    async def twice(job: Job) -> dict[str, Any]:
        runs.append(job.lease_token)
        if len(runs) == 1:
            try:
                await asyncio.sleep(120)  # the earlier run never ends by itself
            except asyncio.CancelledError:
                earlier_stopped.set()
                raise
        else:
            second_started.set()
        return {}

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        [job_id] = pgqueue.enqueue_many(conn, [JobSpec("a", "scheduled", {}, kind="test.twice")])
    assert job_id is not None
    settings = Settings(heartbeat_seconds=0.2, poll_interval_seconds=0.1, shutdown_grace_seconds=60)
    worker = Worker(db_dsn, settings, registry, concurrency=2, burst=True)
    run = asyncio.create_task(worker.run(install_signal_handlers=False))
    for _ in range(200):
        if runs:
            break
        await asyncio.sleep(0.05)
    _expire_and_rescue(db_dsn, job_id)
    await asyncio.wait_for(second_started.wait(), 20)
    # the newer run is done: the burst worker has nothing left but the lost run
    stats = await asyncio.wait_for(run, 20)  # not the 60 s grace period
    assert earlier_stopped.is_set()
    assert stats.outcomes["succeeded"] == 1 and stats.outcomes["lease_lost"] == 1, stats
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row: Any = conn.execute("SELECT state::text FROM pgqueue.jobs WHERE id = %s", (job_id,))
        assert row.fetchone() == ("succeeded",)
