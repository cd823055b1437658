"""The provider timeout in a running worker: the jobs of one claim share one timer
(SharedDeadline); a job still in its handler when it fires fails as timed out, the jobs
claimed with it keep their own outcomes."""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg
import pytest

import pgqueue
from pgqueue.handlers.registry import Registry
from pgqueue.models import Job
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker


@pytest.mark.timeout(120)
async def test_slow_jobs_time_out_and_the_jobs_claimed_with_them_succeed(db_dsn: str) -> None:
    registry = Registry()

    @registry.handler("test.maybe_slow")
    async def maybe_slow(job: Job) -> dict[str, int]:
        if job.payload["slow"]:
            await asyncio.sleep(30)
        return {"n": job.payload["n"]}

    with psycopg.connect(db_dsn) as conn:
        for i in range(8):  # one at a time: max_attempts per job
            pgqueue.enqueue(
                conn,
                tenant_id="t",
                origin="scheduled",
                payload={"n": i, "slow": i % 3 == 0},
                kind="test.maybe_slow",
                max_attempts=1,
            )
        conn.commit()
    settings = Settings(provider_timeout_seconds=0.3, poll_interval_seconds=0.1)
    worker = Worker(db_dsn, settings, registry, concurrency=8, burst=True)
    stats = await worker.run(install_signal_handlers=False)

    assert stats.claimed == 8
    with psycopg.connect(db_dsn) as conn:
        rows = conn.execute(
            "SELECT (payload ->> 'n')::int, state::text, last_error, attempts FROM pgqueue.jobs"
        ).fetchall()
    by_n = {n: (state, error, attempts) for n, state, error, attempts in rows}
    for n in range(8):
        if n % 3 == 0:
            assert by_n[n] == ("failed", "timed out after 0.3 s", 1), n
        else:
            assert by_n[n] == ("succeeded", None, 1), n


@pytest.mark.timeout(120)
async def test_a_worker_says_when_a_synchronous_handler_outlives_it(
    db_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by a tester: a synchronous handler past its timeout keeps its thread, and the
    process waited for it after the worker stopped, without a word. Since issue 32 the job
    keeps its lease until the thread returns, and the worker says so when the timeout passes."""
    registry = Registry()

    @registry.handler("test.sync_slow")
    def sync_slow(job: Job) -> None:  # a plain function: runs in a thread
        time.sleep(1.5)

    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue(
            conn,
            tenant_id="t",
            origin="scheduled",
            payload={},
            kind="test.sync_slow",
            max_attempts=1,
        )
        conn.commit()
    settings = Settings(provider_timeout_seconds=0.2, poll_interval_seconds=0.1)
    worker = Worker(db_dsn, settings, registry, concurrency=2, burst=True)
    with caplog.at_level(logging.WARNING, logger="pgqueue.worker"):
        stats = await worker.run(install_signal_handlers=False)

    assert stats.outcomes == {"failed": 1}
    assert any("ran past 0.2 s; the job keeps its lease" in r.message for r in caplog.records)
