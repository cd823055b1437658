"""The SQL claim (pgqueue.claim: scheduler v2, 070_scheduler.sql) against issue 3's properties
and against the pure reference (pgqueue.scheduling.lanes.LaneScheduler, whose keyed DRR gives
classic DRR's order within a lane and tier) on the same inputs, under the strict tier policy."""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgqueue
from pgqueue.db import queries
from pgqueue.models import Tier
from pgqueue.scheduling.drr import jain_index, stable_offset
from tests.db.drr_support import (
    add_jobs,
    claim,
    claim_n,
    ref_take,
    reference,
    reset,
    set_tenant,
)

C, S, B = Tier.CRITICAL, Tier.STANDARD, Tier.BATCH


@pytest.fixture(autouse=True)
def _strict(conn):
    """Claims of this session pick tiers in priority order, as the reference does."""
    conn.execute("SET pgqueue.tier_policy = 'strict'")
    conn.commit()


# ------------------------------------------------------------------------ property 1


@pytest.mark.parametrize("quantum", [5.0, 1.0])
@pytest.mark.parametrize("served_before_arrival", [0, 1, 3, 4, 7])
def test_p1_new_tenant_served_within_one_round(conn, quantum, served_before_arrival):
    set_tenant(conn, "A", quantum=quantum if quantum != 5.0 else None)
    set_tenant(conn, "B", quantum=quantum if quantum != 5.0 else None)
    add_jobs(conn, [(C, "A", 1.0)] * 100)
    before = claim_n(conn, served_before_arrival, batch=1)
    assert [d.tenant_id for d in before] == ["A"] * served_before_arrival
    add_jobs(conn, [(C, "B", 1.0)])
    a_after_arrival = 0
    while True:
        (d,) = claim(conn, 1)
        if d.tenant_id == "B":
            break
        a_after_arrival += 1
    assert a_after_arrival <= quantum


def test_p1_through_enqueue_function(conn):
    """The same through pgqueue.enqueue (cost estimated from the payload), FIFO = 100."""
    payload = '{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}'
    conn.execute(
        "SELECT pgqueue.enqueue('A', 'user_action', %s::jsonb) FROM generate_series(1, 100)",
        (payload,),
    )
    conn.commit()
    conn.execute("SELECT pgqueue.enqueue('B', 'user_action', %s::jsonb)", (payload,))
    conn.commit()
    order = [d.tenant_id for d in claim_n(conn, 101, batch=1)]
    assert order.index("B") <= 5


# ------------------------------------------------------------------------ property 2


def test_p2_equal_tenants_bounded_and_jain(conn):
    rng = random.Random(2)
    tenants = [f"t{i}" for i in range(8)]
    ref = reference(conn)
    jobs = [(C, t, float(rng.randint(1, 8))) for _ in range(400) for t in tenants]
    add_jobs(conn, jobs, ref)
    got = claim_n(conn, 2000, batch=16)
    assert got == ref_take(ref, 2000)
    served: Counter[str] = Counter()
    for d in got:
        served[d.tenant_id] += d.cost
        assert max(served[t] for t in tenants) - min(served[t] for t in tenants) <= 5 + 8
    row = conn.execute(
        "SELECT jain_weighted, jain_unweighted, tenants FROM pgqueue.fairness "
        "WHERE window_name = '1h' AND tier = 'critical'"
    ).fetchone()
    assert row is not None
    assert row[2] == 8
    assert row[0] >= 0.99 and row[1] >= 0.99
    assert row[0] == pytest.approx(jain_index([served[t] for t in tenants]))


# ------------------------------------------------------------------------ property 3


def test_p3_pro_tenant_gets_three_times(conn):
    set_tenant(conn, "pro1", plan="pro")
    for t in ("f1", "f2", "f3"):
        set_tenant(conn, t)
    conn.commit()
    rng = random.Random(3)
    jobs = [
        (C, t, float(rng.randint(1, 4)))
        for i in range(1000)
        for t in ("pro1", "f1", "f2", "f3")
        if t == "pro1" or i < 400
    ]
    add_jobs(conn, jobs)
    got = claim_n(conn, 1200, batch=20)
    served: Counter[str] = Counter()
    for d in got:
        served[d.tenant_id] += d.cost
    free = (served["f1"] + served["f2"] + served["f3"]) / 3
    assert served["pro1"] / free == pytest.approx(3.0, rel=0.10)
    row = conn.execute(
        "SELECT jain_weighted FROM pgqueue.fairness WHERE window_name = '5m' AND tier IS NULL"
    ).fetchone()
    assert row is not None and row[0] >= 0.99


# ------------------------------------------------------------------------ property 4


def test_p4_costly_job_served_after_ceil_cost_over_quantum_rounds(conn):
    ref = reference(conn)
    jobs = [(C, "big", 40.0)] + [(C, t, 1.0) for _ in range(60) for t in ("x", "y", "z")]
    add_jobs(conn, jobs, ref)
    rows = conn.execute(
        "SELECT key_round, tenant_id, id, cost FROM pgqueue.claim(200, 'w', 60)"
    ).fetchall()
    conn.commit()
    big = [r for r in rows if r[1] == "big"]
    assert len(big) == 1
    assert big[0][0] == 8  # rounds are counted from 1: served in its 8th turn = ceil(40/5)
    ref_order = [(d.tenant_id, d.job_id) for d in ref_take(ref, 200)]
    assert [(r[1], r[2]) for r in rows] == ref_order


# ------------------------------------------------------------------------ property 5


def _full_backlog(conn, per_tier: int = 2500, tiers=(C, S, B)) -> None:
    jobs = [(tier, f"{tier.value}-{i % 3}", 1.0) for tier in tiers for i in range(per_tier)]
    add_jobs(conn, jobs)


def test_p5_weighted_shares_full_backlog(conn):
    """Weighted: each slot's tier drawn by weight among the backlogged tiers."""
    conn.execute("SET pgqueue.tier_policy = 'weighted'")
    conn.execute("SELECT setseed(0.25)")
    _full_backlog(conn)
    got = claim_n(conn, 2000, batch=50)
    share = Counter(d.tier for d in got)
    assert abs(share[C] / 2000 - 0.70) <= 0.03
    assert abs(share[S] / 2000 - 0.25) <= 0.03
    assert abs(share[B] / 2000 - 0.05) <= 0.03


def test_p5_weighted_without_critical_splits_25_5(conn):
    conn.execute("SET pgqueue.tier_policy = 'weighted'")
    conn.execute("SELECT setseed(0.25)")
    _full_backlog(conn, tiers=(S, B))
    got = claim_n(conn, 2000, batch=50)
    share = Counter(d.tier for d in got)
    assert abs(share[S] / 2000 - 25 / 30) <= 0.03
    assert abs(share[B] / 2000 - 5 / 30) <= 0.03


@pytest.mark.parametrize("policy", ["weighted", "probabilistic", "strict"])
def test_p5_batch_starvation_only_under_strict(conn, policy):
    conn.execute("SELECT set_config('pgqueue.tier_policy', %s, false)", (policy,))
    conn.execute("SELECT setseed(0.5)")
    _full_backlog(conn)
    got = claim_n(conn, 2000, batch=50)
    batch = sum(1 for d in got if d.tier is B)
    if policy == "strict":
        assert batch == 0 and all(d.tier is C for d in got)
    else:
        assert batch > 0
    if policy == "probabilistic":
        assert abs(sum(1 for d in got if d.tier is C) / 2000 - 0.9) <= 0.04


@pytest.mark.parametrize("policy", ["weighted", "probabilistic", "strict"])
def test_p5_every_policy_is_work_conserving(conn, policy):
    conn.execute("SELECT set_config('pgqueue.tier_policy', %s, false)", (policy,))
    for only in (B, S, C):
        add_jobs(conn, [(only, "solo", 1.0)] * 3)
        assert [d.tier for d in claim(conn, 5)] == [only] * 3
        assert claim(conn, 5) == []


def test_unknown_policy_is_refused(conn):
    conn.execute("SET pgqueue.tier_policy = 'lottery'")
    add_jobs(conn, [(C, "a", 1.0)])
    with pytest.raises(psycopg.Error) as caught:
        claim(conn, 1)
    assert caught.value.sqlstate == "PQ012"  # a malformed setting (PQ009 before 0049)
    assert "unknown tier policy" in str(caught.value)


# ------------------------------------------------------------------------ property 6


def _claimer(dsn: str, worker: str, total: int) -> list[int]:
    rng = random.Random(worker)
    taken: list[int] = []
    empty_since: float | None = None
    with psycopg.connect(dsn, autocommit=True) as c:
        # A claim beside a fold under way may come back empty: try again, for 5 s (a count of
        # 50 empty claims ran out on a loaded machine while another process held the fold).
        while empty_since is None or time.monotonic() - empty_since < 5:
            rows = c.execute(
                "SELECT id FROM pgqueue.claim(%s, %s, 60)", (rng.randint(1, 8), worker)
            ).fetchall()
            if rows:
                empty_since = None
            elif empty_since is None:
                empty_since = time.monotonic()
            taken.extend(r[0] for r in rows)
            if len(taken) >= total:
                return taken
    return taken


@pytest.mark.slow
def test_p6_four_processes_share_one_schedule(conn, db_dsn):
    import multiprocessing

    rng = random.Random(6)
    tenants = [f"t{i}" for i in range(8)]
    ref = reference(conn)
    add_jobs(conn, [(C, t, float(rng.randint(1, 8))) for _ in range(300) for t in tenants], ref)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.starmap(_claimer, [(db_dsn, f"w{i}", 500) for i in range(4)])
    claimed = [job for r in results for job in r]
    assert len(claimed) == len(set(claimed))  # nobody claimed a job twice
    rows = conn.execute(
        "SELECT tenant_id, id, cost, worker_id FROM pgqueue.jobs "
        "WHERE state = 'running' ORDER BY key_round, key_place, key_seq"
    ).fetchall()
    assert sorted(claimed) == sorted(r[1] for r in rows)
    assert len({r[3] for r in rows}) == 4
    # One schedule: the union of the four workers' claims, in key order, is exactly the
    # single-claimer reference sequence.
    expected = [(d.tenant_id, d.job_id) for d in ref_take(ref, len(rows))]
    assert [(r[0], r[1]) for r in rows] == expected
    served: Counter[str] = Counter()
    for tenant, _, cost, _ in rows:
        served[tenant] += cost
        assert max(served[t] for t in tenants) - min(served[t] for t in tenants) <= 5 + 8


# ------------------------------------------------------------------------ claim_order view


def test_claim_order_agrees_with_the_next_single_claims(conn):
    rng = random.Random(20)
    set_tenant(conn, "p", plan="pro")
    jobs = [
        (rng.choice([C, C, S, B]), rng.choice("pqrst"), float(rng.randint(1, 9)))
        for _ in range(120)
    ]
    add_jobs(conn, jobs)
    claim_n(conn, 7, batch=3)  # some turns in progress
    state = (
        "SELECT (SELECT array_agg(f::text ORDER BY f::text) FROM pgqueue.flows f)::text,"
        " (SELECT array_agg(c::text ORDER BY c::text) FROM pgqueue.cursors c)::text"
    )
    state_before = conn.execute(state).fetchone()
    view = conn.execute(
        "SELECT tier::text, round, tenant_id, job_id, cost FROM pgqueue.claim_order LIMIT 40"
    ).fetchall()
    conn.commit()
    assert conn.execute(state).fetchone() == state_before  # the view changed nothing
    assert len(view) >= 3
    assert conn.execute("SELECT count(*) FROM pgqueue.jobs WHERE state = 'running'").fetchone() == (
        7,
    )
    # Within a tier, the view's jobs are the next ones the claims take, in order (it stops at
    # the tier's frontier: past it, a fold may stamp jobs with smaller keys).
    taken = claim_n(conn, 113, batch=1)
    for tier in (C, S, B):
        shown = [(ten, j, c) for t, r, ten, j, c in view if t == tier.value and r is not None]
        took = [(d.tenant_id, d.job_id, d.cost) for d in taken if d.tier is tier]
        assert shown == took[: len(shown)], tier
    rounds = [r[1] for r in view if r[1] is not None]  # None: due, not stamped yet
    assert min(rounds) >= 0


# ------------------------------------------------------------------------ SQL vs reference


job_lists = st.lists(
    st.tuples(
        st.sampled_from([C, S, B]),
        st.sampled_from(["a", "b", "c", "d"]),
        st.integers(1, 12).map(float),
    ),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    phases=st.lists(st.tuples(job_lists, st.integers(0, 30), st.integers(1, 6)), max_size=3),
    quanta=st.fixed_dictionaries(
        {t: st.sampled_from([None, 1.0, 2.5, 7.0]) for t in ["a", "b", "c", "d"]}
    ),
    pro=st.sampled_from(["a", "b", "none"]),
)
def test_sql_claim_matches_reference(conn, phases, quanta, pro):
    plans = {tenant: "pro" if tenant == pro else "free" for tenant in quanta}
    _claims_match_reference(conn, phases, quanta, plans, final_batch=7)


def _claims_match_reference(conn, phases, quanta, plans, *, final_batch):
    """Reset; the tenants' plans and quanta; each phase's jobs, then its claims, against the
    reference; then a drain, which leaves no scheduler state behind."""
    reset(conn)
    for tenant, q in quanta.items():
        set_tenant(conn, tenant, plan=plans.get(tenant, "free"), quantum=q)
    conn.commit()
    ref = reference(conn)
    for jobs, n, batch in phases:
        add_jobs(conn, jobs, ref)
        got = claim_n(conn, n, batch=batch)
        assert got == ref_take(ref, n)
    assert claim_n(conn, 10_000, batch=final_batch) == ref_take(ref, 10_000)
    assert claim(conn, 5) == []


# ------------------------------------------------------------------------ time and repair


def test_future_jobs_do_not_block_a_tenant_or_the_queue(conn):
    add_jobs(conn, [(C, "a", 1.0)] * 3, run_at_offset_seconds=3600)
    add_jobs(conn, [(C, "a", 1.0)])
    add_jobs(conn, [(C, "z", 1.0)] * 2, run_at_offset_seconds=3600)
    got = claim(conn, 10)
    assert [d.tenant_id for d in got] == ["a"]
    assert claim(conn, 10) == []  # nothing is due
    conn.execute("UPDATE pgqueue.jobs SET run_at = now() WHERE tenant_id = 'z'")
    conn.commit()
    assert [d.tenant_id for d in claim(conn, 10)] == ["z", "z"]


def test_lane_tiers_due_gives_each_pairs_latest_due_run_at(conn):
    """lane_tiers_due probes from the end of each lane and tier's unstamped jobs: where the
    last one is not due yet, the latest due one (a second probe); a pair with none due is
    left out."""
    add_jobs(conn, [(C, "a", 1.0)], run_at_offset_seconds=-60)
    add_jobs(conn, [(C, "b", 1.0)], run_at_offset_seconds=-30)
    add_jobs(conn, [(C, "a", 1.0)], run_at_offset_seconds=3600)
    add_jobs(conn, [(S, "a", 1.0)], run_at_offset_seconds=-10)
    add_jobs(conn, [(B, "a", 1.0)], run_at_offset_seconds=3600)
    rows = conn.execute(
        "SELECT u.tier::text, u.due_at = (SELECT max(j.run_at) FROM pgqueue.jobs j"
        "  WHERE j.priority = u.tier AND j.run_at <= now())"
        " FROM pgqueue.lane_tiers_due() u ORDER BY u.tier"
    ).fetchall()
    assert rows == [("critical", True), ("standard", True)]


def test_requeued_job_is_claimed_again(conn):
    (job_id,) = add_jobs(conn, [(S, "a", 1.0)])
    row = queries.run(
        conn, "job_claim", {"limit": 5, "worker_id": "w", "lease_seconds": 30, "skip_kinds": []}
    )
    assert [r["id"] for r in row] == [job_id]
    state = queries.run(
        conn,
        "job_retry",
        {
            "id": job_id,
            "tenant_id": "a",
            "lease_token": row[0]["lease_token"],
            "permanent": False,
            "delay_seconds": 0,
            "error": "boom",
        },
    )
    conn.commit()
    assert state == {"state": "queued"}
    assert [d.job_id for d in claim(conn, 5)] == [job_id]


def test_lost_scheduler_state_is_repaired(conn):
    """Liveness: the scheduler's rows lost (or a stamper that died mid-fold, which leaves
    them as they were) hold no due job back."""
    add_jobs(conn, [(B, "a", 1.0)] * 3)
    assert len(claim(conn, 1)) == 1
    conn.execute("DELETE FROM pgqueue.flows")
    conn.execute("DELETE FROM pgqueue.lane_tiers")
    conn.execute("DELETE FROM pgqueue.cursors")
    conn.execute("UPDATE pgqueue.jobs SET key_round = NULL, key_place = NULL, key_seq = NULL")
    conn.commit()
    assert len(claim(conn, 5)) == 2


def test_claim_limit_zero_and_empty_queue(conn):
    assert claim(conn, 0) == []
    assert claim(conn, 3) == []
    add_jobs(conn, [(C, "a", 1.0)])
    assert claim(conn, 0) == []
    assert len(claim(conn, 3)) == 1


def test_tenant_service_view(conn):
    set_tenant(conn, "a", plan="pro")
    add_jobs(conn, [(C, "a", 2.0)] * 4 + [(B, "b", 1.0)] * 3)
    claim(conn, 3)
    rows = conn.execute(
        "SELECT tenant_id, tier::text, jobs_served, cost_served, jobs_queued, quantum "
        "FROM pgqueue.tenant_service WHERE window_name = '1m' ORDER BY tenant_id"
    ).fetchall()
    by_tenant = defaultdict(list)
    for r in rows:
        by_tenant[r[0]].append(r)
    assert sum(r[2] for r in rows) == 3
    assert sum(r[2] + r[4] for r in rows) == 7
    assert by_tenant["a"][0][5] == 15.0 and by_tenant["b"][0][5] == 5.0


def test_a_queued_job_moved_to_another_tenant_is_claimed_in_its_turn(conn):
    """Revision 0021: an UPDATE that moves a queued job to a tenant with no other queued work
    in that tier gives that tenant a pair in the round. Before it, the job waited for the
    claim's safety net (a claim that found nothing else due)."""
    set_tenant(conn, "A")
    set_tenant(conn, "B")
    ids = add_jobs(conn, [(C, "A", 1.0)] * 4)
    conn.execute("UPDATE pgqueue.jobs SET tenant_id = 'B' WHERE id = %s", (ids[-1],))
    conn.commit()
    got = claim(conn, 10)
    assert sorted(d.job_id for d in got) == sorted(ids)
    assert Counter(d.tenant_id for d in got) == {"A": 3, "B": 1}


def test_jobs_far_above_their_quantum_skip_the_rounds_nobody_can_use(conn):
    """Revision 0022: jobs that cost 100,000 times their tenants' quanta need that many turns;
    taken one at a time they kept a claim under the scheduler's lock for minutes (a tester's
    cost of 1,000,000 at quantum 0.05). The claim now skips whole rounds in which no pair can
    pay for its next job, with the same dispatches as the turns one by one (the reference)."""
    set_tenant(conn, "A", quantum=1.0)
    set_tenant(conn, "B", quantum=1.0)
    set_tenant(conn, "D", quantum=2.0)
    ref = reference(conn)
    jobs = [
        (C, "A", 200_000.0),
        (C, "B", 1.0),
        (C, "D", 150_000.0),
        (C, "B", 3.0),
        (C, "A", 1.0),
        (C, "D", 2.0),
        (C, "B", 100_000.0),
        (S, "A", 50_000.0),
        (S, "B", 7.0),
    ]
    add_jobs(conn, jobs, ref)
    conn.execute("SET statement_timeout = '10s'")  # turn by turn, these claims take minutes
    conn.commit()
    got = claim_n(conn, len(jobs), batch=3)
    assert got == ref_take(ref, len(jobs))


costly_job_lists = st.lists(
    st.tuples(
        st.sampled_from([C, S, B]),
        st.sampled_from(["a", "b", "c", "d"]),
        st.sampled_from([1.0, 2.0, 3.0, 150.0, 400.0, 1000.0]),
    ),
    min_size=1,
    max_size=20,
)


@settings(
    max_examples=15,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    phases=st.lists(st.tuples(costly_job_lists, st.integers(0, 12), st.integers(1, 6)), max_size=3),
    quanta=st.fixed_dictionaries({t: st.sampled_from([1.0, 2.0, 3.0]) for t in "abcd"}),
)
def test_sql_claim_matches_reference_with_costs_far_above_the_quanta(conn, phases, quanta):
    """Revision 0022's skipped rounds give the dispatches of the turns one by one (whole
    costs and quanta: the deficits are then the same sums)."""
    _claims_match_reference(conn, phases, quanta, {}, final_batch=5)


def test_skipped_rounds_stop_one_round_before_the_first_pair_can_pay(conn):
    """Two tenants, quantum 1: the first in the round needs 1,001 turns, the second 1,000, so
    the second is served first. One round skipped too many would let the first pay first."""
    names = sorted(["x", "y", "z", "w"], key=stable_offset)
    first, second = names[0], names[1]
    set_tenant(conn, first, quantum=1.0)
    set_tenant(conn, second, quantum=1.0)
    ref = reference(conn)
    add_jobs(conn, [(C, first, 1001.0), (C, second, 1000.0)], ref)
    # the rounds are counted as the turns one by one count them (pgqueue.claim_order)
    conn.execute("SELECT pgqueue.fold('anthropic.messages', 'critical')")
    order = conn.execute("SELECT round, tenant_id FROM pgqueue.claim_order").fetchall()
    assert order == [(1000, second), (1001, first)]
    conn.rollback()
    got = claim_n(conn, 2, batch=2)
    assert [d.tenant_id for d in got] == [second, first]
    assert got == ref_take(ref, 2)


def test_every_dispatch_of_a_claim_skips_as_soon_as_the_first(conn):
    """Found by a second tester: the turn limit before a skip doubled across a claim's
    dispatches, so the twelfth job of one claim waited for 64 × 2^11 turns one by one (a claim
    of 28 costly jobs: 15 s under the scheduler's lock). The limit is per dispatch now."""
    set_tenant(conn, "A", quantum=1.0)
    ref = reference(conn)
    jobs = [(C, "A", 5000.0)] * 12
    add_jobs(conn, jobs, ref)
    conn.execute("SET statement_timeout = '10s'")
    conn.commit()
    assert claim_n(conn, 12, batch=12) == ref_take(ref, 12)


@pytest.mark.parametrize(
    ("statement", "constraint"),
    [
        ("UPDATE pgqueue.jobs SET cost = 'NaN'", "jobs_cost_check"),
        ("UPDATE pgqueue.jobs SET cost = 'Infinity'", "jobs_cost_check"),
        ("UPDATE pgqueue.jobs SET cost = 1e10", "jobs_cost_check"),
        ("UPDATE pgqueue.tenants SET quantum = 0.0001", "tenants_quantum_floor"),
    ],
)
def test_costs_and_quanta_stay_where_rounds_can_be_counted(conn, statement, constraint):
    """Revision 0022's bounds (the second tester): NaN and Infinity passed `cost >= 1`, and a
    skip of more rounds than a bigint holds failed every later claim; below a quantum of
    0.001 a deficit near a huge cost stops growing in float8."""
    set_tenant(conn, "A", quantum=1.0)
    add_jobs(conn, [(C, "A", 1.0)])
    with pytest.raises(psycopg.errors.CheckViolation, match=constraint):
        conn.execute(statement)
    conn.rollback()


def test_a_stamper_that_died_mid_fold_holds_nothing_back(conn, db_dsn):
    """Liveness: a stamper killed inside its fold (lock held, nothing committed) makes the
    claims beside it come back empty without waiting; the next claim stamps and takes."""
    add_jobs(conn, [(C, "a", 1.0)])
    stamper = psycopg.connect(db_dsn)
    stamper.execute("SELECT pgqueue.fold('anthropic.messages', 'critical')")  # not committed
    assert claim(conn, 5) == []  # the lock is taken: nothing stamped to claim, no wait
    # The timeout makes the call wait until the backend has gone (its lock with it); without
    # it, the next claim could still meet the dying backend's lock (a CI failure, 2026-12-03).
    conn.execute("SELECT pg_terminate_backend(%s, timeout => 10000)", (stamper.info.backend_pid,))
    conn.commit()
    stamper.close()
    assert [d.tenant_id for d in claim(conn, 5)] == ["a"]


def test_a_cut_flow_whose_queued_jobs_were_all_cancelled_holds_nothing_back(conn):
    """Found by a hostile tester: a tenant's backlog cut at the horizon, then every queued job
    of it cancelled. The fold fetched nothing for that flow and left it cut, so the frontier
    stayed at its last key and no claim of the lane and tier went past it, for good (34,036
    jobs queued, four workers idle for 10 minutes). A flow with nothing left is not cut."""
    add_jobs(conn, [(C, t, 1.0) for _ in range(100) for t in ("a", "b")])
    first = claim_n(conn, 10, batch=10)
    assert {d.tenant_id for d in first} == {"a", "b"}
    assert pgqueue.cancel_queued(conn, "a") > 0
    conn.commit()
    rest = claim_n(conn, 1_000, batch=10)
    assert [d.tenant_id for d in rest] == ["b"] * (100 - sum(d.tenant_id == "b" for d in first))
