"""The scheduler v2 prototype (bench/scheduler_v2/scheduler.sql) against its pure reference
(pgqueue.scheduling.keys.KeyedDrr, itself tested against the classic DrrScheduler).

The prototype lives in a schema of its own (`sched`) in an empty database: it is not part of
pgqueue's schema yet (issue 28, phase 1). Same inputs on both sides; the claimed jobs, their
order and their rounds must agree.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgqueue.scheduling.keys import KeyedDrr

SQL = Path(__file__).resolve().parents[2] / "bench" / "scheduler_v2" / "scheduler.sql"
TENANTS = ["a", "b", "c", "d", "e"]
Conn = psycopg.Connection[Any]


@pytest.fixture
def proto(empty_db_dsn: str) -> Iterator[Conn]:
    with psycopg.connect(empty_db_dsn) as conn:
        conn.execute(SQL.read_text())
        conn.commit()
        yield conn


def _reset(conn: Conn, quanta: dict[str, int]) -> None:
    conn.rollback()
    conn.execute("TRUNCATE sched.jobs, sched.flows, sched.lane_tiers, sched.cursors, sched.tenants")
    conn.execute(
        "INSERT INTO sched.tenants SELECT * FROM unnest(%s::text[], %s::bigint[])",
        (list(quanta), list(quanta.values())),
    )
    conn.commit()


def _enqueue(conn: Conn, jobs: list[tuple[str, int]], tier: int = 0) -> list[int]:
    if not jobs:
        return []
    rows = conn.execute(
        "INSERT INTO sched.jobs (lane, tier, tenant_id, cost)"
        " SELECT 'm', %s, t, c FROM unnest(%s::text[], %s::bigint[]) WITH ORDINALITY u(t, c, o)"
        " ORDER BY o RETURNING id",
        (tier, [t for t, _ in jobs], [c for _, c in jobs]),
    ).fetchall()
    conn.commit()
    return sorted(r[0] for r in rows)


def _claim(conn: Conn, n: int, horizon: int, worker: str = "w") -> list[tuple[str, int, int]]:
    rows = conn.execute(
        "SELECT tenant_id, id, key_round FROM sched.claim('m', 0::smallint, %s, %s, %s)",
        (n, worker, horizon),
    ).fetchall()
    conn.commit()
    return [(t, i, r) for t, i, r in rows]


phases = st.lists(
    st.tuples(
        st.lists(
            st.tuples(st.sampled_from(TENANTS), st.sampled_from([1000, 1000, 2500, 4000, 12000])),
            max_size=15,
        ),
        st.integers(0, 20),
    ),
    min_size=1,
    max_size=4,
)


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    phases=phases,
    quanta=st.fixed_dictionaries({t: st.sampled_from([1000, 2000, 5000, 7000]) for t in TENANTS}),
    batch=st.sampled_from([1, 10]),
    horizon=st.sampled_from([0, 1, 4]),
)
def test_claims_follow_the_reference_keys(proto, phases, quanta, batch, horizon):
    _reset(proto, quanta)
    ref = KeyedDrr(quanta.__getitem__, horizon_rounds=horizon)
    for jobs, dispatches in [*phases, ([], 10_000)]:
        for (tenant, cost), job_id in zip(jobs, _enqueue(proto, jobs), strict=True):
            ref.enqueue(tenant, job_id, cost)
        got: list[tuple[str, int, int]] = []
        while len(got) < dispatches:
            taken = _claim(proto, min(batch, dispatches - len(got)), horizon)
            if not taken:
                break
            got.extend(taken)
        want = []
        for _ in range(len(got) if dispatches == 10_000 else dispatches):
            s = ref.next()
            if s is None:
                break
            want.append((s.tenant_id, s.job_id, s.key.round))
        assert got == want
    assert ref.next() is None


def test_four_claimers_side_by_side_claim_the_reference_keys(proto, empty_db_dsn):
    """No job twice, none lost, and the union of the claims in key order is the reference's
    order; claimers that lose the stamping lock take stamped jobs and wait for nobody."""
    quanta = dict.fromkeys(TENANTS, 3000)
    _reset(proto, quanta)
    ref = KeyedDrr(quanta.__getitem__, horizon_rounds=2)
    jobs = [(TENANTS[i % 5], 1000 * (1 + i % 4)) for i in range(600)]
    for (tenant, cost), job_id in zip(jobs, _enqueue(proto, jobs), strict=True):
        ref.enqueue(tenant, job_id, cost)
    claimed: list[list[tuple[str, int, int]]] = [[] for _ in range(4)]

    def claimer(k: int) -> None:
        with psycopg.connect(empty_db_dsn) as c:
            idle = 0
            while idle < 50:
                got = _claim(c, 1 + k * 3, 2, worker=f"w{k}")
                idle = 0 if got else idle + 1
                claimed[k].extend(got)

    threads = [threading.Thread(target=claimer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    union = [job for part in claimed for job in part]
    assert len({j for _, j, _ in union}) == len(union) == len(jobs)
    keyed = proto.execute(
        "SELECT tenant_id, id, key_round FROM sched.jobs ORDER BY key_round, key_place, key_seq"
    ).fetchall()
    want = [(s.tenant_id, s.job_id, s.key.round) for s in iter(ref.next, None)]
    assert [tuple(r) for r in keyed] == want


def test_one_million_jobs_of_one_tenant_are_stamped_a_horizon_at_a_time(proto):
    """A fold stamps each tenant's rounds up to the horizon, not its whole backlog."""
    _reset(proto, {"big": 5000, "small": 5000})
    proto.execute(
        "INSERT INTO sched.jobs (lane, tier, tenant_id, cost)"
        " SELECT 'm', 0, 'big', 1000 FROM generate_series(1, 20000)"
    )
    proto.commit()
    _enqueue(proto, [("small", 1000)])
    got = _claim(proto, 10, 2)
    assert [t for t, _, _ in got].index("small") <= 5
    stamped = proto.execute("SELECT count(*) FROM sched.jobs WHERE key_round IS NOT NULL")
    assert stamped.fetchone() == (2 * 5 + 1,)


def test_a_stamper_that_died_mid_fold_holds_nothing_back(proto, empty_db_dsn):
    """Liveness: a stamper killed inside its fold (lock held, nothing committed) leaves the
    lane as it was; the next claim wins the lock, stamps and takes the job."""
    _reset(proto, {"a": 5000})
    _enqueue(proto, [("a", 1000)])
    stamper = psycopg.connect(empty_db_dsn)
    stamper.execute("SELECT pg_advisory_xact_lock(hashtextextended('m', 0))")
    stamper.execute("SELECT sched.stamp('m', 0::smallint, 4)")  # mid-fold: not committed
    assert _claim(proto, 5, 4) == []  # the lock is taken: nothing stamped to claim, no wait
    pid = stamper.info.backend_pid
    proto.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))  # waits for its exit
    proto.commit()
    stamper.close()
    assert [t for t, _, _ in _claim(proto, 5, 4)] == ["a"]


def test_a_claimer_started_on_an_empty_queue_takes_the_first_job(proto):
    _reset(proto, {"a": 5000})
    assert _claim(proto, 5, 4) == []
    (job_id,) = _enqueue(proto, [("a", 1000)])
    assert [j for _, j, _ in _claim(proto, 5, 4)] == [job_id]
