"""A synchronous handler's job never runs twice at once (issue 32, defect 3).

A plain ``def`` handler runs in a thread, which cannot be stopped. Found by a fault run: past
its provider timeout, the job was retried while the thread ran on (7 overlaps in one worker);
on a stop, it went back to the queue and a second worker started it beside the first worker's
thread (6 of 6). Now the job keeps its lease until the thread returns.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter

import psycopg
import pytest

import pgqueue
from pgqueue.handlers.registry import Registry
from pgqueue.models import Job
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker
from tests.apps.harness import jobs, wait_until


class Runs:
    """Counts the runs of each job, and the most that ran at the same time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now: Counter[int] = Counter()
        self.total: Counter[int] = Counter()
        self.most_at_once = 0
        self.started = threading.Event()
        self.second = threading.Event()

    def enter(self, job_id: int) -> None:
        with self._lock:
            self.now[job_id] += 1
            self.total[job_id] += 1
            self.most_at_once = max(self.most_at_once, self.now[job_id])
            if self.total[job_id] > 1:
                self.second.set()
        self.started.set()

    def leave(self, job_id: int) -> None:
        with self._lock:
            self.now[job_id] -= 1


def _enqueue(dsn: str, kind: str, n: int = 1, max_attempts: int = 2) -> list[int]:
    with psycopg.connect(dsn) as conn:
        ids = [
            pgqueue.enqueue(
                conn,
                tenant_id="t",
                origin="scheduled",
                payload={"i": i},
                kind=kind,
                max_attempts=max_attempts,
            )
            for i in range(n)
        ]
        conn.commit()
    return ids


@pytest.mark.timeout(60)
async def test_a_sync_handler_past_its_timeout_is_not_run_again_while_its_thread_runs(
    db_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs = Runs()
    registry = Registry()

    @registry.handler("test.sync_slow")
    def sync_slow(job: Job) -> dict[str, bool]:
        runs.enter(job.id)
        try:
            time.sleep(0.8)  # far past the 0.1 s timeout; the retry is due after ~10 ms
        finally:
            runs.leave(job.id)
        return {"ok": True}

    ids = _enqueue(db_dsn, "test.sync_slow", n=3, max_attempts=2)
    settings = Settings(
        provider_timeout_seconds=0.1, poll_interval_seconds=0.05, backoff_base_seconds=0.01
    )
    worker = Worker(db_dsn, settings, registry, concurrency=4, burst=True)
    with caplog.at_level(logging.WARNING, logger="pgqueue.worker"):
        stats = await worker.run(install_signal_handlers=False)

    assert runs.most_at_once == 1
    assert runs.total == {job_id: 2 for job_id in ids}  # two attempts each, one after the other
    assert stats.outcomes == {"queued": 3, "failed": 3}
    for row in jobs(db_dsn):
        assert (row["state"], row["attempts"]) == ("failed", 2)
        assert row["last_error"] == "timed out after 0.1 s"
    assert any("keeps its lease until its thread returns" in r.message for r in caplog.records)


@pytest.mark.timeout(60)
async def test_a_stopped_workers_sync_job_is_not_started_by_another_worker(db_dsn: str) -> None:
    """Two workers; the first is stopped (hard) while its synchronous handler runs. The job must
    not go back to the queue while the thread runs: the second worker must not start it."""
    runs = Runs()
    release = threading.Event()
    registry = Registry()

    @registry.handler("test.sync_block")
    def sync_block(job: Job) -> dict[str, bool]:
        runs.enter(job.id)
        try:
            release.wait(20)
        finally:
            runs.leave(job.id)
        return {"ok": True}

    (job_id,) = _enqueue(db_dsn, "test.sync_block")
    settings = Settings(poll_interval_seconds=0.05, shutdown_grace_seconds=0.1)
    first = Worker(db_dsn, settings, registry, concurrency=1, worker_id="first")
    first_run = asyncio.create_task(first.run(install_signal_handlers=False))
    second = Worker(db_dsn, settings, registry, concurrency=1, worker_id="second")
    second_run: asyncio.Task[object] | None = None
    try:
        assert await asyncio.to_thread(runs.started.wait, 20)
        second_run = asyncio.create_task(second.run(install_signal_handlers=False))
        first.request_stop(hard=True)
        # The old code put the job back at once and the second worker (polling every 50 ms)
        # started it: give it that chance, bounded, then let the thread return.
        started_twice = await asyncio.to_thread(runs.second.wait, 3)
        release.set()
        await asyncio.wait_for(first_run, 30)
        wait_until(
            lambda: jobs(db_dsn)[0]["state"] != "running", timeout=20, what="the job recorded"
        )
    finally:
        release.set()
        second.request_stop()
        first.request_stop(hard=True)
        for task in (first_run, second_run):
            if task is not None:
                await asyncio.wait_for(task, 30)

    assert not started_twice
    assert runs.most_at_once == 1
    assert runs.total == {job_id: 1}
    (row,) = jobs(db_dsn)
    # recorded as it ended, by the worker whose thread ran it
    assert (row["state"], row["attempts"], row["worker_id"]) == ("succeeded", 1, "first")
    assert first.stats.outcomes == {"succeeded": 1}
    assert second.stats.claimed == 0
