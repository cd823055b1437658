"""Burst mode (`pgqueue work --burst`): exit when nothing is left to run, and not before."""

from __future__ import annotations

import psycopg
import pytest

import pgqueue
from pgqueue import JobSpec
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker


@pytest.mark.timeout(120)
async def test_a_burst_worker_runs_jobs_whose_lease_expired_before_exiting(db_dsn: str) -> None:
    """Jobs left running by a dead worker, with their leases expired, were rescued by the burst
    worker's background rescuer after it had decided that nothing was left: it exited and left
    them queued. Now it rescues once more before exiting."""
    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue_many(
            conn, [JobSpec("t", "scheduled", {"n": i}, kind="pgqueue.noop") for i in range(4)]
        )
        conn.execute(  # a worker claimed them and died: leases expired
            "UPDATE pgqueue.jobs SET state = 'running', attempts = 1, worker_id = 'dead',"
            " lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second'"
        )
        conn.commit()
    # the background rescuer would only run after the worker had exited
    settings = Settings(poll_interval_seconds=0.1, rescue_interval_seconds=3600)
    worker = Worker(db_dsn, settings, concurrency=4, burst=True)
    worker._rescue_loop = _never  # type: ignore[method-assign]
    stats = await worker.run(install_signal_handlers=False)

    assert stats.rescued == 4 and stats.outcomes["succeeded"] == 4
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute(
            "SELECT state::text, count(*) FROM pgqueue.jobs GROUP BY 1"
        ).fetchall() == [("succeeded", 4)]


async def _never() -> None:
    """A background rescuer that never gets to run."""
