"""Fair (DRR) claim versus a plain ``ORDER BY id FOR UPDATE SKIP LOCKED`` claim, same database.

For each queue depth × active tenants it builds one database of no-op jobs (one
``INSERT … SELECT generate_series``; the first claims stamp their DRR keys), then for each
number of processes measures claim+complete throughput (jobs/s) of both claims, ``--repeats``
times interleaved (fair, plain, fair, plain, …), restoring the queue depth between runs, and
reports medians; plus the median latency of one claim of 1 job and of ``--batch`` jobs. Both
modes complete jobs the same way (one fenced ``job_complete`` per job). Prints a table and
writes JSON (medians and every sample). Not part of pytest.

    python bench/claim.py --dsn postgresql://root@127.0.0.1/postgres \
        --depths 10000,100000 --tenants 10,1000 --procs 1,4 --repeats 5 --json bench/claim.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgqueue.db import migrate, queries

PLAIN_CLAIM = """
WITH picked AS (
    SELECT j.id, j.tenant_id FROM pgqueue.jobs j
    WHERE j.state = 'queued' AND j.run_at <= now()
    ORDER BY j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE pgqueue.jobs j
SET state = 'running', attempts = j.attempts + 1, started_at = now(),
    worker_id = %(worker_id)s, lease_token = gen_random_uuid(),
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
FROM picked WHERE j.id = picked.id AND j.tenant_id = picked.tenant_id
RETURNING j.id, j.tenant_id, j.lease_token::text AS lease_token
"""


def _claim(conn: psycopg.Connection[Any], mode: str, limit: int, worker: str) -> list[Any]:
    params = {"limit": limit, "worker_id": worker, "lease_seconds": 60, "skip_kinds": []}
    if mode == "fair":
        rows: list[Any] = queries.run(conn, "job_claim", params)
        return rows
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(PLAIN_CLAIM, params)
        return cur.fetchall()


def _worker(
    dsn: str, mode: str, jobs: int, batch: int, start_at: float
) -> tuple[float, float, int]:
    """Claim and complete ``jobs`` jobs; returns (start, end, done)."""
    worker = f"bench-{os.getpid()}"
    with psycopg.connect(dsn) as conn:
        while time.time() < start_at:
            time.sleep(0.001)
        start = time.perf_counter()
        done = 0
        while done < jobs:
            rows = _claim(conn, mode, min(batch, jobs - done), worker)
            conn.commit()
            if not rows:
                break
            # Each completion is its own transaction, as the worker's are (a transaction of
            # many completions would hold usage rows in dispatch order: deadlock-prone).
            for r in rows:
                if r["id"] is None:  # the rate limiter's "blocked" row, not a job
                    continue
                queries.run(
                    conn,
                    "job_complete",
                    {
                        "id": r["id"],
                        "tenant_id": r["tenant_id"],
                        "lease_token": r["lease_token"],
                        "result": None,
                        "input_tokens": 0,
                        "output_tokens": 0,
                    },
                )
                conn.commit()
            done += len(rows)
        return start, time.perf_counter(), done


def _restore(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "UPDATE pgqueue.jobs SET state = 'queued', started_at = NULL, finished_at = NULL, "
            "lease_token = NULL, lease_expires_at = NULL, worker_id = NULL, attempts = 0 "
            "WHERE state <> 'queued'"
        )
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE pgqueue.jobs")
        # claim once with limit 0 so the fair claim folds the requeued tenants in first
        queries.run(
            conn, "job_claim", {"limit": 0, "worker_id": "x", "lease_seconds": 1, "skip_kinds": []}
        )


def _latency_ms(dsn: str, mode: str, samples: int, limit: int = 1) -> float:
    times = []
    with psycopg.connect(dsn) as conn:
        for _ in range(samples):
            t0 = time.perf_counter()
            _claim(conn, mode, limit, "latency")
            conn.commit()
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _build(server: str, depth: int, tenants: int) -> tuple[str, str]:
    name = f"pgq_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(server, dbname=name)
    migrate.upgrade(dsn)
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO pgqueue.tenants (tenant_id) SELECT 't' || g FROM generate_series(0, %s) g",
            (tenants - 1,),
        )
        conn.execute(
            """
            INSERT INTO pgqueue.jobs (tenant_id, kind, origin, priority, payload, cost)
            SELECT 't' || (g %% %(t)s), 'pgqueue.noop',
                   (ARRAY['user_action', 'scheduled', 'batch_job'])[1 + g %% 3]::pgqueue.origin,
                   (ARRAY['critical', 'standard', 'batch'])[1 + g %% 3]::pgqueue.tier,
                   '{}'::jsonb, 1 + (g %% 4)
            FROM generate_series(1, %(n)s) g
            """,
            {"t": tenants, "n": depth},
        )
        conn.commit()
    _restore(dsn)
    return name, dsn


def _drop(server: str, name: str) -> None:
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("PGQUEUE_DSN", ""))
    parser.add_argument("--depths", default="10000,100000")
    parser.add_argument("--tenants", default="10,1000")
    parser.add_argument("--procs", default="1,4")
    parser.add_argument("--jobs", type=int, default=4000, help="jobs per measured run")
    parser.add_argument("--batch", type=int, default=10, help="claim limit (free slots)")
    parser.add_argument("--latency-samples", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode, interleaved")
    parser.add_argument("--json", default="bench/claim.json")
    args = parser.parse_args()
    ctx = multiprocessing.get_context("spawn")
    results: list[dict[str, Any]] = []
    header = (
        f"{'depth':>8} {'tenants':>7} {'procs':>5} {'fair/s':>8} {'plain/s':>8} "
        f"{'ratio':>6} {'fair ms':>8} {'plain ms':>8} {'fairB ms':>8} {'plainB ms':>9}"
    )
    print(header)
    for depth in (int(x) for x in args.depths.split(",")):
        for tenants in (int(x) for x in args.tenants.split(",")):
            name, dsn = _build(args.dsn, depth, tenants)
            try:
                latency: dict[str, float] = {}
                for m in ("fair", "plain"):
                    latency[m] = _latency_ms(dsn, m, args.latency_samples)
                    _restore(dsn)
                    latency[m + "_batch"] = _latency_ms(
                        dsn, m, max(1, args.latency_samples // args.batch), args.batch
                    )
                    _restore(dsn)
                for procs in (int(x) for x in args.procs.split(",")):
                    samples: dict[str, list[float]] = {"fair": [], "plain": [], "ratio": []}
                    for _ in range(args.repeats):
                        for mode in ("fair", "plain"):
                            start_at = time.time() + 1.0
                            with ctx.Pool(procs) as pool:
                                out = pool.starmap(
                                    _worker,
                                    [(dsn, mode, args.jobs // procs, args.batch, start_at)] * procs,
                                )
                            wall = max(e for _, e, _ in out) - min(s for s, _, _ in out)
                            samples[mode].append(sum(d for _, _, d in out) / wall)
                            _restore(dsn)
                        samples["ratio"].append(samples["fair"][-1] / samples["plain"][-1])
                    row = {
                        "depth": depth,
                        "tenants": tenants,
                        "procs": procs,
                        "batch": args.batch,
                        "repeats": args.repeats,
                        "fair_jobs_per_s": round(statistics.median(samples["fair"]), 1),
                        "plain_jobs_per_s": round(statistics.median(samples["plain"]), 1),
                        "ratio": round(statistics.median(samples["ratio"]), 3),
                        "fair_claim1_ms": round(latency["fair"], 3),
                        "plain_claim1_ms": round(latency["plain"], 3),
                        "fair_claim_batch_ms": round(latency["fair_batch"], 3),
                        "plain_claim_batch_ms": round(latency["plain_batch"], 3),
                        "samples": {k: [round(v, 3) for v in vs] for k, vs in samples.items()},
                    }
                    results.append(row)
                    print(
                        f"{depth:>8} {tenants:>7} {procs:>5} {row['fair_jobs_per_s']:>8} "
                        f"{row['plain_jobs_per_s']:>8} {row['ratio']:>6} "
                        f"{row['fair_claim1_ms']:>8} {row['plain_claim1_ms']:>8} "
                        f"{row['fair_claim_batch_ms']:>8} {row['plain_claim_batch_ms']:>9}",
                        flush=True,
                    )
            finally:
                _drop(args.dsn, name)
    with open(args.json, "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
