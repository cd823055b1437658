"""``PGQUEUE_PREPARE_THRESHOLD=none``: the worker never prepares a statement on the server, as
PgBouncer in transaction mode before 1.21 requires (a named statement prepared on one server
connection is missing on the next)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue import JobSpec
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker
from tests.apps.harness import wait_until


def test_none_switches_preparing_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGQUEUE_PREPARE_THRESHOLD", "None")
    assert Settings().prepare_threshold is None
    monkeypatch.setenv("PGQUEUE_PREPARE_THRESHOLD", "0")
    assert Settings().prepare_threshold == 0
    monkeypatch.delenv("PGQUEUE_PREPARE_THRESHOLD")
    assert Settings().prepare_threshold == 5  # psycopg's own default
    with pytest.raises(ValueError):
        Settings(prepare_threshold=-1)


async def _prepared_after_work(dsn: str, settings: Settings) -> int:
    """Statements prepared on the worker's pooled connections after 20 jobs, one at a time."""
    with psycopg.connect(dsn) as conn:
        ids = pgqueue.enqueue_many(
            conn, [JobSpec("t", "scheduled", {"n": i}, kind="pgqueue.noop") for i in range(20)]
        )
        conn.commit()
    worker = Worker(dsn, settings, concurrency=1)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:

        def done() -> bool:
            with psycopg.connect(dsn) as c:
                row = c.execute(
                    "SELECT count(*) FROM pgqueue.jobs WHERE id = ANY (%s) AND state = 'succeeded'",
                    (ids,),
                ).fetchone()
            return row == (20,)

        await asyncio.to_thread(wait_until, done, timeout=60, what="the jobs to run")
        pool = worker._pool
        assert pool is not None
        async with contextlib.AsyncExitStack() as stack:  # every connection of the pool at once
            conns: list[Any] = [
                await stack.enter_async_context(pool.connection()) for _ in range(pool.max_size)
            ]
            counts = [
                (await (await c.execute("SELECT count(*) FROM pg_prepared_statements")).fetchone())[
                    0
                ]
                for c in conns
            ]
        return sum(counts)
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)


@pytest.mark.timeout(120)
async def test_the_worker_prepares_nothing_when_told_not_to(db_dsn: str) -> None:
    quiet = {"poll_interval_seconds": 0.05, "hot_tables_vacuum_interval_seconds": None}
    assert await _prepared_after_work(db_dsn, Settings(**quiet)) > 0  # psycopg's default: 5
    assert await _prepared_after_work(db_dsn, Settings(prepare_threshold=None, **quiet)) == 0
