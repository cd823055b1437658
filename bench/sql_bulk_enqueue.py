"""Bulk enqueue from SQL: ``SELECT pgqueue.enqueue(...) FROM generate_series(1, n)`` (one call,
so one INSERT statement and one counter update, per row, all in one transaction) versus one
``pgqueue.enqueue_many`` call with the same n jobs, interleaved at each size (per-row, bulk,
per-row, bulk, ...), on a fresh database of its own. Rows/s, medians of ``--repeats``; prints a
table and writes JSON. Not part of pytest.

The per-row path is quadratic: every call updates the same queued-counter rows (the tier's
total and the tenant's) again in the caller's transaction, and no version that the transaction
itself superseded can be pruned before it ends, so each call steps over all the versions the
earlier calls left (README, "Many jobs from SQL").

    python bench/sql_bulk_enqueue.py --dsn postgresql://root@127.0.0.1/postgres \
        --sizes 1000,10000,50000 --repeats 1 --json bench/sql_bulk_enqueue.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgqueue.db import migrate

PAYLOAD = json.dumps(
    {"model": "claude-haiku-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
)
PER_ROW = (
    "SELECT count(pgqueue.enqueue('t' || (g %% 10), 'scheduled', %(p)s::jsonb))"
    " FROM generate_series(1, %(n)s) g"
)
BULK = (
    "WITH b AS (SELECT array_agg('t' || (g %% 10)) AS tenants,"
    " array_agg('scheduled'::text) AS origins, array_agg(%(p)s::jsonb) AS payloads"
    " FROM generate_series(1, %(n)s) g)"
    " SELECT count(*) FROM b, pgqueue.enqueue_many(b.tenants, b.origins, b.payloads)"
)


def _reset(conn: psycopg.Connection[Any]) -> None:
    conn.execute("TRUNCATE pgqueue.jobs, pgqueue.queue_counts")
    conn.execute("VACUUM ANALYZE pgqueue.queue_counts")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True, help="a server's DSN (a database is created)")
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", default=None)
    parser.add_argument("--db-prefix", default="bench_bulk", help="of the scratch database")
    args = parser.parse_args()
    name = f"{args.db_prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(args.dsn, dbname=name)
    samples: dict[str, dict[str, list[float]]] = {}
    try:
        migrate.upgrade(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO pgqueue.tenants (tenant_id)"
                " SELECT 't' || g FROM generate_series(0, 9) g"
            )
            for n in (int(s) for s in args.sizes.split(",")):
                got = samples.setdefault(str(n), {"per_row": [], "enqueue_many": []})
                for _ in range(args.repeats):
                    for mode, query in (("per_row", PER_ROW), ("enqueue_many", BULK)):
                        _reset(conn)
                        started = time.perf_counter()
                        conn.execute(query, {"p": PAYLOAD, "n": n})
                        got[mode].append(n / (time.perf_counter() - started))
                print(
                    f"n={n:>7}  per-row enqueue {statistics.median(got['per_row']):>9.0f} rows/s"
                    f"  enqueue_many {statistics.median(got['enqueue_many']):>9.0f} rows/s",
                    flush=True,
                )
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"rows_per_second": samples}, out, indent=1)


if __name__ == "__main__":
    main()
