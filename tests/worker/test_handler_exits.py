"""A handler that raises SystemExit (or KeyboardInterrupt) fails its job, not the worker."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import pgqueue
from pgqueue import JobSpec, Registry
from pgqueue.models import Job
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker


@pytest.mark.timeout(120)
async def test_a_handler_that_raises_system_exit_fails_only_its_job(db_dsn: str) -> None:
    """Found by a tester: `raise SystemExit(3)` in one handler ended the worker (exit 3,
    "Task exception was never retrieved"), and every other job it held stayed `running` until
    its lease expired. Now those jobs fail like any error (retried, error saved) and the
    others run."""
    registry = Registry()

    @registry.handler("bad.sysexit")
    async def sysexit(job: Job) -> None:
        raise SystemExit(3)

    @registry.handler("bad.interrupt")
    def interrupt(job: Job) -> None:  # a plain function: run in a thread
        raise KeyboardInterrupt

    with psycopg.connect(db_dsn) as conn:
        specs = [
            JobSpec("t", "scheduled", {"n": i}, kind=kind)
            for i in range(3)
            for kind in ("bad.sysexit", "bad.interrupt", "pgqueue.noop")
        ]
        pgqueue.enqueue_many(conn, specs)
        conn.execute("UPDATE pgqueue.jobs SET max_attempts = 1")  # one attempt: failed for good
        conn.commit()
    worker = Worker(
        db_dsn, Settings(poll_interval_seconds=0.1), registry, concurrency=9, burst=True
    )
    stats = await asyncio.wait_for(worker.run(install_signal_handlers=False), 60)

    assert stats.outcomes == {"succeeded": 3, "failed": 6}
    with psycopg.connect(db_dsn) as conn:
        rows = conn.execute(
            "SELECT kind, state::text, last_error, count(*) FROM pgqueue.jobs"
            " GROUP BY 1, 2, 3 ORDER BY 1"
        ).fetchall()
    assert rows == [
        ("bad.interrupt", "failed", "KeyboardInterrupt: ", 3),
        ("bad.sysexit", "failed", "SystemExit: 3", 3),
        ("pgqueue.noop", "succeeded", None, 3),
    ]
