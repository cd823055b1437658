"""``claim_batch_max`` (``pgqueue work --claim-batch``): at most that many jobs per claim, and
with more slots than that the next claim overlaps the jobs still running; every job still runs
once, and the dispatch order is still the one DRR schedule's."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue import JobSpec
from pgqueue.handlers.registry import Registry
from pgqueue.models import Job
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker
from tests.apps.harness import dispatch_turns

N_JOBS = 36


def _enqueue(dsn: str) -> list[int | None]:
    with psycopg.connect(dsn) as conn:
        ids = pgqueue.enqueue_many(
            conn,
            [JobSpec(f"t{i % 3}", "scheduled", {"n": i}, kind="test.nap") for i in range(N_JOBS)],
        )
        conn.commit()
    return ids


def _run(dsn: str, concurrency: int, claim_batch: int | None) -> tuple[list[int], int]:
    """Drain the queue; returns (the limit of each claim, most jobs running at once)."""
    registry = Registry()
    running = 0
    most = 0

    @registry.handler("test.nap")
    async def nap(job: Job) -> dict[str, Any]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.03)
        running -= 1
        return {"n": job.payload["n"]}

    settings = Settings(poll_interval_seconds=0.1, claim_batch_max=claim_batch)
    worker = Worker(dsn, settings, registry, concurrency=concurrency, burst=True)
    limits: list[int] = []
    real_claim = worker._claim

    async def claim(limit: int) -> int:
        limits.append(limit)
        return await real_claim(limit)

    worker._claim = claim  # type: ignore[method-assign]
    stats = asyncio.run(worker.run(install_signal_handlers=False))
    assert stats.outcomes["succeeded"] == N_JOBS
    return limits, most


@pytest.mark.timeout(120)
def test_claims_are_capped_and_overlap_running_jobs(db_dsn: str) -> None:
    _enqueue(db_dsn)
    limits, most = _run(db_dsn, concurrency=6, claim_batch=2)
    assert limits and max(limits) <= 2
    # more jobs ran at once than one claim takes: claims happened while others still ran
    assert most > 2
    with psycopg.connect(db_dsn) as conn:
        states = dict(conn.execute("SELECT state::text, count(*) FROM pgqueue.jobs GROUP BY 1"))
        attempts = conn.execute("SELECT max(attempts) FROM pgqueue.jobs").fetchone()
    assert states == {"succeeded": N_JOBS}
    assert attempts == (1,)
    # Claims of at most 2 still follow the one DRR schedule: three tenants with 12 jobs of
    # cost 1 each, quantum 5: turns of 5, 5 and then the 2 left, in one cyclic order. (Found
    # porting to scheduler v2: a claim's jobs share its started_at, so the harness orders
    # them by the key each keeps, not by id.)
    turns = dispatch_turns(db_dsn)
    assert [n for _t, n in turns] == [5] * 6 + [2] * 3, turns
    cycle = [t for t, _n in turns[:3]]
    assert sorted(cycle) == ["t0", "t1", "t2"]
    assert [t for t, _n in turns] == cycle * 3


@pytest.mark.timeout(60)
async def test_a_worker_with_every_slot_busy_waits_for_a_slot(db_dsn: str) -> None:
    """Found by a tester: a wake-up (NOTIFY, the listener's connect, a rescue) that came while
    every slot was busy stayed set, and the producer looped on it at full CPU until a slot
    freed: tens of thousands of waits a second. It now waits for a freed slot."""
    registry = Registry()
    started = asyncio.Event()

    @registry.handler("test.hold")
    async def hold(job: Job) -> dict[str, Any]:
        started.set()
        await asyncio.sleep(1.0)
        return {}

    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue_many(conn, [JobSpec("t", "scheduled", {}, 300, "test.hold")] * 2)
        conn.commit()
    worker = Worker(
        db_dsn, Settings(poll_interval_seconds=0.5), registry, concurrency=2, burst=True
    )
    waits = 0
    real_wait = worker._wake.wait

    async def counting_wait() -> bool:
        nonlocal waits
        waits += 1
        return await real_wait()

    worker._wake.wait = counting_wait  # type: ignore[method-assign]
    run = asyncio.create_task(worker.run(install_signal_handlers=False))
    await asyncio.wait_for(started.wait(), 30)
    await asyncio.sleep(0.1)
    before = waits
    for _ in range(3):  # what NOTIFYs do
        worker.wake()
        await asyncio.sleep(0.1)
    during = waits - before
    stats = await run
    assert stats.outcomes["succeeded"] == 2
    assert during <= 10, f"the producer waited {during} times in 0.3 s with both slots busy"
