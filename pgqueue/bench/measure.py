"""The measurements of ``pgqueue bench``: enqueue, claim+complete (consume), idle wake-up."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from pgqueue.bench.common import (
    GO_CHANNEL,
    GO_NOTIFY,
    LISTEN_APP,
    NOOP_KIND,
    PAYLOAD,
    PAYLOAD_BYTES,
    PAYLOAD_JSON,
    PLAIN_INSERT,
    PLAIN_INSERT_MANY,
    READY_APP,
    SENTINEL_TENANT,
    BenchOptions,
    _chunks,
    _cli_command,
    _job,
    _pgqueuer_queries,
    percentile,
)

# ------------------------------------------------------------------------------------ enqueue


def _enqueue_pgqueue(dsn: str, n: int, bulk: bool, batch: int, tenants: int) -> float:
    import pgqueue

    jobs = [_job(i, tenants) for i in range(n)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        pgqueue.enqueue(conn, **_job(0, tenants))  # warm-up: connection, plans, tenant rows
        if bulk:
            specs = [pgqueue.JobSpec(**j) for j in jobs]
            started = time.perf_counter()
            for part in _chunks(n, batch):
                pgqueue.enqueue_many(conn, specs[part.start : part.stop])
        else:
            started = time.perf_counter()
            for job in jobs:
                pgqueue.enqueue(conn, **job)
        return n / (time.perf_counter() - started)


def _enqueue_plain(dsn: str, n: int, bulk: bool, batch: int, tenants: int) -> float:
    tenant_ids = [f"t{i % tenants}" for i in range(n)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(PLAIN_INSERT, ("t0", Jsonb(PAYLOAD)))  # warm-up
        started = time.perf_counter()
        if bulk:
            for part in _chunks(n, batch):
                conn.execute(
                    PLAIN_INSERT_MANY,
                    (tenant_ids[part.start : part.stop], [PAYLOAD_JSON] * len(part)),
                )
        else:
            for tenant in tenant_ids:
                conn.execute(PLAIN_INSERT, (tenant, Jsonb(PAYLOAD)))
        return n / (time.perf_counter() - started)


async def _enqueue_pgqueuer_async(dsn: str, n: int, bulk: bool, batch: int) -> float:
    queries, close = await _pgqueuer_queries(dsn)
    try:
        await queries.enqueue("noop", PAYLOAD_BYTES, 0)  # warm-up
        started = time.perf_counter()
        if bulk:
            for part in _chunks(n, batch):
                size = len(part)
                await queries.enqueue(["noop"] * size, [PAYLOAD_BYTES] * size, [0] * size)
        else:
            for _ in range(n):
                await queries.enqueue("noop", PAYLOAD_BYTES, 0)
        return n / (time.perf_counter() - started)
    finally:
        await close()


def _enqueue_pgqueuer(dsn: str, n: int, bulk: bool, batch: int, tenants: int) -> float:
    return asyncio.run(_enqueue_pgqueuer_async(dsn, n, bulk, batch))


ENQUEUE: dict[str, Callable[[str, int, bool, int, int], float]] = {
    "pgqueue": _enqueue_pgqueue,
    "plain": _enqueue_plain,
    "pgqueuer": _enqueue_pgqueuer,
}


# ------------------------------------------------------------------------------------ consume


def _spawn(cmd: list[str], log: Any) -> subprocess.Popen[bytes]:
    # Without the caller's PGQUEUE_* settings: the workers run the shape the options say and
    # the report records (found by a tester: PGQUEUE_CLAIM_BATCH_MAX=1 in the shell made the
    # pgqueue workers claim one job at a time under a title that said otherwise).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env)


def _wait_ready(dsn: str, app_name: str, count: int, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 40.0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = %s",
                (app_name,),
            ).fetchone()
            if row is not None and row[0] >= count:
                break
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a benchmark worker process exited before it was ready")
            if time.monotonic() > deadline:
                raise RuntimeError(f"benchmark workers not ready after 40 s ({app_name})")
            time.sleep(0.05)
    time.sleep(0.5)  # let each worker finish its first (empty) claim and go idle


def _fill_sync(dsn: str, system: str, options: BenchOptions, sentinel: int | None) -> float:
    """Fill the queue in ONE transaction; return ``clock_timestamp()`` just before COMMIT."""
    import pgqueue

    n, batch, tenants = options.jobs, options.batch, options.tenants
    with psycopg.connect(dsn) as conn:
        for part in _chunks(n, batch):
            if system == "pgqueue":
                pgqueue.enqueue_many(conn, [pgqueue.JobSpec(**_job(i, tenants)) for i in part])
            else:
                conn.execute(
                    PLAIN_INSERT_MANY,
                    ([f"t{i % tenants}" for i in part], [PAYLOAD_JSON] * len(part)),
                )
        if sentinel is not None:
            conn.execute(
                "UPDATE pgqueue.jobs SET state = 'cancelled', finished_at = now() WHERE id = %s",
                (sentinel,),
            )
        conn.execute(sql.SQL("NOTIFY {}").format(sql.Identifier(GO_CHANNEL)))
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        conn.commit()
        return float(row[0])


async def _fill_pgqueuer_async(dsn: str, n: int, batch: int) -> float:
    queries, close = await _pgqueuer_queries(dsn)
    try:
        await queries.driver.execute("BEGIN")
        for part in _chunks(n, batch):
            size = len(part)
            await queries.enqueue(["noop"] * size, [PAYLOAD_BYTES] * size, [0] * size)
        await queries.driver.execute(GO_NOTIFY)
        rows = await queries.driver.fetch(
            "SELECT extract(epoch FROM clock_timestamp())::float8 AS t"
        )
        await queries.driver.execute("COMMIT")
        return float(rows[0]["t"])
    finally:
        await close()


def _sentinel(dsn: str) -> int:
    """A job due in 45 s keeps ``--burst`` workers waiting (LISTEN) until the fill commits."""
    import pgqueue

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT now() + interval '45 seconds'").fetchone()
        assert row is not None
        sentinel = pgqueue.enqueue(
            conn,
            tenant_id=SENTINEL_TENANT,
            origin="batch_job",
            payload=PAYLOAD,
            kind=NOOP_KIND,
            run_at=row[0],
        )
        assert sentinel is not None, "admission dropped the benchmark's sentinel job"
        return sentinel


_END_QUERY = {
    "pgqueue": (
        "SELECT count(*), extract(epoch FROM max(finished_at))::float8, "
        "extract(epoch FROM min(started_at))::float8 FROM pgqueue.jobs "
        "WHERE state = 'succeeded' AND tenant_id <> %s"
    ),
    "plain": (
        "SELECT count(*), extract(epoch FROM max(finished_at))::float8, "
        "extract(epoch FROM min(started_at))::float8 FROM bench_plain.jobs "
        "WHERE state = 'succeeded' AND tenant_id <> %s"
    ),
    "pgqueuer": (
        "SELECT count(*) FILTER (WHERE status = 'successful'), "
        "extract(epoch FROM max(created) FILTER (WHERE status = 'successful'))::float8, "
        "extract(epoch FROM min(created) FILTER (WHERE status <> 'queued'))::float8 "
        "FROM pgqueuer_log WHERE entrypoint <> %s"
    ),
}


def consume_once(dsn: str, system: str, procs: int, options: BenchOptions) -> dict[str, Any]:
    """One drain of ``options.jobs`` no-op jobs by ``procs`` processes of ``system``."""
    n = options.jobs
    sentinel = _sentinel(dsn) if system == "pgqueue" else None
    if system == "pgqueue":
        cmd = [*_cli_command(), "work", "--burst", "--concurrency", str(options.concurrency)]
        if options.claim_batch is not None:
            cmd += ["--claim-batch", str(options.claim_batch)]
        cmd += ["--dsn", dsn]
        ready_app = LISTEN_APP
    else:
        if system == "plain":
            size, limit = options.concurrency, options.claim_batch
        else:
            size, limit = options.peer_batch, options.peer_max_in_flight
        cmd = [sys.executable, "-m", "pgqueue.bench", f"{system}-worker", dsn, str(size)]
        if limit is not None:
            cmd.append(str(limit))
        ready_app = READY_APP
    with tempfile.TemporaryFile() as log:
        workers = [_spawn(cmd, log) for _ in range(procs)]
        try:
            try:
                _wait_ready(dsn, ready_app, procs, workers)
            except RuntimeError as exc:  # say why (found: a worker's error was not shown)
                log.seek(0)
                said = log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"{exc}: {said}") from None
            if system == "pgqueuer":
                t0 = asyncio.run(_fill_pgqueuer_async(dsn, n, options.batch))
            else:
                t0 = _fill_sync(dsn, system, options, sentinel)
            deadline = time.monotonic() + options.process_timeout
            for proc in workers:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            for proc in workers:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        codes = [p.returncode for p in workers]
        log.seek(0)
        stderr = log.read().decode(errors="replace")
    if any(codes):
        raise RuntimeError(f"{system} worker exited with {codes}: {stderr[-2000:]}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(_END_QUERY[system], (SENTINEL_TENANT,)).fetchone()
    assert row is not None
    done, end, first = int(row[0]), row[1], row[2]
    if done != n or end is None:
        raise RuntimeError(f"{system}: {done} of {n} jobs succeeded; worker log: {stderr[-2000:]}")
    wall = end - t0
    return {
        "jobs_per_s": n / wall,
        "wall_s": wall,
        "first_claim_ms": None if first is None else (first - t0) * 1000,
    }


# ------------------------------------------------------------------------------------ wake-up


def wakeup(dsn: str, options: BenchOptions) -> dict[str, Any]:
    """Commit one job at a time to an idle LISTENing worker; latency commit → claim."""
    import pgqueue

    cmd = [*_cli_command(), "work", "--concurrency", str(options.concurrency), "--dsn", dsn]
    rng = random.Random(8)
    samples: list[tuple[int, float]] = []
    with tempfile.TemporaryFile() as log:
        worker = _spawn(cmd, log)
        try:
            _wait_ready(dsn, LISTEN_APP, 1, [worker])
            time.sleep(0.5)
            with psycopg.connect(dsn) as conn:
                for i in range(options.wake_samples):
                    time.sleep(rng.uniform(0.02, 0.06))  # the worker is idle again
                    job_id = pgqueue.enqueue(conn, **_job(i, options.tenants))
                    assert job_id is not None, "admission dropped a benchmark job"
                    row = conn.execute(
                        "SELECT extract(epoch FROM clock_timestamp())::float8"
                    ).fetchone()
                    assert row is not None
                    conn.commit()
                    samples.append((job_id, float(row[0])))
                ids = [s[0] for s in samples]
                deadline = time.monotonic() + 30.0
                started: dict[int, float] = {}
                while True:
                    started = dict(
                        conn.execute(
                            "SELECT id, extract(epoch FROM started_at)::float8 FROM pgqueue.jobs "
                            "WHERE id = ANY(%s) AND started_at IS NOT NULL",
                            (ids,),
                        ).fetchall()
                    )
                    conn.commit()
                    if len(started) == len(ids) or time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    latencies = [(started[j] - t) * 1000 for j, t in samples if j in started]
    if not latencies:
        raise RuntimeError("no wake-up sample was claimed")
    return {
        "samples": len(latencies),
        "missed": len(samples) - len(latencies),
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies),
        "all_ms": [round(x, 3) for x in latencies],
    }
