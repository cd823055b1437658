"""Recording an outcome that also feeds the rate limiter takes two statements; a connection lost
between them must not make the first one's write look like a lost lease."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import pgqueue
from pgqueue.db import queries
from pgqueue.models import Deferred, Job, Throttled
from pgqueue.settings import Settings
from pgqueue.worker import completer as completer_module
from pgqueue.worker.completer import Completer

PAYLOAD = {
    "model": "claude-haiku-4-5",
    "max_tokens": 16,
    "messages": [{"role": "user", "content": "hi"}],
}


@pytest.mark.timeout(60)
async def test_a_throttle_recorded_before_the_connection_dropped_is_not_reported_lost(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a tester: the connection died after job_throttle committed and before
    ratelimit_cooldown ran; the retry ran job_throttle again, which (fenced) found nothing, and
    the recorded throttle was logged, counted and returned as a lost lease."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.enqueue(conn, tenant_id="t", origin="scheduled", payload=PAYLOAD)
        rows = queries.run(
            conn, "job_claim", {"limit": 1, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []}
        )
    job = Job.from_row(rows[0])

    arun = queries.arun
    dropped: list[str] = []

    async def drop_once_before_the_limiter(conn: Any, name: str, *args: Any, **kw: Any) -> Any:
        if name == "ratelimit_cooldown" and not dropped:
            dropped.append(name)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return await arun(conn, name, *args, **kw)

    monkeypatch.setattr(completer_module.queries, "arun", drop_once_before_the_limiter)
    async with AsyncConnectionPool(db_dsn, kwargs={"autocommit": True}, open=False) as pool:
        completer = Completer(pool, Settings())
        state = await completer.record(job, Throttled("429 test", 1.0, 429, 1.0))

    assert dropped == ["ratelimit_cooldown"]  # the limiter's statement failed once
    assert state == "queued"  # not None (a lost lease)
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute("SELECT state::text, throttle_retries FROM pgqueue.jobs").fetchone()
    assert row == ("queued", 1)  # recorded once


@pytest.mark.timeout(60)
async def test_a_deferred_job_gives_back_what_its_claim_took_from_the_limiter(
    db_dsn: str,
) -> None:
    """Found by a fresh tester: a worker without an API key claimed Messages API jobs and put
    them back for 60 s, and what the claim took from the model's buckets stayed taken, so
    such a worker held the output bucket near empty for every worker. A Deferred outcome now
    gives it back (``ratelimit_release``)."""
    payload = {**PAYLOAD, "max_tokens": 4000}
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.enqueue(conn, tenant_id="t", origin="scheduled", payload=payload)
        rows = queries.run(
            conn, "job_claim", {"limit": 1, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []}
        )
        taken = conn.execute(
            "SELECT output_tokens_available, output_tokens_per_minute FROM pgqueue.rate_limits"
        ).fetchone()
    job = Job.from_row(rows[0])
    assert taken[0] <= taken[1] - 4000  # the claim took the request's output tokens

    async with AsyncConnectionPool(db_dsn, kwargs={"autocommit": True}, open=False) as pool:
        state = await Completer(pool, Settings()).record(job, Deferred("no API key", 60.0))

    assert state == "queued"
    with psycopg.connect(db_dsn) as conn:
        level, limit = conn.execute(
            "SELECT output_tokens_available, output_tokens_per_minute FROM pgqueue.rate_limits"
        ).fetchone()
    assert level == limit  # given back (a refill alone takes 30 s to bring back 4,000)
