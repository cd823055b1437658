"""Progress while every backend is terminated again and again (issue 32, defect 7).

Found by a fault run: with every backend of the database terminated every 0.3-1.0 s, workers
logged "database unavailable" for minutes while the database accepted connections, and
completed nothing for 3-16 minutes: the pool handed out idle connections whose backends had
been terminated, one after another. A connection the database accepts is no outage.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading

import psycopg
import pytest

import pgqueue
from pgqueue import JobSpec
from pgqueue.handlers.registry import Registry
from pgqueue.models import Job
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker
from tests.apps.harness import wait_until

JOBS = 400
#: The test's own connections, which the storm spares.
SPARED = "pgqueue-storm-test"


def _succeeded(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True, application_name=SPARED) as conn:
        rows = conn.execute("SELECT state::text, count(*) FROM pgqueue.jobs GROUP BY 1")
        return {state: int(n) for state, n in rows}


def _kill_storm(dsn: str, stop: threading.Event, kills: list[int]) -> None:
    """Terminate every backend of this test's database but the test's own every 0.2-0.6 s until
    ``stop``."""
    rng = random.Random(32)
    with psycopg.connect(dsn, autocommit=True, application_name=SPARED) as conn:
        while not stop.wait(rng.uniform(0.2, 0.6)):
            (n,) = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name <> %s",
                (SPARED,),
            ).fetchone() or (0,)
            kills.append(int(n))


@pytest.mark.timeout(120)
async def test_jobs_complete_under_repeated_backend_terminations(
    db_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs: dict[int, int] = {}
    registry = Registry()

    @registry.handler("test.short")
    async def short(job: Job) -> dict[str, bool]:
        runs[job.id] = runs.get(job.id, 0) + 1
        await asyncio.sleep(0.05)
        return {"ok": True}

    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue_many(
            conn,
            [JobSpec(f"t{i % 4}", "scheduled", {"i": i}, kind="test.short") for i in range(JOBS)],
        )
        conn.commit()
    settings = Settings(poll_interval_seconds=0.2)
    worker = Worker(db_dsn, settings, registry, concurrency=8)
    stop, kills = threading.Event(), []
    killer = threading.Thread(target=_kill_storm, args=(db_dsn, stop, kills))
    run = asyncio.create_task(worker.run(install_signal_handlers=False))
    killer.start()
    try:
        with caplog.at_level(logging.WARNING, logger="pgqueue.worker"):
            await asyncio.to_thread(
                wait_until,
                lambda: _succeeded(db_dsn).get("succeeded") == JOBS,
                timeout=90,
                interval=0.2,
                what="every job to succeed under the kill storm",
            )
    finally:
        stop.set()
        await asyncio.to_thread(killer.join)
        worker.request_stop()
        await asyncio.wait_for(run, 60)

    assert sum(kills) >= 20 and len(kills) >= 5  # the storm did happen, many times over
    assert _succeeded(db_dsn) == {"succeeded": JOBS}
    assert len(runs) == JOBS
    # a database that accepts connections is never reported unavailable
    assert not [r.message for r in caplog.records if "database unavailable" in r.message]
