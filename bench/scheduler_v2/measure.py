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


def scratch(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {SCRATCH} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {SCRATCH}")
    target = make_conninfo(dsn, dbname=SCRATCH)
    with psycopg.connect(target) as c:
        c.execute(SQL.read_text())
    return target


def drop(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {SCRATCH} WITH (FORCE)")


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


def _median_ms(c: psycopg.Connection[Any], statement: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        c.execute(statement)
        c.commit()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def scale_one(dsn: str, queued: int, tenants: int, horizon: int) -> dict[str, float]:
    target = scratch(dsn)
    out: dict[str, float] = {}
    with psycopg.connect(target) as c:
        start = time.perf_counter()
        c.execute(
            "INSERT INTO sched.jobs (lane, tier, tenant_id, cost) SELECT 'm', 0,"
            " 't' || (g %% %s), 1000 + (hashint4(g) & 3) * 1000 FROM generate_series(1, %s) g",
            (tenants, queued),
        )
        c.commit()
        c.execute("VACUUM ANALYZE sched.jobs")
        print(f"scale {queued}/{tenants}: built in {time.perf_counter() - start:.1f} s")
        start = time.perf_counter()
        stamped = c.execute("SELECT sched.fold('m', 0::smallint, %s)", (horizon,)).fetchone()
        c.commit()
        out["first_fold_ms"] = (time.perf_counter() - start) * 1000
        out["first_fold_rows"] = float(stamped[0] if stamped else 0)
        c.execute("VACUUM ANALYZE sched.jobs")
        out["claim10_ms"] = _median_ms(
            c, "SELECT id FROM sched.claim('m', 0::smallint, 10, 'w', 4, false)", 200
        )
        out["claim1_ms"] = _median_ms(
            c, "SELECT id FROM sched.claim('m', 0::smallint, 1, 'w', 4, false)", 200
        )
        out["idle_fold_ms"] = _median_ms(c, f"SELECT sched.fold('m', 0::smallint, {horizon})", 5)
        plan = c.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + CLAIM).fetchall()
        c.rollback()
        print("\n".join("    " + r[0] for r in plan))
        out["explain_ms"] = float(plan[-1][0].split()[2])
    print(f"scale {queued}/{tenants}: " + ", ".join(f"{k} {v:.2f}" for k, v in out.items()))
    drop(dsn)
    return out


def big_tenant(dsn: str) -> None:
    """One tenant enqueues 1,000,000 jobs at once, then another tenant one job."""
    target = scratch(dsn)
    with psycopg.connect(target) as c:
        c.execute(
            "INSERT INTO sched.jobs (lane, tier, tenant_id, cost)"
            " SELECT 'm', 0, 'big', 1000 FROM generate_series(1, 1000000)"
        )
        c.commit()
        c.execute("VACUUM ANALYZE sched.jobs")
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
        small = scale_one(args.dsn, 10_000, 10, 1000)
        large = scale_one(args.dsn, 1_000_000, 10_000, 10)
        for key in ("claim1_ms", "claim10_ms", "explain_ms"):
            print(f"ratio {key}: {large[key] / small[key]:.2f}")
        big_tenant(args.dsn)


if __name__ == "__main__":
    main()
