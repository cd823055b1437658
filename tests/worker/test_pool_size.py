"""How many connections workers hold: each new one costs the server its first plans and
function compiles, so a pool that grows under contention costs CPU per job (runtime.py,
POOL_SIZE_MAX)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

import pgqueue
from pgqueue import JobSpec
from pgqueue.worker.runtime import POOL_SIZE_MAX
from tests.apps.harness import start_cli


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_workers_on_one_queue_keep_their_pools_small(db_dsn, tmp_path):
    """Found by callgrind on `bench/cpu_per_job.py`: two workers draining one queue opened
    20-22 connections (pools of ``min(concurrency, 8) + 2`` grew while writes waited on rows
    the other worker's claim held), one alone 6, and the new connections' first plans made
    Postgres CPU per job 15-25 % higher. Each worker holds at most POOL_SIZE_MAX pooled
    connections, its LISTEN connection and, while it starts, one for the schema check."""
    jobs = 6000
    with psycopg.connect(db_dsn) as conn:
        for start in range(0, jobs, 1000):
            pgqueue.enqueue_many(
                conn,
                [
                    JobSpec(f"t{i % 10}", "scheduled", {"n": i}, kind="pgqueue.noop")
                    for i in range(start, start + 1000)
                ],
            )
        conn.commit()
        dbname = conn.info.dbname
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        with psycopg.connect(db_dsn, autocommit=True) as watcher:
            while not done.is_set():
                row = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    (dbname,),
                ).fetchone()
                assert row is not None
                peak = max(peak, int(row[0]))
                time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    workers = [
        start_cli("work", "--burst", "--concurrency", "10", "--dsn", db_dsn, log_dir=tmp_path)
        for _ in range(2)
    ]
    try:
        for w in workers:
            assert w.wait(200) == 0, w.stderr()
    finally:
        done.set()
        sampler.join()
        for w in workers:
            w.kill()
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pgqueue.jobs WHERE state = 'succeeded'").fetchone()
    assert row == (jobs,)
    assert 2 <= peak <= 2 * (POOL_SIZE_MAX + 2)
