"""A claim over quanta far below the jobs' costs, revision 0027 against revision 0028.

Revision 0028 takes the turns that end without serving in memory; revision 0027 took each in
a statement of its own. Two databases on the same server, one at each revision, get the same
tenants, quanta and jobs (``--seed``); then, per repeat, each runs the same claim of
``--claim`` jobs (each revision first in every other repeat; the data rebuilt before each
claim, and each claim timed in a session that ran it once already and rolled it back). It
reports the median wall time of the claim, the ratio, the statements each claim ran (counted
with ``auto_explain``, nested statements, in a run of its own), and whether both claims took
the same jobs in the same order and left the same deficits, positions, rounds and turns.

Cases (``--cases``) are shape:tenants. Four shapes: ``tiny`` (quanta uniform in 0.001–1, 10
jobs per tenant and tier of costs log-uniform in 1,000–1,000,000 cost units, three tiers) and
``normal`` (quantum 5, 40 jobs per tenant and tier of cost 1: the usual claim, which revision
0028 must leave as it was); and ``mixed`` (one tier, 10 jobs per tenant; in round order two
tenants like ``tiny``'s with one cost each, then one of quantum 1 and cost 1: the third pair of
a dispatch pays, so reading many pairs at once would be waste); ``alternate``, the same with
every second pair paying. Not part of pytest.

    python bench/idle_turns.py --dsn postgresql://root@127.0.0.1/postgres \
        --cases tiny:30,tiny:300,normal:1000 --claim 100 --repeats 3 --json bench/idle_turns.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgqueue.db import migrate

TIERS = ("critical", "standard", "batch")
ORIGIN = {"critical": "user_action", "standard": "scheduled", "batch": "batch_job"}
PAYLOAD = '{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}'
_STATE = """
SELECT tier::text, tenant_id, deficit, pos, due_at IS NULL FROM pgqueue.deficits
ORDER BY tier, tenant_id
"""
_TIER_STATE = """
SELECT tier::text, swrr_current, turn_tenant, next_pos, round, round_end_pos
FROM pgqueue.tier_state ORDER BY tier
"""


def _workload(shape: str, tenants: int, seed: int) -> tuple[list[Any], list[Any]]:
    """(tenants with quanta, jobs as (tenant, tier, cost)) for ``shape``."""
    rng = random.Random(seed)
    quanta = []
    jobs = []
    tiers = ("critical",) if shape in ("mixed", "alternate") else TIERS
    for n in range(tenants):
        name = f"t{n:05d}"
        quanta.append((name, rng.uniform(0.001, 1.0) if shape == "tiny" else 5.0))
        for tier in tiers:
            for _ in range(40 if shape == "normal" else 10):
                cost = 10 ** rng.uniform(3, 6) if shape == "tiny" else 1.0
                jobs.append((name, tier, cost))
    rng.shuffle(jobs)
    return quanta, jobs


def _mixed_roles(c: psycopg.Connection[Any], seed: int, period: int) -> None:
    """``mixed`` (period 3) and ``alternate`` (2): in round order, period - 1 pairs that cannot
    pay (quantum 0.001-1, cost 1,000-1,000,000), then one that pays a job per turn (quantum
    1, cost 1), and so on."""
    rng = random.Random(seed)
    order = [
        r[0]
        for r in c.execute(
            # the order the waiting pairs join the round in (revision 0023)
            "SELECT tenant_id FROM pgqueue.deficits WHERE tier = 'critical' "
            'ORDER BY refill_offset, tenant_id COLLATE "C"'
        )
    ]
    for i, tenant in enumerate(order):
        quantum, cost = (
            (1.0, 1.0)
            if i % period == period - 1
            else (rng.uniform(0.001, 1), 10 ** rng.uniform(3, 6))
        )
        c.execute("UPDATE pgqueue.tenants SET quantum = %s WHERE tenant_id = %s", (quantum, tenant))
        c.execute("UPDATE pgqueue.jobs SET cost = %s WHERE tenant_id = %s", (cost, tenant))


def _fill(dsn: str, shape: str, quanta: list[Any], jobs: list[Any], seed: int) -> None:
    with psycopg.connect(dsn) as c:
        c.execute(
            "TRUNCATE pgqueue.jobs, pgqueue.deficits, pgqueue.drr_inbox, pgqueue.tenants CASCADE"
        )
        c.execute(
            "UPDATE pgqueue.tier_state SET swrr_current = 0, turn_tenant = NULL, next_pos = 1, "
            "round = 0, round_end_pos = 0"
        )
        c.execute("SELECT setval('pgqueue.jobs_id_seq', 1, false)")
        c.execute(
            "INSERT INTO pgqueue.tenants (tenant_id, quantum) "
            "SELECT * FROM unnest(%s::text[], %s::float8[])",
            ([q[0] for q in quanta], [q[1] for q in quanta]),
        )
        c.execute(
            """
            INSERT INTO pgqueue.jobs (tenant_id, origin, priority, payload, cost)
            SELECT t, o::pgqueue.origin, p::pgqueue.tier, %s::jsonb, k
            FROM unnest(%s::text[], %s::text[], %s::text[], %s::float8[])
                 WITH ORDINALITY AS u(t, o, p, k, ord)
            ORDER BY ord
            """,
            (
                PAYLOAD,
                [j[0] for j in jobs],
                [ORIGIN[j[1]] for j in jobs],
                [j[1] for j in jobs],
                [j[2] for j in jobs],
            ),
        )
        c.execute("SELECT count(*) FROM pgqueue.claim(0, 'fold', 60)")  # fold the inbox in
        if shape in ("mixed", "alternate"):
            _mixed_roles(c, seed, 3 if shape == "mixed" else 2)
        c.commit()
        c.autocommit = True
        c.execute("VACUUM ANALYZE pgqueue.deficits, pgqueue.jobs, pgqueue.tenants")


def _claim(dsn: str, limit: int, count_statements: bool) -> tuple[float, int, list[Any]]:
    """(seconds, statements or 0, [claimed rows, deficits, tier state]) of one claim, timed
    in a session that has run the same claim once already (rolled back), so that compiling
    ``drr_dispatch`` and planning its statements are not in the time."""
    notices: list[str] = []
    claim = "SELECT id, tenant_id, priority::text FROM pgqueue.claim(%s, 'bench', 60)"
    with psycopg.connect(dsn) as c:
        c.execute(claim, (limit,)).fetchall()
        c.rollback()
        if count_statements:
            c.execute("LOAD 'auto_explain'")
            for setting in (
                "auto_explain.log_min_duration = 0",
                "auto_explain.log_nested_statements = on",
                "client_min_messages = log",
            ):
                c.execute(f"SET {setting}")
            c.commit()
            c.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        start = time.perf_counter()
        rows = c.execute(claim, (limit,)).fetchall()
        c.commit()
        seconds = time.perf_counter() - start
        state = [rows, c.execute(_STATE).fetchall(), c.execute(_TIER_STATE).fetchall()]
    statements = sum(1 for n in notices if n.startswith("duration:"))
    return seconds, statements, state


def _case(dsn: str, shape: str, tenants: int, *, limit: int, repeats: int, seed: int) -> Any:
    """One shape at one number of tenants on two fresh databases: the result's dict."""
    quanta, jobs = _workload(shape, tenants, seed)
    names = {rev: f"pgqueue_idle_{rev}_{uuid.uuid4().hex[:8]}" for rev in ("0027", "0028")}
    dsns = {rev: make_conninfo(dsn, dbname=name) for rev, name in names.items()}
    with psycopg.connect(dsn, autocommit=True) as admin:
        for name in names.values():
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        for rev, rev_dsn in dsns.items():
            migrate.upgrade(rev_dsn, rev)
        seconds: dict[str, list[float]] = {rev: [] for rev in dsns}
        statements: dict[str, int] = {}
        states: dict[str, list[Any]] = {}
        for repeat in range(repeats + 1):  # the first: statements counted, not timed
            order = list(dsns.items())
            for rev, rev_dsn in order if repeat % 2 else order[::-1]:  # each first in turn
                _fill(rev_dsn, shape, quanta, jobs, seed)
                took, counted, state = _claim(rev_dsn, limit, count_statements=repeat == 0)
                if repeat == 0:
                    statements[rev] = counted
                    states[rev] = state
                else:
                    seconds[rev].append(took)
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            for name in names.values():
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
    median = {rev: statistics.median(s) for rev, s in seconds.items()}
    return {
        "shape": shape,
        "tenants": tenants,
        "claim": limit,
        "seed": seed,
        "jobs": len(jobs),
        "seconds_median": median,
        "seconds": seconds,
        "statements": statements,
        "ratio_0028_to_0027": median["0028"] / median["0027"],
        "claimed": len(states["0028"][0]),
        "same_decisions": states["0027"] == states["0028"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--cases", default="tiny:30", help="shape:tenants, comma-separated (tiny:30,normal:1000)"
    )
    parser.add_argument("--claim", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    cases: list[tuple[str, int]] = []
    for item in args.cases.split(","):
        shape, _, count = item.partition(":")
        if (
            shape not in ("tiny", "normal", "mixed", "alternate")
            or not count.isdigit()
            or int(count) < 1
        ):
            parser.error(
                f"--cases: {item!r} is not a shape (tiny, normal, mixed, alternate):N with N >= 1"
            )
        cases.append((shape, int(count)))
    if args.claim < 1 or args.repeats < 1:
        parser.error("--claim and --repeats must be at least 1")
    results = []
    for shape, tenants in cases:
        r = _case(args.dsn, shape, tenants, limit=args.claim, repeats=args.repeats, seed=args.seed)
        results.append(r)
        print(
            f"{shape}, {tenants} tenants, claim of {args.claim}: "
            f"0027 {r['seconds_median']['0027'] * 1000:.0f} ms / {r['statements']['0027']} "
            f"statements, 0028 {r['seconds_median']['0028'] * 1000:.0f} ms / "
            f"{r['statements']['0028']} statements, ratio {r['ratio_0028_to_0027']:.3f}, "
            f"same decisions: {r['same_decisions']}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)
            out.write("\n")
    return 0 if all(r["same_decisions"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
