"""Pruning the scheduler's idle flow rows (pgqueue.flows_prune, 075_prune.sql; the named
statement flow_prune): it removes the rows of tenants with no queued job left in their lane and
tier, keeps the flows the horizon cut and the ones with stamped jobs still queued, skips a lane
and tier whose fold try-lock is taken, and leaves the claim order as it was: a pruned tenant
joins afresh at its next job, as it would with its row (docs/drr.md, "Pruning")."""

from __future__ import annotations

import random

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgqueue.admin import prune_flows
from pgqueue.db import queries
from pgqueue.models import Tier
from pgqueue.scheduling.drr import stable_offset
from tests.db.drr_support import (
    LANE,
    add_jobs,
    claim,
    claim_n,
    ref_take,
    reference,
    reset,
    set_tenant,
)

C, S, B = Tier.CRITICAL, Tier.STANDARD, Tier.BATCH


def _prune(conn: psycopg.Connection[tuple[object, ...]], limit: int = 10_000) -> int:
    row = queries.run(conn, "flow_prune", {"limit": limit})
    conn.commit()
    return int(row["deleted"])


def _flows(conn: psycopg.Connection[tuple[object, ...]]) -> dict[tuple[str, str], bool]:
    """(tier, tenant) -> cut, for every flow row."""
    rows = conn.execute("SELECT tier::text, tenant_id, cut FROM pgqueue.flows").fetchall()
    conn.commit()
    return {(str(t), str(tenant)): bool(cut) for t, tenant, cut in rows}


def test_pruning_removes_idle_flows_and_keeps_cut_and_live_ones(conn):
    """gone: its only job claimed; live: stamped jobs still queued (rounds 1 and 2); cut: the
    horizon (4 rounds) left some of its due jobs unstamped."""
    reset(conn)
    add_jobs(conn, [(C, "gone", 1.0)] + [(C, "live", 1.0)] * 8 + [(C, "cut", 5.0)] * 20)
    taken: list[str] = []
    while "gone" not in taken:  # round 1 at most: live's round-2 jobs stay queued
        taken += [d.tenant_id for d in claim(conn, 1)]
    before = _flows(conn)
    assert before == {
        ("critical", "gone"): False,
        ("critical", "live"): False,
        ("critical", "cut"): True,
    }
    assert _prune(conn) == 1
    assert _flows(conn) == {("critical", "live"): False, ("critical", "cut"): True}
    assert _prune(conn) == 0
    # drained, every row goes (the cut flow is no longer cut once all its jobs are stamped)
    claim_n(conn, 100)
    assert _prune(conn) == 2
    assert _flows(conn) == {}


def _cancel_then_join(conn: psycopg.Connection[tuple[object, ...]], prune: bool) -> list[str]:
    """d's last stamped job is cancelled while an earlier one is queued, ahead of the cursor;
    then two tenants join. The order, with d's remaining job, e's and f's by name."""
    d, a = sorted(["d", "a", "q", "z"], key=stable_offset)[:2]  # d takes the lower place
    reset(conn)
    ids = add_jobs(conn, [(C, d, 7.0), (C, d, 1.0)] + [(C, a, 1.0)] * 10)
    assert [x.tenant_id for x in claim(conn, 5)] == [a] * 5  # round 1; d's two are in round 2
    conn.execute(
        "UPDATE pgqueue.jobs SET state = 'cancelled', finished_at = now() WHERE id = %s",
        (ids[1],),
    )
    conn.commit()
    if prune:
        # its last stamped job is gone, but the cursor has not reached its key: kept (pruned,
        # the two joiners would take places before d's queued job in its round)
        assert _prune(conn) == 0
        assert (C.value, d) in _flows(conn)
    joined = add_jobs(conn, [(C, "e", 1.0), (C, "f", 1.0)])
    names = {ids[0]: f"{d}1", joined[0]: "e1", joined[1]: "f1"}
    return [names.get(x.job_id, x.tenant_id) for x in claim_n(conn, 100, batch=3)]


def test_a_cancelled_last_job_ahead_of_the_cursor_keeps_its_flow_and_the_order(conn):
    assert _cancel_then_join(conn, prune=True) == _cancel_then_join(conn, prune=False)


def _skipped_then_more(
    conn: psycopg.Connection[tuple[object, ...]], db_dsn: str, prune: bool
) -> list[str]:
    """a's only job is locked by another session while claims take c's and b's round 1 past
    it (SKIP LOCKED); then a enqueues again. The order, by tenant."""
    a, c, b = sorted(["a", "c", "b", "x"], key=stable_offset)[:3]
    reset(conn)
    ids = add_jobs(conn, [(C, a, 1.0)] + [(C, c, 1.0)] * 6 + [(C, b, 1.0)] * 6)
    conn.execute("SELECT pgqueue.fold(%s, 'critical')", (LANE,))  # a's job: the first key
    conn.commit()
    with psycopg.connect(db_dsn) as holder:
        holder.execute("SELECT FROM pgqueue.jobs WHERE id = %s FOR UPDATE", (ids[0],))
        taken = claim_n(conn, 10, batch=5)
        assert [x.tenant_id for x in taken] == [c] * 5 + [b] * 5
        if prune:
            # its last key is behind the cursor, but its job is still queued: kept (pruned,
            # a's next job would join afresh in round 2 instead of going on in round 1)
            assert _prune(conn) == 0
            assert (C.value, a) in _flows(conn)
        add_jobs(conn, [(C, a, 1.0)])
    return [x.tenant_id for x in claim_n(conn, 100, batch=2)]


def test_a_last_job_skipped_by_the_claims_keeps_its_flow_and_the_order(conn, db_dsn):
    with_pruning = _skipped_then_more(conn, db_dsn, prune=True)
    assert with_pruning == _skipped_then_more(conn, db_dsn, prune=False)


def test_transient_tenants_pruned_mid_run_get_the_reference_order(conn):
    """Many tenants come and go (a few jobs each, some coming back later), pruned between
    claims: the order is the reference's (KeyedDrr per lane and tier, which drops a tenant's
    flow the moment its queue empties), and rows were pruned on the way."""
    rng = random.Random(28)
    reset(conn)
    for i in range(0, 30, 4):
        set_tenant(conn, f"t{i:02d}", quantum=rng.choice([1.0, 2.5, 7.0]))
    conn.commit()
    ref = reference(conn)
    pruned = 0
    for _ in range(30):
        tenants = rng.sample([f"t{i:02d}" for i in range(30)], rng.randint(1, 4))
        jobs = [
            (rng.choice([C, C, S, B]), t, float(rng.randint(1, 9)))
            for t in tenants
            for _ in range(rng.randint(1, 4))
        ]
        add_jobs(conn, jobs, ref)
        n = rng.randint(1, 12)
        got = claim_n(conn, n, batch=rng.randint(1, 4))
        assert got == ref_take(ref, n)
        pruned += _prune(conn, limit=rng.choice([1, 3, 10_000]))
    assert claim_n(conn, 10_000, batch=5) == ref_take(ref, 10_000)
    pruned += _prune(conn)
    assert pruned >= 50
    assert _flows(conn) == {}  # nothing queued: nothing needed


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
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    phases=st.lists(
        st.tuples(job_lists, st.integers(0, 30), st.integers(1, 6), st.booleans()), max_size=4
    ),
    quanta=st.fixed_dictionaries({t: st.sampled_from([None, 1.0, 2.5, 7.0]) for t in "abcd"}),
)
def test_sql_claim_with_pruning_matches_reference(conn, phases, quanta):
    """test_drr_claim's reference comparison with a prune after each phase's enqueues (when
    drawn) and after its claims."""
    reset(conn)
    for tenant, q in quanta.items():
        set_tenant(conn, tenant, quantum=q)
    conn.commit()
    ref = reference(conn)
    for jobs, n, batch, prune_first in phases:
        add_jobs(conn, jobs, ref)
        if prune_first:
            _prune(conn)
        assert claim_n(conn, n, batch=batch) == ref_take(ref, n)
        _prune(conn)
    assert claim_n(conn, 10_000, batch=7) == ref_take(ref, 10_000)
    assert claim(conn, 5) == []


def test_a_lane_and_tier_being_folded_is_skipped(conn, db_dsn):
    """The fold's try-lock, held by another session (a fold under way), keeps that pair's rows;
    the other pairs are pruned. Once it is free, the rows go."""
    reset(conn)
    add_jobs(conn, [(C, "a", 1.0), (S, "b", 1.0)])
    assert len(claim_n(conn, 2)) == 2
    assert set(_flows(conn)) == {("critical", "a"), ("standard", "b")}
    with psycopg.connect(db_dsn) as folding:
        folding.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s,"
            " array_position(enum_range(NULL::pgqueue.tier), 'critical'::pgqueue.tier)))",
            (LANE,),
        )
        assert _prune(conn) == 1
        assert set(_flows(conn)) == {("critical", "a")}
        folding.rollback()
    assert _prune(conn) == 1
    assert _flows(conn) == {}


def test_one_pruner_at_a_time(conn, db_dsn):
    """Another session holding the row 'prune' of pgqueue.leader_locks: nothing is deleted
    (as job_prune); prune_flows deletes in batches."""
    reset(conn)
    add_jobs(conn, [(C, f"t{i}", 1.0) for i in range(5)])
    assert len(claim_n(conn, 5)) == 5
    with psycopg.connect(db_dsn) as leader:
        leader.execute("SELECT FROM pgqueue.leader_locks WHERE name = 'prune' FOR UPDATE")
        assert _prune(conn) == 0
        leader.rollback()
    assert prune_flows(conn, batch=2) == 5
    assert _flows(conn) == {}


async def test_the_workers_upkeep_prunes_idle_flows(db_dsn):
    """What the rescuer's round runs (pgqueue.worker.upkeep.prune_flows, every round)."""
    from psycopg_pool import AsyncConnectionPool

    from pgqueue.worker import upkeep

    with psycopg.connect(db_dsn) as conn:
        add_jobs(conn, [(C, "t0", 1.0)] * 6 + [(C, "t1", 1.0), (C, "t2", 1.0)])
        assert len(claim_n(conn, 7)) == 7  # round 1: t1 and t2 left, t0 has one in round 2
        async with AsyncConnectionPool(db_dsn, min_size=1, max_size=1) as pool:
            assert await upkeep.prune_flows(pool) == 2
        assert set(_flows(conn)) == {("critical", "t0")}
