"""Recording an outcome that also feeds the rate limiter takes two statements; a connection lost
between them must not make the first one's write look like a lost lease."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import pgqueue
from pgqueue.db import queries
from pgqueue.models import Job, Throttled
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
        rows = queries.run(conn, "job_claim", {"limit": 1, "worker_id": "w", "lease_seconds": 60})
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
