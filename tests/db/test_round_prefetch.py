"""Revision 0025: a claim's first load reads as many pairs of a round as the tier's part of
the claim needs, so the turns of a claim rarely load their round heads one statement at a
time; the dispatch order stays the reference's."""

from __future__ import annotations

from typing import Any

import psycopg

from pgqueue.models import Tier
from tests.db.drr_support import add_jobs, claim, ref_take, reference
from tests.db.test_drr_explain import _load_auto_explain, _log_plans

C = Tier.CRITICAL
#: The statement that moves an ended turn's pair to the tail and loads the next round head.
_HEAD_LOAD = "WITH rotated AS ("


def _claim_logging_statements(dsn: str, limit: int) -> tuple[list[int], list[str]]:
    """The job ids one pgqueue.claim of ``limit`` takes, and the statements it ran."""
    plans: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as c:
        _load_auto_explain(c)
        _log_plans(c, plans)
        rows: list[tuple[Any, ...]] = c.execute(
            "SELECT id FROM pgqueue.claim(%s, 'prefetch', 60)", (limit,)
        ).fetchall()
    return [r[0] for r in rows], plans


def test_a_claim_loads_the_pairs_its_tier_needs_up_front(conn, db_dsn):
    ref = reference(conn)
    add_jobs(conn, [(C, f"t{i % 10}", 1.0) for i in range(200)], ref)
    assert [d.job_id for d in claim(conn, 1)] == [d.job_id for d in ref_take(ref, 1)]
    # 10 backlogged tenants, quantum 5, the round head 4 credits into its turn: a claim of 30
    # takes 7 turns. The critical tier is the only one in use, so its share is the whole
    # claim: the first load reads 7 pairs (34 credits), and no turn loads its head. Before
    # revision 0025 the first load read 2 pairs, and 5 turns loaded their heads.
    ids, statements = _claim_logging_statements(db_dsn, 30)
    assert ids == [d.job_id for d in ref_take(ref, 30)]
    head_loads = [s for s in statements if _HEAD_LOAD in s]
    assert head_loads == []


def test_a_claim_that_folds_new_work_in_loads_its_rounds_in_one_statement(conn, db_dsn):
    """Revision 0026: under a steady stream of enqueues nearly every claim folds the inbox;
    before, such a claim loaded each tier's round head with a statement of its own."""
    ref = reference(conn)
    tiers = (C, Tier.STANDARD, Tier.BATCH)
    add_jobs(conn, [(tiers[i % 3], f"t{i % 10}", 1.0) for i in range(300)], ref)
    assert [d.job_id for d in claim(conn, 10)] == [d.job_id for d in ref_take(ref, 10)]
    add_jobs(conn, [(tiers[i % 3], f"t{i % 10}", 1.0) for i in range(30)], ref)  # new work
    ids, statements = _claim_logging_statements(db_dsn, 10)
    assert ids == [d.job_id for d in ref_take(ref, 10)]
    assert any("DELETE FROM pgqueue.drr_inbox" in s for s in statements)  # it folded
    head_loads = [s for s in statements if _HEAD_LOAD in s]
    assert len(head_loads) <= 1, head_loads


def test_a_tiny_base_quantum_does_not_break_the_claim(conn):
    """Found by a fresh tester: the pairs to read, ceil(share / base quantum) + 1, was cast to
    an integer before it was capped, so a base quantum set far below the tenants' floor of
    0.001 made every claim fail ("integer out of range"); revision 0024 claimed as usual (the
    round skip of revision 0022 serves such jobs)."""
    add_jobs(conn, [(Tier.BATCH, "a", 1.0), (Tier.BATCH, "b", 1.0)])
    conn.execute("SET pgqueue.default_quantum = '0.000000001'")
    rows = conn.execute("SELECT (claimed).tenant_id FROM pgqueue.drr_dispatch(10, 'w', 60)")
    assert sorted(r[0] for r in rows.fetchall()) == ["a", "b"]
