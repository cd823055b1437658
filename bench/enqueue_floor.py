"""Enqueue, priced in parts against pgqueuer (issue 8). Not part of pytest.

``pgqueue bench`` measures ``pgqueue.enqueue`` (one job per autocommit transaction) and
``pgqueue.enqueue_many`` (1,000 per call) against pgqueuer's ``Queries.enqueue``. This splits
pgqueue's figure into floors, each one statement per call (one job, or ``--batch`` jobs) in
autocommit on the same scratch database, the benchmark's jobs (payload, tenants and origins of
``pgqueue.bench.common._job``):

- ``pgqueue``: ``pgqueue.enqueue`` / ``enqueue_many`` (Python validation, then
  ``pgqueue.try_enqueue`` / ``try_enqueue_batch``: validation again, the demotion, admission and
  tenant lookups, the job rows and their queued counters, NOTIFY);
- ``insert-triggers``: a bare ``INSERT`` of the same rows into ``pgqueue.jobs`` (its insert
  trigger keeps the books: counters, tenant check, NOTIFY);
- ``insert-row``: the same ``INSERT`` with triggers off (``session_replication_role =
  replica``): the rows, their index entries and the CHECK constraints only;
- ``plain``: the ``bench_plain.jobs`` insert of ``pgqueue bench`` (a six-column table);
- ``pgqueuer``: ``Queries.enqueue`` (asyncpg when installed).

Systems alternate within each round (the order rotates every round); each sample is
``--calls`` jobs on one connection after a warm-up. Figures: jobs per second (medians) and
the backend's CPU per job (``/proc/<pid>/schedstat`` of the connection's server process, in
nanoseconds; Linux only). The insert floors write the same column values as pgqueue
(model, token estimate, max_tokens, cost computed by this script), so they price the rows
without the server's estimate.

    python bench/enqueue_floor.py --dsn postgresql://root@127.0.0.1/postgres --rounds 7
    python bench/enqueue_floor.py --dsn ... --calls 20000 --batch 1000 --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
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

# The rows pgqueue.try_enqueue writes for the benchmark's jobs, tier and all, with the values
# that depend on the payload (model, token estimate, max_tokens, cost) computed here by
# estimate() rather than by the server: the floors price the row, not the estimate.
_INSERT = """
INSERT INTO pgqueue.jobs (tenant_id, kind, origin, sla_seconds, priority, payload, model,
                          est_input_tokens, max_output_tokens, cost)
VALUES (%(tenant_id)s, %(kind)s, %(origin)s::pgqueue.origin, %(sla_seconds)s::float8,
        CASE WHEN %(origin)s::pgqueue.origin = 'user_action' THEN 'critical'
             WHEN %(sla_seconds)s::float8 IS NULL OR %(sla_seconds)s::float8 >= 86400
                  THEN 'batch' ELSE 'standard' END::pgqueue.tier,
        %(payload)s, %(model)s, %(est)s, %(max_tokens)s, %(cost)s)
"""
_INSERT_MANY = """
INSERT INTO pgqueue.jobs (tenant_id, kind, origin, sla_seconds, priority, payload, model,
                          est_input_tokens, max_output_tokens, cost)
SELECT i.tenant_id, i.kind, i.origin::pgqueue.origin, i.sla,
       CASE WHEN i.origin = 'user_action' THEN 'critical'
            WHEN i.sla IS NULL OR i.sla >= 86400 THEN 'batch' ELSE 'standard' END::pgqueue.tier,
       i.payload, i.model, i.est, i.max_tokens, i.cost
FROM ROWS FROM (unnest(%b::text[]), unnest(%b::text[]), jsonb_array_elements(%s::jsonb),
                unnest(%b::float8[]), unnest(%b::text[]), unnest(%b::text[]),
                unnest(%b::int4[]), unnest(%b::int4[]), unnest(%b::float8[]))
     AS i(tenant_id, origin, payload, sla, kind, model, est, max_tokens, cost)
"""


def estimate(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload-derived columns pgqueue stores for a Messages payload whose message
    contents are strings (the benchmark's): model, estimated input tokens (ceil(characters /
    4), revision 0001's rule), max_tokens and the cost (max(1, tokens / 1000))."""
    chars = len(payload.get("system") or "") + sum(
        len(m["content"]) for m in payload["messages"] if isinstance(m.get("content"), str)
    )
    est = math.ceil(chars / 4)
    return {
        "model": payload["model"],
        "est": est,
        "max_tokens": int(payload["max_tokens"]),
        "cost": max(1.0, est / 1000),
    }


def backend_cpu_seconds(pid: int) -> float:
    """CPU seconds of one server process, from ``/proc/<pid>/schedstat`` (its first field:
    nanoseconds on a CPU; ``/proc/<pid>/stat`` counts 10 ms ticks, too coarse here)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


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
    row = {**job, **estimate(job["payload"]), "payload": Jsonb(job["payload"])}
    conn.execute(_INSERT, row, prepare=True)


def _insert_many(conn: psycopg.Connection[Any], jobs: list[dict[str, Any]]) -> None:
    derived = [estimate(j["payload"]) for j in jobs]
    conn.execute(
        _INSERT_MANY,
        (
            [j["tenant_id"] for j in jobs],
            [j["origin"] for j in jobs],
            json.dumps([j["payload"] for j in jobs]),
            [j["sla_seconds"] for j in jobs],
            [j["kind"] for j in jobs],
            [d["model"] for d in derived],
            [d["est"] for d in derived],
            [d["max_tokens"] for d in derived],
            [d["cost"] for d in derived],
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
        for _ in range(3):
            await one()
        rows = await queries.driver.fetch("SELECT pg_backend_pid() AS pid")
        pid = int(rows[0]["pid"])
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
