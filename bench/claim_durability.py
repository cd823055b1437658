"""What a durable claim costs (issue 32, defect 8). Not part of pytest.

The claim (``job_claim`` = ``pgqueue.claim_admitted``) commits with ``synchronous_commit = off``,
so that its locks (scheduler v1: the scheduler's lock; v2: its rows, a rate-limited model's
bucket among them) are released without waiting for the WAL flush. A crash of Postgres
could then lose a claim whose handlers already ran: the jobs ran again with their attempt not
counted. Three ways to drain the same queue, ``--procs`` processes each claiming up to
``--batch`` jobs and completing them (``job_complete_many``), as ``pgqueue work`` does:

- ``async``: the claim as it was (not durable);
- ``durable`` (what the worker does now): after each claim that took jobs, the named query
  ``job_claim_durable`` (one claimed row rewritten as it is, committed with
  ``synchronous_commit = on``: a commit that waits for the WAL flush past the claim's commit
  record, after the claim's locks are gone);
- ``sync``: the claim itself committed with ``synchronous_commit = on`` (``SET LOCAL`` after
  the claim, in its transaction), so the flush happens under the claim's locks.

Each repeat clones one template database per variant and runs the variants in a rotating
order. Reports jobs per second (median of the repeats) and the ratio to ``async``.

    python bench/claim_durability.py --dsn postgresql://root@127.0.0.1/postgres \
        --jobs 4000 --procs 4 --batch 8 --repeats 3 --json bench/claim_durability.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgqueue.db import migrate, queries
from pgqueue.worker.completer import success_batch

VARIANTS = ("async", "durable", "sync")


def _admin(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True)


def _template(dsn: str, jobs: int, tenants: int) -> str:
    name = f"pgq_bench_dur_{uuid.uuid4().hex[:8]}"
    with _admin(dsn) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    target = make_conninfo(dsn, dbname=name)
    migrate.upgrade(target)
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute(
            "SELECT pgqueue.enqueue_many("
            " ARRAY(SELECT 't' || (g %% %(tenants)s) FROM generate_series(1, %(jobs)s) g),"
            " ARRAY(SELECT 'scheduled' FROM generate_series(1, %(jobs)s)),"
            " ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, %(jobs)s) g),"
            " NULL, ARRAY(SELECT 'pgqueue.noop' FROM generate_series(1, %(jobs)s)))",
            {"jobs": jobs, "tenants": tenants},
        )
        conn.execute("VACUUM ANALYZE")
    return name


def _drain(args: tuple[str, str, int]) -> int:
    dsn, variant, batch = args
    done = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            params = {
                "limit": batch,
                "worker_id": "bench",
                "lease_seconds": 120.0,
                "skip_kinds": [],
            }
            if variant == "sync":
                with conn.transaction():
                    rows = queries.run(conn, "job_claim", params)
                    conn.execute("SET LOCAL synchronous_commit = on")
            else:
                rows = queries.run(conn, "job_claim", params)
            rows = [r for r in rows if r["id"] is not None]
            if not rows:
                return done
            if variant == "durable":
                queries.run(
                    conn,
                    "job_claim_durable",
                    {k: rows[0][k] for k in ("id", "tenant_id", "lease_token")},
                )
            batch_params = success_batch(
                (r["id"], r["tenant_id"], r["lease_token"], None, None, None) for r in rows
            )
            queries.run(conn, "job_complete_many", batch_params)
            done += len(rows)


def _run(dsn: str, template: str, variant: str, procs: int, batch: int) -> float:
    clone = f"{template}_{variant}"
    with _admin(dsn) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(clone), sql.Identifier(template)
            )
        )
        conn.execute("CHECKPOINT")
    target = make_conninfo(dsn, dbname=clone)
    try:
        started = time.perf_counter()
        with multiprocessing.Pool(procs) as pool:
            done = sum(pool.map(_drain, [(target, variant, batch)] * procs))
        elapsed = time.perf_counter() - started
    finally:
        with _admin(dsn) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(clone))
            )
    return done / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    template = _template(args.dsn, args.jobs, args.tenants)
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        for repeat in range(args.repeats):
            order = VARIANTS[repeat % 3 :] + VARIANTS[: repeat % 3]
            for variant in order:
                rate = _run(args.dsn, template, variant, args.procs, args.batch)
                rates[variant].append(rate)
                print(f"repeat {repeat + 1}: {variant}: {rate:,.0f} jobs/s", flush=True)
    finally:
        with _admin(args.dsn) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(template))
            )
    with _admin(args.dsn) as conn:
        server = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in ("server_version", "fsync", "wal_sync_method", "synchronous_commit")
        }
    medians = {v: statistics.median(r) for v, r in rates.items()}
    result = {
        "args": vars(args),
        "server": server,
        "jobs_per_second": rates,
        "median_jobs_per_second": medians,
        "ratio_to_async": {v: medians[v] / medians["async"] for v in VARIANTS},
    }
    for variant in VARIANTS:
        print(
            f"{variant}: median {medians[variant]:,.0f} jobs/s "
            f"({result['ratio_to_async'][variant]:.2f}x async)"  # type: ignore[index]
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
