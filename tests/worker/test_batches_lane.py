"""The batches lane end to end: real workers, a real database, the sandbox's Batches API.

Batch-tier ``anthropic.messages`` jobs of tenants whose lane is on are parked in batches,
submitted with ``custom_id`` = job id, polled, and finished from their results; no request
is submitted twice (the sandbox counts submissions per ``custom_id``).
"""

from __future__ import annotations

import asyncio
import io
import json
import signal
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import generate_latest
from psycopg.rows import dict_row
from pydantic import SecretStr
from rich.console import Console

import pgqueue
from pgqueue.batches import poller
from pgqueue.batches.lane import set_lane
from pgqueue.observability.metrics import database_registry
from pgqueue.observability.report import collect_status, render_status
from pgqueue.sandbox import SandboxConfig, running_sandbox
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker
from tests.apps.harness import start_cli, wait_until

TENANTS = [f"tenant-{i}" for i in range(5)]


def payload(i: int) -> dict[str, Any]:
    return {
        "model": "claude-haiku-4-5",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": f"question {i:05d} " + "x" * 30}],
    }  # 45 characters: 12 input tokens in the sandbox


def settings(base_url: str, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "anthropic_base_url": base_url,
        "anthropic_api_key": SecretStr("sandbox-key"),
        "poll_interval_seconds": 0.1,
        "batches_max_requests": 300,
        "batches_max_age_seconds": 0.3,
        "batches_poll_seconds": 0.1,
        "backoff_base_seconds": 0.1,
        "backoff_cap_seconds": 0.2,
    }
    return Settings(**{**values, **extra})


def enqueue(dsn: str, per_tenant: int, *, tenants: list[str] = TENANTS) -> list[int]:
    """``per_tenant`` batch-tier jobs of each tenant, tenant by tenant (all of tenant-0's
    first), so that only the claim's DRR order can mix them."""
    specs = [
        {"tenant_id": t, "origin": "batch_job", "payload": payload(i), "sla_seconds": None}
        for t in tenants
        for i in range(per_tenant)
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        set_lane(conn, None, True)
        ids = pgqueue.enqueue_many(conn, specs)
    assert None not in ids
    return [i for i in ids if i is not None]


def sandbox_get(base_url: str, path: str) -> Any:
    with urllib.request.urlopen(f"{base_url}{path}", timeout=10) as answer:
        return json.load(answer)


def sandbox_post(base_url: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"{base_url}{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)


def rows(dsn: str, sql: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return conn.execute(sql.encode()).fetchall()


async def run_burst(dsn: str, s: Settings, concurrency: int = 50) -> None:
    worker = Worker(dsn, s, concurrency=concurrency, burst=True, seed=1)
    await worker.run(install_signal_handlers=False)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_thousand_jobs_of_five_tenants_go_in_batches(db_dsn: str) -> None:
    ids = enqueue(db_dsn, 200)
    with running_sandbox() as base_url:
        await run_burst(db_dsn, settings(base_url))
        sent = sandbox_get(base_url, "/_sandbox/batches/stats")
        messages = sandbox_get(base_url, "/_sandbox/stats")

    jobs = rows(db_dsn, "SELECT id, state::text, input_tokens, output_tokens FROM pgqueue.jobs")
    assert len(jobs) == len(ids) == 1000
    assert Counter(j["state"] for j in jobs) == {"succeeded": 1000}
    assert all(j["input_tokens"] == 12 and j["output_tokens"] == 8 for j in jobs)
    assert sent["requests"] == 1000
    assert sent["max_submissions_per_custom_id"] == 1
    assert messages["requests"] == 0  # nothing went through the Messages API

    batches = rows(db_dsn, "SELECT * FROM pgqueue.batches ORDER BY id")
    assert sent["batches"] == len(batches) >= 4  # at most 300 requests each
    assert all(b["state"] == "ended" and b["requests"] <= 300 for b in batches)
    assert sum(b["succeeded"] for b in batches) == 1000
    assert sum(b["input_tokens"] for b in batches) == 12_000
    assert all(b["provider_batch_id"] and b["submitted_at"] and b["ended_at"] for b in batches)

    # status: the lane's tokens and the cost saved, 50 % of 12k input tokens at $3/M and
    # 8k output tokens at $15/M
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        status = collect_status(conn, settings=Settings())
    lane = status["batches"]
    shown = io.StringIO()
    render_status(status, Console(file=shown, width=250))
    assert "Batches lane: " in shown.getvalue()
    assert "1,000 succeeded" in shown.getvalue()
    assert "estimated cost saved $0.08" in shown.getvalue()
    assert (lane["requests"], lane["succeeded"], lane["output_tokens"]) == (1000, 1000, 8000)
    assert lane["cost_saved_usd"] == pytest.approx(0.5 * (12_000 * 3 + 8_000 * 15) / 1e6)
    # per tenant (pgqueue.batch_lane_service): every tenant's share, adding up to the totals
    assert sorted(t["tenant_id"] for t in lane["tenants"]) == sorted(TENANTS)
    assert sum(t["input_tokens"] for t in lane["tenants"]) == 12_000
    assert sum(t["output_tokens"] for t in lane["tenants"]) == 8_000
    assert sum(t["cost_saved_usd"] for t in lane["tenants"]) == pytest.approx(
        lane["cost_saved_usd"]
    )
    assert "Batches lane per tenant" in shown.getvalue()

    scraped = generate_latest(database_registry(db_dsn)).decode()
    assert 'pgqueue_batches_tokens_total{direction="input"} 12000.0' in scraped
    assert 'pgqueue_batches_requests_total{result="succeeded"} 1000.0' in scraped
    assert "pgqueue_batches_cost_saved_usd 0.078" in scraped

    # DRR order among tenants: the first batch holds every tenant's share, within one
    # quantum (5 cost units; each job costs 1) plus one job of each other.
    first = rows(
        db_dsn,
        f"SELECT tenant_id, count(*) AS n FROM pgqueue.batch_jobs "
        f"WHERE batch_id = {batches[0]['id']} GROUP BY tenant_id",
    )
    counts = [r["n"] for r in first]
    assert len(counts) == 5
    assert max(counts) - min(counts) <= 6


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_crash_after_the_sdk_call_is_reconciled_not_sent_again(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker dies between the provider's answer and recording it (simulated: recording
    the provider id raises once). The batch stays ``submitting``; when its lease runs out the
    next take reconciles it by custom_id and adopts the provider's batch."""
    enqueue(db_dsn, 10, tenants=TENANTS[:2])
    real = poller.BatchPoller._submitted
    crashed: list[str] = []

    async def crash_once(self: poller.BatchPoller, batch_id: int, provider_id: str) -> None:
        if not crashed:
            crashed.append(provider_id)
            raise RuntimeError("simulated crash after the SDK call")
        await real(self, batch_id, provider_id)

    monkeypatch.setattr(poller.BatchPoller, "_submitted", crash_once)
    with running_sandbox() as base_url:
        await run_burst(
            db_dsn,
            settings(base_url, lease_seconds=2, heartbeat_seconds=0.5, provider_timeout_seconds=1),
        )
        sent = sandbox_get(base_url, "/_sandbox/batches/stats")

    assert crashed
    [batch] = rows(db_dsn, "SELECT * FROM pgqueue.batches")
    assert batch["provider_batch_id"] == crashed[0]  # adopted, not submitted again
    assert sent == {
        "batches": 1,
        "requests": 20,
        "max_submissions_per_custom_id": 1,
        "duplicates": [],
        "pending_faults": 0,
    }
    states = rows(db_dsn, "SELECT state::text FROM pgqueue.jobs")
    assert Counter(r["state"] for r in states) == {"succeeded": 20}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("expired_policy", ["messages", "failed"])
async def test_errored_and_expired_follow_the_policy(db_dsn: str, expired_policy: str) -> None:
    ids = enqueue(db_dsn, 10, tenants=TENANTS[:1])
    with running_sandbox() as base_url:
        sandbox_post(base_url, "/_sandbox/batches/faults", {"errored": 2, "expired": 3})
        await run_burst(db_dsn, settings(base_url, batches_expired=expired_policy))
        sent = sandbox_get(base_url, "/_sandbox/batches/stats")
        messages = sandbox_get(base_url, "/_sandbox/stats")

    jobs = {
        r["id"]: r
        for r in rows(db_dsn, "SELECT id, state::text, attempts, last_error FROM pgqueue.jobs")
    }
    first = rows(
        db_dsn,
        "SELECT job_id, outcome FROM pgqueue.batch_jobs WHERE batch_id = "
        "(SELECT min(id) FROM pgqueue.batches) ORDER BY job_id",
    )
    outcomes = Counter(r["outcome"] for r in first)
    assert outcomes == {"succeeded": 5, "errored": 2, "expired": 3}
    errored = [r["job_id"] for r in first if r["outcome"] == "errored"]
    expired = [r["job_id"] for r in first if r["outcome"] == "expired"]
    # errored (api_error, retryable): back to the queue, then a second batch
    assert all(jobs[i]["state"] == "succeeded" and jobs[i]["attempts"] == 2 for i in errored)
    assert sent["requests"] == 12 and sent["duplicates"] == [str(i) for i in sorted(errored)]
    if expired_policy == "messages":  # sent alone through the Messages API, never batched again
        assert all(jobs[i]["state"] == "succeeded" for i in expired)
        assert messages["ok"] == 3
    else:
        assert all(jobs[i]["state"] == "failed" for i in expired)
        assert all(jobs[i]["last_error"] == "batch request expired" for i in expired)
        assert messages["requests"] == 0
    assert sum(j["state"] == "succeeded" for j in jobs.values()) == (
        10 if expired_policy == "messages" else 7
    )
    assert len(ids) == 10


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_lane_off_sends_batch_jobs_through_the_messages_api(db_dsn: str) -> None:
    enqueue(db_dsn, 3, tenants=TENANTS[:1])
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        set_lane(conn, TENANTS[0], False)  # the tenant's own setting beats the global one
    with running_sandbox() as base_url:
        await run_burst(db_dsn, settings(base_url))
        sent = sandbox_get(base_url, "/_sandbox/batches/stats")
        messages = sandbox_get(base_url, "/_sandbox/stats")
    assert sent["requests"] == 0 and messages["ok"] == 3
    assert rows(db_dsn, "SELECT count(*) AS n FROM pgqueue.batches") == [{"n": 0}]


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_killed_workers_batch_is_finished_by_another(db_dsn: str, tmp_path: Path) -> None:
    """``pgqueue work`` is SIGKILLed while its batch is out at the provider; a second worker
    takes the batch by its row, polls it by provider id and finishes every job; no request
    was submitted twice."""
    enqueue(db_dsn, 20, tenants=TENANTS[:3])
    with running_sandbox(SandboxConfig(batch_processing_seconds=2.0)) as base_url:
        env = {
            "PGQUEUE_ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": "sandbox-key",
            "PGQUEUE_POLL_INTERVAL_SECONDS": "0.1",
            "PGQUEUE_BATCHES_MAX_AGE_SECONDS": "0.2",
            "PGQUEUE_BATCHES_POLL_SECONDS": "0.1",
        }
        first = start_cli("work", "--dsn", db_dsn, log_dir=tmp_path / "logs", env=env)

        def all_submitted() -> list[dict[str, Any]] | None:
            # on a loaded machine the jobs may go out in more than one batch
            found = rows(db_dsn, "SELECT * FROM pgqueue.batches ORDER BY id")
            done = all(b["state"] == "submitted" for b in found)
            return found if found and done and sum(b["requests"] for b in found) == 60 else None

        try:
            submitted = wait_until(all_submitted, timeout=120, what="every job in a sent batch")
            first.popen.send_signal(signal.SIGKILL)
            assert first.wait(timeout=30) == -signal.SIGKILL
        finally:
            first.kill()
        states = rows(db_dsn, "SELECT state::text FROM pgqueue.batches")
        assert {r["state"] for r in states} == {"submitted"}
        assert sandbox_get(base_url, "/_sandbox/batches/stats")["requests"] == 60

        await run_burst(db_dsn, settings(base_url))
        sent = sandbox_get(base_url, "/_sandbox/batches/stats")

    batches = rows(db_dsn, "SELECT * FROM pgqueue.batches ORDER BY id")
    assert {b["state"] for b in batches} == {"ended"}
    assert [b["provider_batch_id"] for b in batches] == [b["provider_batch_id"] for b in submitted]
    assert sum(b["requests"] for b in batches) == sum(b["succeeded"] for b in batches) == 60
    assert sent["requests"] == 60 and sent["max_submissions_per_custom_id"] == 1
    states = rows(db_dsn, "SELECT state::text FROM pgqueue.jobs")
    assert Counter(r["state"] for r in states) == {"succeeded": 60}


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_cancelling_every_job_of_a_batch_cancels_it_at_the_provider(db_dsn: str) -> None:
    ids = enqueue(db_dsn, 4, tenants=TENANTS[:1])
    with running_sandbox(SandboxConfig(batch_processing_seconds=3600)) as base_url:
        worker = asyncio.create_task(run_burst(db_dsn, settings(base_url)))
        await asyncio.to_thread(
            wait_until,
            lambda: rows(db_dsn, "SELECT 1 FROM pgqueue.batches WHERE state = 'submitted'"),
            timeout=120,
            what="a submitted batch",
        )
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            for job_id in ids:
                conn.execute("SELECT pgqueue.cancel(%s, NULL, 'not needed')", (job_id,))
        await asyncio.wait_for(worker, 120)  # the batch ends canceled: the burst worker exits
        sent = sandbox_get(base_url, "/_sandbox/batches/stats")

    [batch] = rows(db_dsn, "SELECT * FROM pgqueue.batches")
    assert (batch["state"], batch["canceled"], batch["succeeded"]) == ("ended", 4, 0)
    assert sent["requests"] == 4
    states = rows(db_dsn, "SELECT state::text, last_error FROM pgqueue.jobs")
    assert states == [{"state": "cancelled", "last_error": "cancelled: not needed"}] * 4


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_refused_batch_retries_its_jobs_in_a_new_one(db_dsn: str) -> None:
    """The provider answers the create 400 (nothing created): the batch ends with the error
    and its jobs follow the retry policy into a new batch, instead of staying parked."""
    enqueue(db_dsn, 3, tenants=TENANTS[:1])
    with running_sandbox() as base_url:
        sandbox_post(base_url, "/_sandbox/batches/faults", {"refused": 1})
        await run_burst(db_dsn, settings(base_url))
        sent = sandbox_get(base_url, "/_sandbox/batches/stats")

    refused, done = rows(db_dsn, "SELECT * FROM pgqueue.batches ORDER BY id")
    assert (refused["state"], refused["provider_batch_id"]) == ("ended", None)
    assert refused["last_error"].startswith("batch refused: HTTP 400")
    assert (done["state"], done["succeeded"]) == ("ended", 3)
    assert sent["batches"] == 1 and sent["requests"] == 3 and sent["duplicates"] == []
    jobs = rows(db_dsn, "SELECT state::text, attempts FROM pgqueue.jobs")
    assert jobs == [{"state": "succeeded", "attempts": 2}] * 3
