"""Enqueue, priced in parts against pgqueuer (issue 8). Not part of pytest.

``pgqueue bench`` measures ``pgqueue.enqueue`` (one job per autocommit transaction) and
``pgqueue.enqueue_many`` (1,000 per call) against pgqueuer's ``Queries.enqueue``. This splits
pgqueue's figure into floors, each one statement per call (one job, or ``--batch`` jobs) in
autocommit on the same scratch database, the benchmark's jobs (payload, tenants and origins of
``pgqueue.bench.common._job``):

- ``pgqueue``: ``pgqueue.enqueue`` / ``enqueue_many`` (Python validation, then
  ``pgqueue.try_enqueue`` / ``try_enqueue_batch``: validation again, the demotion, admission and
  tenant lookups, the job rows, their DRR inbox rows and queued counters, NOTIFY);
- ``insert-triggers``: a bare ``INSERT`` of the same rows into ``pgqueue.jobs`` (its insert
  trigger keeps the books: inbox, counters, tenant check, NOTIFY);
- ``insert-row``: the same ``INSERT`` with triggers off (``session_replication_role =
  replica``): the rows, their three index entries and the CHECK constraints only;
- ``plain``: the ``bench_plain.jobs`` insert of ``pgqueue bench`` (a six-column table);
- ``pgqueuer``: ``Queries.enqueue`` (asyncpg when installed).

Systems alternate within each round (the order rotates every round); each sample is
``--calls`` jobs on one connection after a warm-up. Figures: jobs per second (medians) and
the backend's CPU per job (``/proc/<pid>/stat`` of the connection's server process, Linux
only; pgqueuer's connection is found by its ``application_name``).

    python bench/enqueue_floor.py --dsn postgresql://root@127.0.0.1/postgres --rounds 7
    python bench/enqueue_floor.py --dsn ... --calls 20000 --batch 1000 --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import pgqueue
from pgqueue.bench.common import (
    PAYLOAD,
    PAYLOAD_BYTES,
    PAYLOAD_JSON,
    PLAIN_INSERT,
    PLAIN_INSERT_MANY,
    Scratch,
    _job,
)

_TICKS = os.sysconf("SC_CLK_TCK")
_PEER_APP = "pgqueue-enqueue-floor-peer"

# The row pgqueue.try_enqueue writes for the benchmark's job (a pgqueue.noop kind: no model,
# no token estimate), its tier computed as the function would from origin and SLA.
_INSERT = """
INSERT INTO pgqueue.jobs (tenant_id, kind, origin, sla_seconds, priority, payload, cost)
VALUES (%(tenant_id)s, %(kind)s, %(origin)s::pgqueue.origin, %(sla_seconds)s::float8,
        CASE WHEN %(origin)s::pgqueue.origin = 'user_action' THEN 'critical'
             WHEN %(sla_seconds)s::float8 IS NULL OR %(sla_seconds)s::float8 >= 86400
                  THEN 'batch' ELSE 'standard' END::pgqueue.tier,
        %(payload)s, 1)
"""
_INSERT_MANY = """
INSERT INTO pgqueue.jobs (tenant_id, kind, origin, sla_seconds, priority, payload, cost)
SELECT i.tenant_id, 'pgqueue.noop', i.origin::pgqueue.origin, i.sla,
       CASE WHEN i.origin = 'user_action' THEN 'critical'
            WHEN i.sla IS NULL OR i.sla >= 86400 THEN 'batch' ELSE 'standard' END::pgqueue.tier,
       i.payload, 1
FROM ROWS FROM (unnest(%b::text[]), unnest(%b::text[]), jsonb_array_elements(%s::jsonb),
                unnest(%b::float8[])) AS i(tenant_id, origin, payload, sla)
"""


def backend_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of one server process, from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _psycopg_sample(
    dsn: str,
    units: list[Any],
    one: Callable[[psycopg.Connection[Any], Any], None],
    setup: str | None,
) -> tuple[float, float]:
    """``one(conn, unit)`` for every unit on one autocommit connection, after a warm-up:
    (units per second, the backend's CPU seconds per unit)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if setup:
            conn.execute(setup)
        for unit in units[:3]:  # warm-up: plans, tenant rows, prepared statements
            one(conn, unit)
        pid = conn.info.backend_pid
        cpu0, t0 = backend_cpu_seconds(pid), time.perf_counter()
        for unit in units:
            one(conn, unit)
        wall, cpu = time.perf_counter() - t0, backend_cpu_seconds(pid) - cpu0
    return len(units) / wall, cpu / len(units)


def _enqueue(conn: psycopg.Connection[Any], job: dict[str, Any]) -> None:
    pgqueue.enqueue(conn, **job)


def _enqueue_many(conn: psycopg.Connection[Any], specs: list[pgqueue.JobSpec]) -> None:
    pgqueue.enqueue_many(conn, specs)


def _insert(conn: psycopg.Connection[Any], job: dict[str, Any]) -> None:
    conn.execute(_INSERT, {**job, "payload": Jsonb(job["payload"])}, prepare=True)


def _insert_many(conn: psycopg.Connection[Any], jobs: list[dict[str, Any]]) -> None:
    conn.execute(
        _INSERT_MANY,
        (
            [j["tenant_id"] for j in jobs],
            [j["origin"] for j in jobs],
            json.dumps([j["payload"] for j in jobs]),
            [j["sla_seconds"] for j in jobs],
        ),
    )


def _plain(conn: psycopg.Connection[Any], job: dict[str, Any]) -> None:
    conn.execute(PLAIN_INSERT, (job["tenant_id"], Jsonb(PAYLOAD)), prepare=True)


def _plain_many(conn: psycopg.Connection[Any], jobs: list[dict[str, Any]]) -> None:
    conn.execute(PLAIN_INSERT_MANY, ([j["tenant_id"] for j in jobs], [PAYLOAD_JSON] * len(jobs)))


async def _pgqueuer_sample(dsn: str, units: int, batch: int) -> tuple[float, float]:
    from pgqueue.bench.common import _pgqueuer_queries

    queries, close = await _pgqueuer_queries(dsn)

    async def one() -> None:
        if batch == 1:
            await queries.enqueue("noop", PAYLOAD_BYTES, 0)
        else:
            await queries.enqueue(["noop"] * batch, [PAYLOAD_BYTES] * batch, [0] * batch)

    try:
        await queries.driver.execute(f"SET application_name = '{_PEER_APP}'")
        for _ in range(3):
            await one()
        with psycopg.connect(dsn, autocommit=True) as probe:
            row = probe.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (_PEER_APP,)
            ).fetchone()
        assert row is not None, "pgqueuer's connection not found in pg_stat_activity"
        pid = int(row[0])
        cpu0, t0 = backend_cpu_seconds(pid), time.perf_counter()
        for _ in range(units):
            await one()
        wall, cpu = time.perf_counter() - t0, backend_cpu_seconds(pid) - cpu0
        return units / wall, cpu / units
    finally:
        await close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dsn", required=True, help="server DSN (a scratch database goes there)")
    parser.add_argument("--calls", type=int, default=2000, help="jobs per sample")
    parser.add_argument("--batch", type=int, default=1, help="jobs per call (1: single enqueue)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    batch, jobs = args.batch, [_job(i, args.tenants) for i in range(args.calls)]
    units = args.calls // batch
    chunks = [jobs[k * batch : (k + 1) * batch] for k in range(units)]
    replica = "SET session_replication_role = replica"
    samplers: dict[str, Callable[[str], tuple[float, float]]]
    if batch == 1:
        samplers = {
            "pgqueue": lambda d: _psycopg_sample(d, jobs, _enqueue, None),
            "insert-triggers": lambda d: _psycopg_sample(d, jobs, _insert, None),
            "insert-row": lambda d: _psycopg_sample(d, jobs, _insert, replica),
            "plain": lambda d: _psycopg_sample(d, jobs, _plain, None),
        }
    else:
        specs = [[pgqueue.JobSpec(**j) for j in chunk] for chunk in chunks]
        samplers = {
            "pgqueue": lambda d: _psycopg_sample(d, specs, _enqueue_many, None),
            "insert-triggers": lambda d: _psycopg_sample(d, chunks, _insert_many, None),
            "insert-row": lambda d: _psycopg_sample(d, chunks, _insert_many, replica),
            "plain": lambda d: _psycopg_sample(d, chunks, _plain_many, None),
        }
    samplers["pgqueuer"] = lambda d: asyncio.run(_pgqueuer_sample(d, units, batch))
    names = list(samplers)
    samples: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    scratch = Scratch(args.dsn, "pgqueuer")
    scratch.create_template()
    try:
        with scratch.clone() as dsn:
            for r in range(args.rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    samples[name].append(samplers[name](dsn))
    finally:
        scratch.close()
    peer_rate = statistics.median(s[0] for s in samples["pgqueuer"])
    print(
        f"batch {batch}: {'system':16s} {'jobs/s':>9s} {'vs pgqueuer':>11s} {'server us/job':>14s}"
    )
    for name in names:
        rate = statistics.median(s[0] for s in samples[name]) * batch
        cpu = statistics.median(s[1] for s in samples[name]) / batch
        print(
            f"         {name:16s} {rate:9,.0f} {rate / peer_rate / batch:10.2f}x {cpu * 1e6:14.1f}"
        )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(
                {"jobs": args.calls, "batch": batch, "rounds": args.rounds, "samples": samples},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
