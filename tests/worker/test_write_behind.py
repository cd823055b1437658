"""Write-behind completion: a job's slot frees when its handler returns, before the batch that
records its success is written; every success is still recorded and counted, and the lease
stays held (heartbeat) until it is."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue import JobSpec
from pgqueue.observability import metrics
from pgqueue.settings import Settings
from pgqueue.worker.completer import Completer
from pgqueue.worker.runtime import Worker


@pytest.mark.timeout(120)
async def test_slots_free_before_the_flush_and_every_success_is_recorded(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue_many(
            conn,
            [JobSpec(f"t{i % 3}", "scheduled", {"n": i}, kind="pgqueue.noop") for i in range(60)],
        )
        conn.commit()
    worker = Worker(db_dsn, Settings(poll_interval_seconds=0.1), concurrency=4, burst=True)
    most_flushing = 0
    claimed_during_flush = 0
    real_flush = Completer._flush

    async def slow_flush(self: Completer, batch: list[Any]) -> None:
        # a slow database commit: the worker keeps claiming meanwhile
        nonlocal most_flushing, claimed_during_flush
        before = worker.stats.claimed
        most_flushing = max(most_flushing, len(worker._jobs.flushing))
        await asyncio.sleep(0.05)
        claimed_during_flush += worker.stats.claimed - before
        await real_flush(self, batch)

    monkeypatch.setattr(Completer, "_flush", slow_flush)
    stats = await worker.run(install_signal_handlers=False)

    assert stats.outcomes["succeeded"] == 60
    assert claimed_during_flush > 0  # claims overlapped the flushes
    assert 0 < most_flushing <= 4  # never more than `concurrency` successes wait to be written
    with psycopg.connect(db_dsn) as conn:
        states = dict(conn.execute("SELECT state::text, count(*) FROM pgqueue.jobs GROUP BY 1"))
    assert states == {"succeeded": 60}


@pytest.mark.timeout(120)
async def test_a_result_that_cannot_be_stored_fails_its_job_alone(db_dsn: str) -> None:
    """A handler result Postgres cannot store (a NUL character) made the whole batched
    completion fail: the other jobs of the batch stayed running, were rescued and ran again.
    Now the batch is recorded job by job and only that job fails, for good."""
    from pgqueue.handlers.registry import Registry
    from pgqueue.models import Job

    registry = Registry()
    runs: dict[int, int] = {}

    @registry.handler("test.echo")
    async def echo(job: Job) -> dict[str, Any]:
        runs[job.id] = runs.get(job.id, 0) + 1
        if job.payload.get("bad"):
            return {"text": "a\x00b"}
        if job.payload.get("unencodable"):
            return {"when": object()}
        return {"n": job.payload["n"]}

    with psycopg.connect(db_dsn) as conn:
        specs = [JobSpec("t", "scheduled", {"n": i}, kind="test.echo") for i in range(30)]
        specs[7] = JobSpec("t", "scheduled", {"n": 7, "bad": True}, kind="test.echo")
        specs[19] = JobSpec("t", "scheduled", {"n": 19, "unencodable": True}, kind="test.echo")
        pgqueue.enqueue_many(conn, specs)
        conn.commit()
    worker = Worker(
        db_dsn, Settings(poll_interval_seconds=0.1), registry, concurrency=10, burst=True
    )

    def outcomes(name: str) -> float:
        value = metrics.WORKER_REGISTRY.get_sample_value(
            "pgqueue_job_outcomes_total", {"outcome": name}
        )
        return value or 0.0

    before = {name: outcomes(name) for name in ("succeeded", "failed")}
    stats = await worker.run(install_signal_handlers=False)

    assert stats.outcomes["succeeded"] == 28 and stats.outcomes["failed"] == 2
    # the metric counted them as succeeded (the handler's outcome), not as recorded
    assert outcomes("succeeded") - before["succeeded"] == 28
    assert outcomes("failed") - before["failed"] == 2
    assert set(runs.values()) == {1}  # nothing ran twice
    with psycopg.connect(db_dsn) as conn:
        rows = conn.execute(
            "SELECT payload ->> 'n', state::text, last_error FROM pgqueue.jobs"
            " WHERE state <> 'succeeded' ORDER BY id"
        ).fetchall()
    assert [(n, state) for n, state, _e in rows] == [("7", "failed"), ("19", "failed")]
    assert all("could not be stored" in error for _n, _s, error in rows)
