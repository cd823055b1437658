"""A 429/529 reschedules the job by ``run_at``; no worker slot waits while holding it.

Foundation issue, done-when 5, against the sandbox API with a real worker (in-process) and a
real database: the throttled job is retried after retry-after × 1.0-1.44, uses no failure
attempt, leaves one throttle event for its tenant, and while it waits it is an ordinary queued
row (no worker, no lease) — a one-slot worker runs another job in the meantime.
"""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import timedelta
from email.utils import formatdate
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from pydantic import SecretStr

import pgqueue
from pgqueue.errors import RateLimited
from pgqueue.models import Job
from pgqueue.sandbox import SandboxConfig, running_sandbox
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker

TENANT = "tenant-throttle"
PAYLOAD = {
    "model": "claude-haiku-4-5",
    "max_tokens": 16,
    "messages": [{"role": "user", "content": "hi"}],
}
# throttle_wait_seconds: retry-after × U(1.0, 1.44); microsecond rounding in the interval
LOW, HIGH, EPS = 1.0, 1.2 * 1.2, 1e-5


def _settings(base_url: str) -> Settings:
    return Settings(
        anthropic_base_url=base_url,
        anthropic_api_key=SecretStr("sandbox-key"),
        poll_interval_seconds=0.2,
    )


def _observer_registry(dsn: str) -> pgqueue.Registry:
    """``test.observe``: reads, while it runs, the row of the job named in its payload."""
    registry = pgqueue.Registry()

    @registry.handler("test.observe")
    async def observe(job: Job) -> dict[str, Any]:
        async with await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, row_factory=dict_row
        ) as conn:
            cur = await conn.execute(
                "SELECT state::text AS state, worker_id, lease_token::text AS lease_token, "
                "lease_expires_at IS NULL AS no_lease, run_at > now() AS due_later, "
                "attempts, throttle_retries FROM pgqueue.jobs WHERE id = %s",
                (job.payload["watch"],),
            )
            row = await cur.fetchone()
        assert row is not None
        return row

    return registry


def _sandbox_stats(base_url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{base_url}/_sandbox/stats", timeout=10) as response:
        stats: dict[str, Any] = json.load(response)
    return stats


def _enqueue(
    dsn: str, *, kind: str = "anthropic.messages", payload: Any = PAYLOAD, max_attempts: int = 5
) -> int:
    with psycopg.connect(dsn) as conn:
        return pgqueue.enqueue(
            conn,
            tenant_id=TENANT,
            origin="scheduled",
            sla_seconds=300,
            kind=kind,
            payload=payload,
            max_attempts=max_attempts,
        )


def _job(dsn: str, job_id: int) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute(
            "SELECT *, state::text AS state FROM pgqueue.jobs WHERE id = %s", (job_id,)
        ).fetchone()
    assert row is not None
    return row


def _throttle_events(dsn: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute("SELECT * FROM pgqueue.throttle_events ORDER BY id").fetchall()


def _assert_throttled_once_then_succeeded(
    dsn: str, job_id: int, status: int, retry_after: float | None
) -> dict[str, Any]:
    """The common checks; returns the throttle event."""
    job = _job(dsn, job_id)
    assert job["state"] == "succeeded", job["last_error"]
    assert job["attempts"] == 1  # the 429/529 did not consume a failure attempt
    assert job["throttle_retries"] == 1
    assert job["input_tokens"] > 0
    assert job["output_tokens"] > 0
    assert job["result"]["content"]
    [event] = _throttle_events(dsn)
    assert event["tenant_id"] == TENANT
    assert event["job_id"] == job_id
    assert event["model"] == "claude-haiku-4-5"
    assert event["status_code"] == status
    if retry_after is not None:
        assert event["retry_after_seconds"] == pytest.approx(retry_after)
    hint = event["retry_after_seconds"]
    # run_at and occurred_at come from the same statement (one now()): the wait itself.
    wait = (job["run_at"] - event["occurred_at"]).total_seconds()
    assert LOW * hint - EPS <= wait <= HIGH * hint + EPS
    # The retry did not start before run_at; guaranteed lower bounds on the database clock.
    assert job["started_at"] >= job["run_at"]
    assert job["started_at"] - event["occurred_at"] >= timedelta(seconds=LOW * hint - EPS)
    assert job["finished_at"] - job["enqueued_at"] >= timedelta(seconds=LOW * hint - EPS)
    return event


@pytest.mark.parametrize("status", [429, 529])
async def test_throttled_job_is_rescheduled_not_held(db_dsn: str, status: int) -> None:
    config = SandboxConfig(fail_first_n=1, fail_status=status, fail_retry_after="1")
    throttled = _enqueue(db_dsn)
    # Enqueued after it, so a one-slot worker can only run it while the first job waits.
    observer = _enqueue(db_dsn, kind="test.observe", payload={"watch": throttled})
    with running_sandbox(config) as base_url:
        worker = Worker(
            db_dsn,
            _settings(base_url),
            _observer_registry(db_dsn),
            concurrency=1,
            burst=True,
            seed=7,
        )
        stats = await worker.run(install_signal_handlers=False)
        sandbox = _sandbox_stats(base_url)

    event = _assert_throttled_once_then_succeeded(db_dsn, throttled, status, 1.0)
    assert stats.claimed == 3  # throttled job twice, observer once
    assert stats.outcomes == {"queued": 1, "succeeded": 2}
    assert sandbox["requests"] == 2
    assert sandbox[str(status)] == 1
    assert sandbox["ok"] == 1

    # While the throttled job waited, it was an ordinary queued row: no worker, no lease,
    # due later, its attempt given back — and the only slot ran the other job meanwhile.
    seen = _job(db_dsn, observer)
    assert seen["state"] == "succeeded"
    assert seen["result"] == {
        "state": "queued",
        "worker_id": None,
        "lease_token": None,
        "no_lease": True,
        "due_later": True,
        "attempts": 0,
        "throttle_retries": 1,
    }
    first = _job(db_dsn, throttled)
    assert event["occurred_at"] <= seen["started_at"]
    assert seen["finished_at"] <= first["started_at"]


async def test_two_slots_other_job_finishes_before_the_retry(db_dsn: str) -> None:
    """The brief's shape: two slots, a no-op enqueued just after the throttled job."""
    config = SandboxConfig(fail_first_n=1, fail_status=429, fail_retry_after="1")
    throttled = _enqueue(db_dsn)
    other = _enqueue(db_dsn, kind="pgqueue.noop", payload={"n": 1})
    with running_sandbox(config) as base_url:
        worker = Worker(db_dsn, _settings(base_url), concurrency=2, burst=True, seed=3)
        await worker.run(install_signal_handlers=False)

    _assert_throttled_once_then_succeeded(db_dsn, throttled, 429, 1.0)
    noop = _job(db_dsn, other)
    assert noop["state"] == "succeeded"
    assert noop["attempts"] == 1
    assert noop["finished_at"] < _job(db_dsn, throttled)["started_at"]


async def test_retry_after_as_http_date(db_dsn: str) -> None:
    # An IMF-fixdate two seconds ahead (whole seconds): a hint in (0, 2] seconds.
    when = formatdate(time.time() + 2, usegmt=True)
    config = SandboxConfig(fail_first_n=1, fail_status=429, fail_retry_after=when)
    throttled = _enqueue(db_dsn)
    with running_sandbox(config) as base_url:
        worker = Worker(db_dsn, _settings(base_url), concurrency=2, burst=True, seed=5)
        await worker.run(install_signal_handlers=False)

    event = _assert_throttled_once_then_succeeded(db_dsn, throttled, 429, None)
    assert 0.0 < event["retry_after_seconds"] <= 2.0


# --- throttled waiting is bounded by time, not by a count of 429s (issue 32, defect 4) ----------


def _storm_registry(throttles: int) -> pgqueue.Registry:
    """``test.storm``: raises ``RateLimited`` (retry-after 10 ms) the first ``throttles`` times
    each job runs, then succeeds."""
    registry = pgqueue.Registry()
    seen: dict[int, int] = {}

    @registry.handler("test.storm")
    async def storm(job: Job) -> dict[str, int]:
        seen[job.id] = seen.get(job.id, 0) + 1
        if seen[job.id] <= throttles:
            raise RateLimited("HTTP 429: storm", 0.01)
        return {"runs": seen[job.id]}

    return registry


async def test_a_429_storm_does_not_dead_letter_good_jobs(db_dsn: str) -> None:
    """Found by a fault run: with max_attempts 3, five 429s failed every job (attempts 0,
    throttle_retries 5), so any provider outage longer than ~4 × retry-after did."""
    ids = [_enqueue(db_dsn, kind="test.storm", payload={"i": i}, max_attempts=1) for i in range(4)]
    settings = Settings(poll_interval_seconds=0.05, max_throttle_wait_hours=1.0)
    worker = Worker(db_dsn, settings, _storm_registry(12), concurrency=4, burst=True)
    stats = await worker.run(install_signal_handlers=False)

    assert stats.outcomes == {"queued": 48, "succeeded": 4}
    for job_id in ids:
        job = _job(db_dsn, job_id)
        assert (job["state"], job["attempts"], job["throttle_retries"]) == ("succeeded", 1, 12)


async def test_throttled_waiting_ends_at_the_time_bound(db_dsn: str) -> None:
    """A job enqueued longer ago than ``max_throttle_wait_hours`` fails at its next 429, with
    the provider's reason kept; one enqueued within it is rescheduled."""
    old, recent = (_enqueue(db_dsn, kind="test.storm", payload={"i": i}) for i in range(2))
    with psycopg.connect(db_dsn) as conn:
        conn.execute(
            "UPDATE pgqueue.jobs SET enqueued_at = now() - interval '2 hours' WHERE id = %s",
            (old,),
        )
    settings = Settings(poll_interval_seconds=0.05, max_throttle_wait_hours=1.0)
    worker = Worker(db_dsn, settings, _storm_registry(1), concurrency=2, burst=True)
    await worker.run(install_signal_handlers=False)

    gave_up = _job(db_dsn, old)
    assert (gave_up["state"], gave_up["throttle_retries"]) == ("failed", 1)
    assert gave_up["last_error"] == "HTTP 429: storm"
    assert _job(db_dsn, recent)["state"] == "succeeded"


def test_the_time_bound_is_a_setting_in_hours() -> None:
    assert Settings().max_throttle_wait_hours == 24.0
    assert Settings(max_throttle_wait_hours="none").max_throttle_wait_hours is None
    with pytest.raises(ValueError):
        Settings(max_throttle_wait_hours=0)
