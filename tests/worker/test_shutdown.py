"""Graceful SIGTERM of a ``pgqueue work`` process with jobs in flight.

First SIGTERM: stop claiming, let running jobs finish within the grace period; past it, return
them to the queue (interrupted, no attempt used). Either way the process exits 0 and no job is
left ``running``.
"""

from __future__ import annotations

import signal
from collections import Counter
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

import pgqueue
from tests.apps.harness import NOOP_APP, CliProcess, count_by_state, jobs, start_cli, wait_until

TENANT = "tenant-shutdown"
SLOTS = 4


def _enqueue_slow(dsn: str, n: int, seconds: float) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return pgqueue.enqueue_many(
            conn,
            [
                pgqueue.JobSpec(TENANT, "scheduled", {"seconds": seconds}, 300, "test.slow")
                for _ in range(n)
            ],
        )


def _start_worker(dsn: str, tmp_path: Path, *extra: str, **env: str) -> CliProcess:
    return start_cli(
        "work",
        "--concurrency",
        str(SLOTS),
        "--app",
        NOOP_APP,
        "--dsn",
        dsn,
        *extra,
        log_dir=tmp_path / "logs",
        env={"PGQUEUE_TEST_RECORD_FILE": str(tmp_path / "record"), **env},
    )


def _wait_running(dsn: str, proc: CliProcess, n: int, tmp_path: Path | None = None) -> None:
    """Wait for ``n`` jobs running in the database and, given ``tmp_path``, for their handlers
    to have started (recorded): a claim is made durable before its handlers start, so a stop
    sent once the rows say running can come before any handler ran (seen on a loaded VM)."""

    def probe() -> bool:
        if proc.popen.poll() is not None:
            raise AssertionError(f"worker exited early ({proc.popen.returncode}):\n{proc.stderr()}")
        if count_by_state(dsn).get("running", 0) != n:
            return False
        if tmp_path is None:
            return True
        record = tmp_path / f"record.{proc.pid}"
        return record.exists() and len(record.read_text(encoding="utf-8").split()) == n

    wait_until(probe, timeout=60, interval=0.02, what=f"{n} running jobs")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_lets_running_jobs_finish_within_grace(db_dsn: str, tmp_path: Path) -> None:
    # SLOTS jobs fill the worker; the extra ones can only be claimed once a slot frees, 3 s
    # after the claim — long after the SIGTERM sent as soon as the slots are seen full.
    slow = _enqueue_slow(db_dsn, SLOTS, 3.0)
    extra = _enqueue_slow(db_dsn, 2, 3.0)
    proc = _start_worker(db_dsn, tmp_path)
    try:
        _wait_running(db_dsn, proc, SLOTS)
        proc.popen.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert code == 0, proc.stderr()
    assert "claimed 4 (succeeded 4)" in proc.stdout()
    # said at once, without --verbose (found by a tester: the first Ctrl-C printed nothing)
    # at INFO (a normal stop is no warning), which `pgqueue work` shows without -v
    assert (
        "INFO pgqueue.worker: stopping: no new claims; waiting up to 30 s for 4 running job(s); "
        "press Ctrl-C again"
    ) in proc.stderr()

    rows = {r["id"]: r for r in jobs(db_dsn)}
    for job_id in slow:  # finished within the grace period, on their only attempt
        row = rows[job_id]
        assert row["state"] == "succeeded"
        assert row["attempts"] == 1
        assert row["finished_at"] - row["started_at"] >= timedelta(seconds=3)
    for job_id in extra:  # never claimed after the signal
        row = rows[job_id]
        assert row["state"] == "queued"
        assert row["attempts"] == 0
        assert row["started_at"] is None
    assert "running" not in count_by_state(db_dsn)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_past_grace_returns_jobs_to_the_queue(db_dsn: str, tmp_path: Path) -> None:
    slow = _enqueue_slow(db_dsn, SLOTS, 10.0)
    proc = _start_worker(db_dsn, tmp_path, PGQUEUE_SHUTDOWN_GRACE_SECONDS="0.5")
    try:
        _wait_running(db_dsn, proc, SLOTS, tmp_path)
        proc.popen.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert code == 0, proc.stderr()
    assert "claimed 4 (queued 4)" in proc.stdout()

    rows = jobs(db_dsn)
    assert [r["id"] for r in rows] == slow
    assert Counter(r["state"] for r in rows) == {"queued": SLOTS}  # interrupted, not finished
    for row in rows:
        assert row["attempts"] == 0  # the interrupted attempt is given back
        assert row["worker_id"] is None
        assert row["lease_token"] is None and row["lease_expires_at"] is None
        assert row["finished_at"] is None
        assert row["last_error"] == "worker shutdown"
        assert row["run_at"] >= row["started_at"]  # requeued at the interruption, due at once
    assert len(jobs(db_dsn, "state = 'queued' AND run_at <= now()")) == SLOTS
    # every job was started (recorded by the handler) exactly once
    ran = (tmp_path / f"record.{proc.pid}").read_text(encoding="utf-8").split()
    assert sorted(map(int, ran)) == slow


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_in_burst_mode_honours_the_grace_period(db_dsn: str, tmp_path: Path) -> None:
    _enqueue_slow(db_dsn, SLOTS, 4.0)
    proc = _start_worker(db_dsn, tmp_path, "--burst", PGQUEUE_SHUTDOWN_GRACE_SECONDS="0.5")
    try:
        _wait_running(db_dsn, proc, SLOTS)
        proc.popen.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert code == 0, proc.stderr()
    assert count_by_state(db_dsn) == {"queued": SLOTS}
