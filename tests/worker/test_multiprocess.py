"""Several ``pgqueue work`` processes share one queue through Postgres alone.

Foundation issue, done-when 4: 2,000 jobs, four burst workers with 8 slots each started at once;
every job runs exactly once (one attempt, one line in exactly one process's record file), the
outcome each process reports matches what it ran, and the work is actually shared.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import psycopg
import pytest

import pgqueue
from tests.apps.harness import count_by_state, jobs, records_by_pid, run_held_burst_workers

N_JOBS = 2000
N_PROCS = 4
APP_PREFIX = "pgq-mp-test-"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_four_processes_run_every_job_exactly_once(db_dsn: str, tmp_path: Path) -> None:
    record_base = tmp_path / "record"
    with psycopg.connect(db_dsn) as conn:  # one transaction
        ids = pgqueue.enqueue_many(
            conn,
            [
                pgqueue.JobSpec("tenant-mp", "scheduled", {"n": i}, 300, "test.record")
                for i in range(N_JOBS)
            ],
        )
        # Hold the jobs back (within the 60 s burst horizon, so burst workers wait for them)
        # until every process is up: they then start on equal terms, not in start-up order.
        conn.execute("UPDATE pgqueue.jobs SET run_at = now() + interval '45 seconds'")
    assert len(set(ids)) == N_JOBS

    procs, codes = run_held_burst_workers(
        db_dsn,
        [db_dsn] * N_PROCS,
        log_dir=tmp_path / "logs",
        record_base=record_base,
        app_prefix=APP_PREFIX,
    )
    assert codes == [0] * N_PROCS, "\n".join(proc.stderr() for proc in procs)

    # Every job succeeded on its first and only attempt.
    rows = jobs(db_dsn)
    assert count_by_state(db_dsn) == {"succeeded": N_JOBS}
    assert Counter(r["attempts"] for r in rows) == {1: N_JOBS}
    assert all(r["result"] == {"ok": True} and r["lease_expires_at"] is None for r in rows)

    # Each job ran exactly once: the union of the per-process record files holds every id once.
    ran_by = records_by_pid(record_base)  # pid -> job ids it ran
    all_runs = [job_id for ran in ran_by.values() for job_id in ran]
    assert len(all_runs) == N_JOBS
    assert set(all_runs) == set(ids)
    assert set(ran_by) <= {proc.pid for proc in procs}

    # The row's worker_id ("host:pid:random") names the process whose file holds the job.
    pid_of_job = {job_id: pid for pid, ran in ran_by.items() for job_id in ran}
    for r in rows:
        assert int(r["worker_id"].split(":")[-2]) == pid_of_job[r["id"]]

    # What each process reports (claimed N, succeeded N) is what it ran.
    for proc in procs:
        match = re.search(r"claimed (\d+) \((nothing|succeeded (\d+))\)", proc.stdout())
        assert match, proc.stdout()
        claimed = int(match[1])
        assert claimed == int(match[3] or 0) == len(ran_by.get(proc.pid, []))

    # The work was shared: more than one process ran jobs.
    share = {pid: len(ran) for pid, ran in ran_by.items() if ran}
    assert len(share) >= 2, f"jobs per process: {share}"
