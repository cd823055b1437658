"""A worker SIGKILLed mid-job loses nothing: after its lease expires another worker runs the job.

The first ``pgqueue work`` process is killed (SIGKILL, by its own handler, so the moment is
exact: the job is ``running`` under its lease and no outcome is written). A second process,
started afterwards, rescues the job once the lease has expired and finishes it.
"""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg
import pytest

import pgqueue
from tests.apps.harness import NOOP_APP, jobs, start_cli, wait_until

FAST_LEASE = {
    "PGQUEUE_LEASE_SECONDS": "2",
    "PGQUEUE_HEARTBEAT_SECONDS": "0.5",
    "PGQUEUE_PROVIDER_TIMEOUT_SECONDS": "1.5",
    "PGQUEUE_RESCUE_INTERVAL_SECONDS": "0.5",
}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_job_of_a_killed_worker_is_finished_by_another(db_dsn: str, tmp_path: Path) -> None:
    marker = tmp_path / "crashed"
    with psycopg.connect(db_dsn) as conn:
        job_id = pgqueue.enqueue(
            conn,
            tenant_id="tenant-crash",
            origin="scheduled",
            sla_seconds=300,
            kind="test.crash_once",
            payload={"marker": str(marker)},
        )
    env = {**FAST_LEASE, "PGQUEUE_TEST_RECORD_FILE": str(tmp_path / "record")}
    args = ("work", "--app", NOOP_APP, "--dsn", db_dsn)

    first = start_cli(*args, log_dir=tmp_path / "logs", env=env)
    try:
        assert first.wait(timeout=60) == -signal.SIGKILL, first.stderr()
    finally:
        first.kill()
    assert marker.read_text(encoding="utf-8").strip() == str(first.pid)
    [dead] = jobs(db_dsn)
    assert dead["state"] == "running"  # left behind, still under the dead worker's lease
    assert dead["attempts"] == 1
    assert f":{first.pid}:" in dead["worker_id"]
    assert dead["lease_expires_at"] is not None

    second = start_cli(*args, log_dir=tmp_path / "logs", env=env)
    try:

        def finished() -> bool:
            if second.popen.poll() is not None:
                raise AssertionError(f"second worker exited early:\n{second.stderr()}")
            return jobs(db_dsn)[0]["state"] == "succeeded"

        wait_until(finished, timeout=60, interval=0.05, what="the second worker to finish the job")
        second.popen.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0, second.stderr()
    finally:
        second.kill()
    assert "claimed 1 (succeeded 1)" in second.stdout()

    [done] = jobs(db_dsn)
    assert done["id"] == job_id
    assert done["state"] == "succeeded"
    assert done["result"] == {"ok": True, "pid": second.pid}
    assert done["attempts"] == 2  # the dead worker's attempt counts: it may have had effects
    assert f":{second.pid}:" in done["worker_id"]
    assert done["started_at"] > dead["lease_expires_at"]  # rescued only after the lease expired
    assert not (tmp_path / f"record.{first.pid}").exists()
    assert (tmp_path / f"record.{second.pid}").read_text(encoding="utf-8") == f"{job_id}\n"
