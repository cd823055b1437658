"""Enqueue throughput with admission caps on versus off, same server. Not part of pytest.
(It also measured revision 0005, before admission control existed, until the baseline
revision replaced the old ones: bench/admission.json keeps that run.)

Each mode runs ``--procs`` producer processes, each enqueuing single jobs with the SQL
function ``pgqueue.enqueue`` (one transaction per job, the common case) into ``--tenants``
tenants for ``--seconds``. Modes are interleaved over ``--rounds`` so that machine noise hits
them alike; the median jobs/s per mode is reported. "caps on" sets a per-tier AND a
per-tenant cap high enough never to refuse, so every enqueue reads the counters (the cost
being measured).

    python bench/admission.py --dsn postgresql://root@127.0.0.1/postgres --procs 1,4 \
        --json bench/admission.json
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
from psycopg.types.json import Jsonb

import pgqueue
from pgqueue.db import migrate

PAYLOAD = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}


ENQUEUE = "SELECT pgqueue.enqueue(%(tenant)s, 'scheduled', %(payload)s, 60)"


def _producer(dsn: str, seconds: float, tenants: int, seed: int, out: Any) -> None:
    done = 0
    payload = Jsonb(PAYLOAD)
    try:
        with psycopg.connect(dsn) as conn:
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                conn.execute(ENQUEUE, {"tenant": f"t{(seed + done) % tenants}", "payload": payload})
                conn.commit()
                done += 1
    finally:
        out.put(done)


def _run(dsn: str, procs: int, seconds: float, tenants: int) -> float:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    workers = [
        ctx.Process(target=_producer, args=(dsn, seconds, tenants, i, out)) for i in range(procs)
    ]
    for w in workers:
        w.start()
    total = sum(out.get(timeout=seconds + 60) for _ in workers)
    for w in workers:
        w.join()
    return total / seconds


def _database(server: str) -> tuple[str, str]:
    name = f"pgqueue_bench_adm_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(server, dbname=name)
    migrate.upgrade(dsn)
    return name, dsn


def _reset(dsn: str, caps: bool | None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE pgqueue.jobs CASCADE")
        if caps is not None:
            pgqueue.set_admission(
                conn,
                "standard",
                max_queued=10**12 if caps else None,
                tenant_max_queued=10**12 if caps else None,
                policy="reject",
            )
        conn.execute("VACUUM ANALYZE pgqueue.jobs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--procs", default="1,4")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--json")
    args = parser.parse_args()

    head_name, head = _database(args.dsn)
    modes = {"caps off": (head, False), "caps on": (head, True)}
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for procs in [int(p) for p in args.procs.split(",")]:
            per_mode: dict[str, list[float]] = {m: [] for m in modes}
            for _ in range(args.rounds):
                for mode, (dsn, caps) in modes.items():
                    _reset(dsn, caps)
                    per_mode[mode].append(_run(dsn, procs, args.seconds, args.tenants))
            results[str(procs)] = per_mode
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(head_name))
            )
    summary: dict[str, Any] = {}
    print(f"{'procs':>5}  {'mode':<20} {'median jobs/s':>14}  runs")
    for procs, per_mode in results.items():
        medians = {m: statistics.median(v) for m, v in per_mode.items()}
        for mode, values in per_mode.items():
            runs = ", ".join(f"{v:.0f}" for v in values)
            print(f"{procs:>5}  {mode:<20} {medians[mode]:>14.0f}  {runs}")
        ratio = medians["caps on"] / medians["caps off"]
        print(f"{procs:>5}  caps on / caps off = {ratio:.2f}")
        summary[procs] = {
            "runs": per_mode,
            "median": medians,
            "caps_on_over_off": ratio,
        }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=2)


if __name__ == "__main__":
    main()
