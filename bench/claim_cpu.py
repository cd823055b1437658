"""Postgres CPU per job of the claim and the completion, pgqueue vs pgqueuer (issue 28, speed).
Not part of pytest.

Each system drains the same no-op jobs through one connection, as a worker would, with
nothing else in the loop: pgqueue's ``job_claim`` (claims of ``--batch``) then
``job_complete_many`` for what it took; pgqueuer's ``dequeue`` (batch ``--batch``) then
``log_jobs``. What is counted is the CPU of that connection's backend alone (utime + stime of
``/proc/<pid>/stat``, fields 14-15), so other sessions on a shared server do not count, and
wall-clock jobs/s beside it. pgqueue's CPU is split between the claim and the completion.

Databases: one template per system (pgqueue migrated, or pgqueuer installed; the jobs
enqueued; VACUUM ANALYZE), a fresh copy for each drain. Systems alternate, the order reversed
every other repeat. Linux only; the server must run on this host.

    python bench/claim_cpu.py --dsn postgresql://root@127.0.0.1/postgres \\
        --jobs 4000 --tenants 10 --repeats 4 --out bench/claim_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgqueue
from pgqueue.bench.common import PAYLOAD_BYTES, _job, _pgqueuer_install
from pgqueue.db import migrate
from pgqueue.db.queries import run
from pgqueue.worker.completer import success_batch

_TICKS = os.sysconf("SC_CLK_TCK")
_CLAIM = {"worker_id": "bench", "lease_seconds": 60, "skip_kinds": []}


def backend_cpu_seconds(pid: int) -> float:
    """utime + stime of backend ``pid`` in seconds (clock ticks of ``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _dsn(server: str, dbname: str) -> str:
    return make_conninfo(**{**conninfo_to_dict(server), "dbname": dbname})


def _recreate(server: str, name: str, template: str | None = None) -> str:
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return _dsn(server, name)


def build(server: str, prefix: str, jobs: int, tenants: int) -> None:
    """The two template databases, ``<prefix>_pgqueue_tpl`` and ``<prefix>_pgqueuer_tpl``."""
    dsn = _recreate(server, f"{prefix}_pgqueue_tpl")
    migrate.upgrade(dsn)
    with psycopg.connect(dsn) as conn:
        specs = [pgqueue.JobSpec(**_job(i, tenants)) for i in range(jobs)]
        for start in range(0, jobs, 1000):
            pgqueue.enqueue_many(conn, specs[start : start + 1000])
        conn.commit()
    peer = _recreate(server, f"{prefix}_pgqueuer_tpl")

    async def fill() -> None:
        await _pgqueuer_install(peer)
        from pgqueuer import Queries

        aconn = await psycopg.AsyncConnection.connect(peer, autocommit=True)
        try:
            queries = Queries.from_psycopg_connection(aconn)
            for start in range(0, jobs, 1000):
                size = min(1000, jobs - start)
                await queries.enqueue(["noop"] * size, [PAYLOAD_BYTES] * size, [0] * size)
        finally:
            await aconn.close()

    asyncio.run(fill())
    for target in (dsn, peer):
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")


_PGQUEUE_LEFT = "SELECT EXISTS (SELECT FROM pgqueue.jobs j WHERE j.state = 'queued')"
_PGQUEUER_LEFT = "SELECT EXISTS (SELECT FROM pgqueuer q WHERE q.status = 'queued')"


def _queued(conn: psycopg.Connection[Any], query: str) -> bool:
    row = conn.execute(query).fetchone()
    return bool(row and row[0])


async def _aqueued(conn: psycopg.AsyncConnection[Any], query: str) -> bool:
    row = await (await conn.execute(query)).fetchone()
    return bool(row and row[0])


def drain_pgqueue(
    dsn: str,
    batch: int,
    shared: bool = False,
    warm: int = 0,
    warm_sql: str | None = None,
) -> dict[str, float]:
    """Claim ``batch`` at a time and complete them until the queue is empty.

    ``shared``: other drains take from the same queue at once, so an empty claim ends the
    drain only when no job is left queued (else it claims again 10 ms later): a claim comes
    back empty while another connection folds a lane, or holds the last jobs. ``warm``: after
    that many claims that took jobs (and their completions), ``warm_sql`` runs on the
    connection and the counts start again from zero (the session's first plans left out)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pid = conn.info.backend_pid
        run(conn, "job_claim", {"limit": 0, **_CLAIM})  # plans and caches warm
        claim = complete = 0.0
        done = claims = 0
        started = time.perf_counter()
        while True:
            before = backend_cpu_seconds(pid)
            rows = run(conn, "job_claim", {"limit": batch, **_CLAIM})
            rows = [r for r in rows if r["id"] is not None]
            claims += 1
            between = backend_cpu_seconds(pid)
            if not rows and shared and _queued(conn, _PGQUEUE_LEFT):
                time.sleep(0.01)
                continue
            if not rows:
                break
            batch_rows = (
                (r["id"], r["tenant_id"], r["lease_token"], None, None, None) for r in rows
            )
            run(conn, "job_complete_many", success_batch(batch_rows))
            claim += between - before
            complete += backend_cpu_seconds(pid) - between
            done += len(rows)
            warm -= 1
            if warm == 0 and warm_sql is not None:
                conn.execute(warm_sql)
                claim = complete = 0.0
                done = claims = 0
                started = time.perf_counter()
        wall = time.perf_counter() - started
    return {
        "jobs": done,
        "cpu": claim + complete,
        "claim": claim,
        "complete": complete,
        "wall": wall,
        "pid": pid,
        "claims": claims,
    }


def drain_pgqueuer(
    dsn: str,
    batch: int,
    shared: bool = False,
    warm: int = 0,
    warm_sql: str | None = None,
) -> dict[str, float]:
    """pgqueuer's dequeue of ``batch`` and log_jobs until the queue is empty (``shared``,
    ``warm``, ``warm_sql``: as in drain_pgqueue)."""
    from pgqueuer import Queries
    from pgqueuer.queries import EntrypointExecutionParameter

    async def go() -> dict[str, float]:
        aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        try:
            queries = Queries.from_psycopg_connection(aconn)
            pid = aconn.info.backend_pid
            entrypoints = {"noop": EntrypointExecutionParameter(concurrency_limit=0)}
            manager = uuid.uuid4()
            before, started, done = backend_cpu_seconds(pid), time.perf_counter(), 0
            claims = batches = 0
            while True:
                jobs = await queries.dequeue(
                    batch, entrypoints, manager, None, timedelta(seconds=30)
                )
                claims += 1
                if not jobs and shared and await _aqueued(aconn, _PGQUEUER_LEFT):
                    await asyncio.sleep(0.01)
                    continue
                if not jobs:
                    break
                await queries.log_jobs([(job, "successful", None) for job in jobs])
                done += len(jobs)
                batches += 1
                if batches == warm and warm_sql is not None:
                    await aconn.execute(warm_sql)
                    before, started, done = backend_cpu_seconds(pid), time.perf_counter(), 0
                    claims = 0
            cpu, wall = backend_cpu_seconds(pid) - before, time.perf_counter() - started
        finally:
            await aconn.close()
        return {"jobs": done, "cpu": cpu, "wall": wall, "pid": pid, "claims": claims}

    return asyncio.run(go())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dsn", required=True, help="a database on the server (scratch ones are made)"
    )
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    prefix = f"claimcpu_{uuid.uuid4().hex[:6]}"
    drains = {"pgqueue": drain_pgqueue, "pgqueuer": drain_pgqueuer}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in drains}
    try:
        print(f"building {args.jobs} jobs x 2 systems", flush=True)
        build(args.dsn, prefix, args.jobs, args.tenants)
        for repeat in range(args.repeats):
            order = list(drains) if repeat % 2 == 0 else list(reversed(drains))
            for name in order:
                dsn = _recreate(args.dsn, f"{prefix}_{name}", f"{prefix}_{name}_tpl")
                result = drains[name](dsn, args.batch)
                runs[name].append(result)
                print(
                    f"repeat {repeat + 1} {name:8}: {result['cpu'] / result['jobs'] * 1e6:6.1f} us "
                    f"Postgres CPU per job, {result['jobs'] / result['wall']:6.0f} jobs/s",
                    flush=True,
                )
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            for name in drains:
                for suffix in ("", "_tpl"):
                    conn.execute(f'DROP DATABASE IF EXISTS "{prefix}_{name}{suffix}"')

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] / r["jobs"] for r in runs[name])

    summary: dict[str, Any] = {
        "cpu_us_per_job": {n: round(median(n, "cpu") * 1e6, 1) for n in drains},
        "pgqueue_claim_us_per_job": round(median("pgqueue", "claim") * 1e6, 1),
        "pgqueue_complete_us_per_job": round(median("pgqueue", "complete") * 1e6, 1),
        "jobs_per_second": {
            n: round(statistics.median(r["jobs"] / r["wall"] for r in runs[n])) for n in drains
        },
    }
    summary["cpu_ratio"] = round(median("pgqueue", "cpu") / median("pgqueuer", "cpu"), 2)
    summary["speed_ratio"] = round(
        summary["jobs_per_second"]["pgqueue"] / summary["jobs_per_second"]["pgqueuer"], 2
    )
    print(json.dumps(summary, indent=2))
    if args.out is not None:
        args.out.write_text(
            json.dumps(
                {"options": vars(args) | {"out": str(args.out)}, "summary": summary, "runs": runs},
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
