"""Measure the scheduler v2 prototype (bench/scheduler_v2/scheduler.sql) in a scratch database.

    python bench/scheduler_v2/measure.py --dsn postgresql://root@127.0.0.1:5432/postgres agree
    python bench/scheduler_v2/measure.py --dsn ... scale

`agree`: random cases, the same inputs to the SQL prototype, to KeyedDrr and to the classic
DrrScheduler; counts the cases whose claimed order agrees. `scale`: claim and fold times at
10,000 queued / 10 tenants and at 1,000,000 / 10,000, EXPLAIN (ANALYZE, BUFFERS) of the claim,
and one tenant enqueuing 1,000,000 jobs before another's one. One line per phase. The scratch
database (`sched_v2_scratch`) is created and dropped here.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from pgqueue.scheduling.drr import DrrScheduler
from pgqueue.scheduling.keys import KeyedDrr

SQL = Path(__file__).with_name("scheduler.sql")
SCRATCH = "sched_v2_scratch"
CLAIM = """
WITH picked AS (
    SELECT j.id FROM sched.jobs j
    WHERE j.lane = 'm' AND j.tier = 0 AND j.state = 'queued' AND j.key_round IS NOT NULL
    ORDER BY j.key_round, j.key_place, j.key_seq LIMIT 10 FOR UPDATE SKIP LOCKED)
UPDATE sched.jobs j SET state = 'running' FROM picked WHERE j.id = picked.id RETURNING j.id
"""


def scratch(dsn: str, name: str = SCRATCH) -> str:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {name}")
    target = make_conninfo(dsn, dbname=name)
    with psycopg.connect(target) as c:
        c.execute(SQL.read_text())
    return target


def vacuum(target: str) -> None:
    with psycopg.connect(target, autocommit=True) as c:
        c.execute("VACUUM ANALYZE sched.jobs")


def drop(dsn: str, name: str = SCRATCH) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def reset(c: psycopg.Connection[Any], quanta: dict[str, int]) -> None:
    c.execute("TRUNCATE sched.jobs, sched.flows, sched.lane_tiers, sched.cursors, sched.tenants")
    c.execute(
        "INSERT INTO sched.tenants SELECT * FROM unnest(%s::text[], %s::bigint[])",
        (list(quanta), list(quanta.values())),
    )


def one_case(c: psycopg.Connection[Any], rng: random.Random) -> tuple[bool, bool]:
    """(SQL == keyed, keyed == classic) on one random case."""
    tenants = list("abcdefg")[: rng.randint(2, 7)]
    quanta = {t: rng.choice([1000, 2000, 3000, 5000, 7500]) for t in tenants}
    horizon = rng.choice([0, 1, 4, 50])
    batch = rng.choice([1, 3, 10])
    reset(c, quanta)
    keyed = KeyedDrr(quanta.__getitem__, horizon_rounds=horizon)
    classic = DrrScheduler(lambda t: float(quanta[t]))
    sql_out: list[int] = []
    keyed_out: list[int] = []
    classic_out: list[int] = []
    for phase in range(rng.randint(1, 4) + 1):
        last = phase > 0 and rng.random() < 0.3
        jobs = (
            []
            if last
            else [
                (rng.choice(tenants), rng.choice([1000, 1000, 2500, rng.randint(1000, 9000)]))
                for _ in range(rng.randint(0, 20))
            ]
        )
        if jobs:
            ids = [
                r[0]
                for r in c.execute(
                    "INSERT INTO sched.jobs (lane, tier, tenant_id, cost)"
                    " SELECT 'm', 0, t, k FROM unnest(%s::text[], %s::bigint[])"
                    " WITH ORDINALITY u(t, k, o) ORDER BY o RETURNING id",
                    ([t for t, _ in jobs], [k for _, k in jobs]),
                )
            ]
            for (tenant, cost), job_id in zip(jobs, sorted(ids), strict=True):
                keyed.enqueue(tenant, job_id, cost)
                classic.enqueue(tenant, job_id, float(cost))
        want = 10_000 if last else rng.randint(0, 25)
        taken = 0
        while taken < want:
            got = [
                r[0]
                for r in c.execute(
                    "SELECT id FROM sched.claim('m', 0::smallint, %s, 'w', %s)",
                    (min(batch, want - taken), horizon),
                )
            ]
            if not got:
                break
            taken += len(got)
            sql_out.extend(got)
        for _ in range(taken):
            k, d = keyed.next(), classic.next()
            keyed_out.append(k.job_id if k else -1)
            classic_out.append(d[1] if d else -1)
        if last:
            break
    return sql_out == keyed_out, keyed_out == classic_out


def agree(dsn: str, cases: int, seed: int) -> None:
    target = scratch(dsn)
    rng = random.Random(seed)
    sql_ok = classic_ok = 0
    with psycopg.connect(target, autocommit=True) as c:
        for _ in range(cases):
            a, b = one_case(c, rng)
            sql_ok += a
            classic_ok += b
    print(
        f"agree: {cases} cases, SQL = KeyedDrr in {sql_ok}, KeyedDrr = DrrScheduler in {classic_ok}"
    )
    drop(dsn)


def _timed_ms(c: psycopg.Connection[Any], statement: str, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        c.execute(statement)
        c.commit()
        times.append((time.perf_counter() - start) * 1000)
    return times


def build(dsn: str, name: str, queued: int, tenants: int, horizon: int) -> str:
    """A scratch database with ``queued`` jobs over ``tenants``, folded once (timed)."""
    target = scratch(dsn, name)
    with psycopg.connect(target) as c:
        start = time.perf_counter()
        c.execute(
            "INSERT INTO sched.jobs (lane, tier, tenant_id, cost) SELECT 'm', 0,"
            " 't' || (g %% %s), 1000 + (hashint4(g) & 3) * 1000 FROM generate_series(1, %s) g",
            (tenants, queued),
        )
        c.commit()
        built = time.perf_counter() - start
        vacuum(target)
        start = time.perf_counter()
        row = c.execute("SELECT sched.fold('m', 0::smallint, %s)", (horizon,)).fetchone()
        c.commit()
        fold_ms = (time.perf_counter() - start) * 1000
        vacuum(target)
        idle = statistics.median(_timed_ms(c, f"SELECT sched.fold('m', 0::smallint, {horizon})", 5))
    print(
        f"scale {queued}/{tenants}: built in {built:.1f} s, first fold {fold_ms:.0f} ms"
        f" for {row[0] if row else 0} jobs, a fold with nothing new {idle:.1f} ms"
    )
    return target


def scale(dsn: str) -> None:
    """Claim times at 10k/10 and 1M/10k, interleaved (the box is shared), then EXPLAIN."""
    small = build(dsn, "sched_v2_small", 10_000, 10, 1000)
    large = build(dsn, "sched_v2_large", 1_000_000, 10_000, 4)
    times: dict[tuple[str, int], list[float]] = {}
    with psycopg.connect(small) as cs, psycopg.connect(large) as cl:
        for _ in range(10):
            for label, c in (("10k/10", cs), ("1M/10k", cl)):
                for n in (1, 10):
                    statement = f"SELECT id FROM sched.claim('m', 0::smallint, {n}, 'w', 4, false)"
                    times.setdefault((label, n), []).extend(_timed_ms(c, statement, 10))
        for label, c in (("10k/10", cs), ("1M/10k", cl)):
            plan = c.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + CLAIM).fetchall()
            c.rollback()
            print(f"EXPLAIN of the claim statement at {label}:")
            print("\n".join("    " + r[0] for r in plan))
    for n in (1, 10):
        a = statistics.median(times[("10k/10", n)])
        b = statistics.median(times[("1M/10k", n)])
        print(
            f"claim({n}) + commit, median of 100: 10k/10 {a:.2f} ms, 1M/10k {b:.2f} ms,"
            f" ratio {b / a:.2f}"
        )
    drop(dsn, "sched_v2_small")
    drop(dsn, "sched_v2_large")


def big_tenant(dsn: str) -> None:
    """One tenant enqueues 1,000,000 jobs at once, then another tenant one job."""
    target = scratch(dsn)
    with psycopg.connect(target) as c:
        c.execute(
            "INSERT INTO sched.jobs (lane, tier, tenant_id, cost)"
            " SELECT 'm', 0, 'big', 1000 FROM generate_series(1, 1000000)"
        )
        c.commit()
        vacuum(target)
        c.execute("SELECT id FROM sched.claim('m', 0::smallint, 10)").fetchall()
        c.commit()
        c.execute(
            "INSERT INTO sched.jobs (lane, tier, tenant_id, cost) VALUES ('m', 0, 'small', 1000)"
        )
        c.commit()
        start = time.perf_counter()
        rows = c.execute("SELECT tenant_id FROM sched.claim('m', 0::smallint, 10)").fetchall()
        c.commit()
        ms = (time.perf_counter() - start) * 1000
        place = [r[0] for r in rows].index("small") if ("small",) in rows else -1
        print(
            f"big tenant: the claim after the small job arrived took {ms:.1f} ms; "
            f"the small job was its job #{place + 1}"
        )
    drop(dsn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", required=True)
    sub = parser.add_subparsers(dest="what", required=True)
    a = sub.add_parser("agree")
    a.add_argument("--cases", type=int, default=1000)
    a.add_argument("--seed", type=int, default=28)
    sub.add_parser("scale")
    args = parser.parse_args()
    if args.what == "agree":
        agree(args.dsn, args.cases, args.seed)
    else:
        scale(args.dsn)
        big_tenant(args.dsn)


if __name__ == "__main__":
    main()
