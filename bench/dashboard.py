"""The dashboard's render time with 1M jobs in the table (issue 31: overview p95 <= 200 ms).
Not part of pytest.

Builds a database of its own (``--db``, dropped first; kept afterwards with ``--keep``) at
the schema's head with ``--finished`` finished jobs (98 % succeeded, 2 % failed, finished
over the past 24 hours, every column a real finished job has), ``--queued`` queued jobs over
three tiers, ``--tenants`` tenants and four lanes (three models and a no-op kind), 100
running jobs, 300 throttle events in the last hour and the three models' limits; then
``VACUUM ANALYZE``. Serves the dashboard on it (uvicorn, a thread of this process, its own
pool of 4 connections) and times ``--requests`` sequential GETs of each page, client side
over loopback (the server's render time plus HTTP), after 10 warm-up requests each.

    python bench/dashboard.py --dsn postgresql://root@127.0.0.1/postgres \
        --json bench/dashboard.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import urllib.request
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgqueue.dashboard.app import DashboardConfig
from pgqueue.dashboard.server import running_dashboard
from pgqueue.db import migrate

FINISHED = """
INSERT INTO pgqueue.jobs (tenant_id, kind, origin, priority, state, payload, model,
    est_input_tokens, max_output_tokens, cost, attempts, run_at, enqueued_at, started_at,
    finished_at, worker_id, result, last_error, input_tokens, output_tokens)
SELECT 't' || (g %% %(tenants)s),
       CASE WHEN g %% 10 = 0 THEN 'pgqueue.noop' ELSE 'anthropic.messages' END,
       (ARRAY['user_action', 'scheduled', 'batch_job'])[1 + g %% 3]::pgqueue.origin,
       (ARRAY['critical', 'standard', 'batch'])[1 + g %% 3]::pgqueue.tier,
       CASE WHEN g %% 50 = 0 THEN 'failed' ELSE 'succeeded' END::pgqueue.job_state,
       jsonb_build_object('model', m.model, 'max_tokens', 512, 'messages',
           jsonb_build_array(jsonb_build_object('role', 'user',
               'content', 'Summarise ticket ' || g || ': ' || md5(g::text)))),
       m.model, 200 + g %% 800, 512, 1 + g %% 4, 1,
       fin - lat, fin - lat, fin - lat / 2, fin, 'host-' || (g %% 4),
       CASE WHEN g %% 50 <> 0 THEN jsonb_build_object('id', 'msg_' || md5(g::text),
           'content', jsonb_build_array(jsonb_build_object('type', 'text',
               'text', md5((g * 7)::text))),
           'usage', jsonb_build_object('input_tokens', 200 + g %% 800,
                                       'output_tokens', 20 + g %% 300)) END,
       CASE WHEN g %% 50 = 0 THEN 'HTTP 500: overloaded (attempt 5 of 5)' END,
       CASE WHEN g %% 50 <> 0 THEN 200 + g %% 800 END,
       CASE WHEN g %% 50 <> 0 THEN 20 + g %% 300 END
FROM generate_series(1, %(n)s) g,
     LATERAL (SELECT now() - make_interval(secs => 86400 * (1 - g::double precision / %(n)s))
                     AS fin,
                     make_interval(secs => (ARRAY[0.8, 4.0, 60.0])[1 + g %% 3]
                                           * (0.5 + (g %% 7) / 7.0)) AS lat,
                     (ARRAY['claude-haiku-4-5', 'claude-sonnet-4-5', 'claude-opus-4-1'])[1 + g %% 3]
                     AS model) m
"""

QUEUED = """
INSERT INTO pgqueue.jobs (tenant_id, kind, origin, priority, payload, model, est_input_tokens,
    max_output_tokens, cost, run_at)
SELECT 't' || (g %% %(tenants)s),
       CASE WHEN g %% 10 = 0 THEN 'pgqueue.noop' ELSE 'anthropic.messages' END,
       (ARRAY['user_action', 'scheduled', 'batch_job'])[1 + g %% 3]::pgqueue.origin,
       (ARRAY['critical', 'standard', 'batch'])[1 + g %% 3]::pgqueue.tier,
       jsonb_build_object('model', m.model, 'max_tokens', 512, 'messages',
           jsonb_build_array(jsonb_build_object('role', 'user', 'content', 'q ' || g))),
       m.model, 200 + g %% 800, 512, 1 + g %% 4,
       now() + CASE WHEN g %% 20 = 0 THEN interval '10 minutes' ELSE interval '0' END
FROM generate_series(1, %(n)s) g,
     LATERAL (SELECT (ARRAY['claude-haiku-4-5', 'claude-sonnet-4-5', 'claude-opus-4-1'])[1 + g %% 3]
                     AS model) m
"""

RUNNING = """
UPDATE pgqueue.jobs SET state = 'running', started_at = now(), attempts = 1,
    lease_expires_at = now() + interval '2 minutes', lease_token = gen_random_uuid(),
    worker_id = 'bench'
WHERE id IN (SELECT id FROM pgqueue.jobs WHERE state = 'queued' ORDER BY id LIMIT 100)
"""

THROTTLES = """
INSERT INTO pgqueue.throttle_events (tenant_id, model, status_code, retry_after_seconds,
    occurred_at)
SELECT 't' || (g %% 7), 'claude-sonnet-4-5', CASE WHEN g %% 5 = 0 THEN 529 ELSE 429 END, 2,
       now() - make_interval(secs => g * 12)
FROM generate_series(1, 300) g
"""

LIMITS = """
INSERT INTO pgqueue.rate_limits (model, requests_per_minute, input_tokens_per_minute,
    output_tokens_per_minute, requests_available, input_tokens_available,
    output_tokens_available)
VALUES ('claude-haiku-4-5', 50, 40000, 8000, 20, 15000, 6000),
       ('claude-sonnet-4-5', 50, 40000, 8000, 0, 100, 10),
       ('claude-opus-4-1', 50, 30000, 8000, 45, 30000, 8000)
"""

TENANTS = """
INSERT INTO pgqueue.tenants (tenant_id, plan)
SELECT 't' || g, CASE WHEN g %% 10 = 0 THEN 'pro' ELSE 'free' END
FROM generate_series(0, %(tenants)s - 1) g
ON CONFLICT DO NOTHING
"""

PAGES = {
    "overview": "/",
    "overview (live part)": "/?fragment=1",
    "tenants": "/tenants",
    "schedule": "/schedule",
    "jobs": "/jobs",
    "jobs, failed of one tenant": "/jobs?state=failed&tenant=t3",
    "one job": "/jobs/{job_id}",
}


def build(server: str, db: str, *, finished: int, queued: int, tenants: int) -> str:
    """(Re)create database ``db`` with the jobs described in the module docstring."""
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
    dsn = make_conninfo(server, dbname=db)
    migrate.upgrade(dsn)
    steps = [
        ("tenants", TENANTS, {"tenants": tenants}),
        ("finished jobs", FINISHED, {"n": finished, "tenants": tenants}),
        ("queued jobs", QUEUED, {"n": queued, "tenants": tenants}),
        ("running jobs", RUNNING, {}),
        ("throttle events", THROTTLES, {}),
        ("limits", LIMITS, {}),
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, statement, params in steps:
            started = time.perf_counter()
            conn.execute(statement, params)
            print(f"built {name} in {time.perf_counter() - started:.1f} s", flush=True)
        conn.execute("VACUUM ANALYZE")
        total = conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()
    print(f"{total[0] if total else 0:,} jobs in pgqueue.jobs", flush=True)
    return dsn


def _get(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as answer:
        answer.read()
        assert answer.status == 200, (url, answer.status)
    return time.perf_counter() - started


def measure(dsn: str, requests: int) -> dict[str, Any]:
    """Per page: p50/p95/p99/max milliseconds over ``requests`` sequential GETs."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT max(id) FROM pgqueue.jobs WHERE state = 'failed'").fetchone()
    job_id = row[0] if row else 1
    results: dict[str, Any] = {}
    with running_dashboard(DashboardConfig(dsn=dsn, refresh_seconds=0)) as base:
        for name, path in PAGES.items():
            url = base + path.format(job_id=job_id)
            for _ in range(10):
                _get(url)
            samples = sorted(_get(url) * 1000 for _ in range(requests))
            q = statistics.quantiles(samples, n=100, method="inclusive")
            results[name] = {
                "path": path,
                "requests": requests,
                "p50_ms": round(q[49], 1),
                "p95_ms": round(q[94], 1),
                "p99_ms": round(q[98], 1),
                "max_ms": round(samples[-1], 1),
            }
            r = results[name]
            print(
                f"{name:28s} p50 {r['p50_ms']:7.1f} ms  p95 {r['p95_ms']:7.1f} ms  "
                f"p99 {r['p99_ms']:7.1f} ms  max {r['max_ms']:7.1f} ms",
                flush=True,
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", required=True, help="a server to create the database on")
    parser.add_argument("--db", default="pgqueue_bench_dashboard")
    parser.add_argument("--finished", type=int, default=950_000)
    parser.add_argument("--queued", type=int, default=50_000)
    parser.add_argument("--tenants", type=int, default=200)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--reuse", action="store_true", help="measure the database as it is")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.reuse:
        dsn = make_conninfo(args.dsn, dbname=args.db)
    else:
        dsn = build(
            args.dsn, args.db, finished=args.finished, queued=args.queued, tenants=args.tenants
        )
    with psycopg.connect(dsn) as conn:
        counts = dict(
            conn.execute(
                "SELECT state::text, count(*) FROM pgqueue.jobs GROUP BY state ORDER BY state"
            ).fetchall()
        )
        version = conn.execute("SHOW server_version").fetchone()
    load_before = os.getloadavg()
    results = measure(dsn, args.requests)
    load_after = os.getloadavg()
    if not args.keep:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.db))
            )
    report = {
        "jobs": counts,
        "total_jobs": sum(counts.values()),
        "tenants": args.tenants,
        "postgres": version[0] if version else None,
        "machine": f"{platform.machine()}, {platform.system()}, python {platform.python_version()}",
        "load_average_1m_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        "pages": results,
    }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=2)
            out.write("\n")


if __name__ == "__main__":
    main()
