"""Revision 0028: the turns that end without serving are taken in memory, over the round's
next pairs read at once, with the decisions of the turns one by one (revision 0027). The
decisions are checked against the reference scheduler; the statements against the counts
revision 0027 ran."""

from __future__ import annotations

import random
from typing import Any

import psycopg

from pgqueue.models import Tier
from tests.db.drr_support import add_jobs, ref_take, reference, set_tenant
from tests.db.test_round_prefetch import _claim_logging_statements

C = Tier.CRITICAL


def test_turns_that_cannot_pay_take_a_few_statements_per_dispatch(conn, db_dsn):
    """10 tenants, quantum 1, jobs of 300-900 cost units: each dispatch needs hundreds of
    turns. Revision 0027 ran a statement per turn up to the round skip (64 per dispatch: 1,389
    statements in this claim of 20); revision 0028 runs 116."""
    for n in range(10):
        set_tenant(conn, f"t{n}", quantum=1.0)
    conn.commit()
    ref = reference(conn)
    rng = random.Random(7)
    add_jobs(conn, [(C, f"t{n % 10}", float(rng.randint(300, 900))) for n in range(40)], ref)
    ids, statements = _claim_logging_statements(db_dsn, 20)
    assert ids == [d.job_id for d in ref_take(ref, 20)]
    assert len(statements) <= 20 * 12, len(statements)


def test_a_round_read_whole_comes_round_again_in_memory(conn, db_dsn):
    """Two tenants, quantum 1, costs of 21 and 20: their turns alternate in memory, the round
    read once, until one can pay at its 20th or 21st turn (before the round skip, which comes
    at a dispatch's 64th turn). This claim ran 61 statements at revision 0027, 28 at 0028."""
    set_tenant(conn, "a", quantum=1.0)
    set_tenant(conn, "b", quantum=1.0)
    conn.commit()
    ref = reference(conn)
    add_jobs(conn, [(C, "a", 21.0), (C, "b", 20.0), (C, "a", 1.0)], ref)
    ids, statements = _claim_logging_statements(db_dsn, 3)
    assert ids == [d.job_id for d in ref_take(ref, 3)]
    assert len(statements) <= 36, len(statements)
    assert conn.execute("SELECT count(*) FROM pgqueue.deficits").fetchone() == (0,)


def _payers_every(c: psycopg.Connection[Any], period: int, *, tenants: int, jobs: int) -> None:
    """One tier, ``tenants`` tenants of ``jobs`` jobs: in round order ``period`` - 1 pairs
    that cannot pay (quantum 0.01, cost 5,000), then one that pays a job per turn (quantum 1,
    cost 1), and so on; committed."""
    names = [f"t{n:04d}" for n in range(tenants)]
    add_jobs(c, [(C, t, 1.0) for t in names for _ in range(jobs)])
    c.execute("SELECT count(*) FROM pgqueue.claim(0, 'fold', 60)")
    order = [
        r[0]
        for r in c.execute(
            # the order the waiting pairs join the round in (revision 0023)
            "SELECT tenant_id FROM pgqueue.deficits WHERE tier = 'critical' "
            'ORDER BY refill_offset, tenant_id COLLATE "C"'
        )
    ]
    for i, tenant in enumerate(order):
        quantum, cost = (1.0, 1.0) if i % period == period - 1 else (0.01, 5000.0)
        set_tenant(c, tenant, quantum=quantum)
        c.execute("UPDATE pgqueue.jobs SET cost = %s WHERE tenant_id = %s", (cost, tenant))
    c.commit()


def test_a_dispatch_whose_third_pair_pays_reads_about_one_pair(conn, db_dsn):
    """Found by a fresh tester: the first read of a dispatch took as many pairs as the reads
    before it had grown to (up to 62), each with its next job locked until the claim ended,
    where the third pair of every dispatch pays. 300 tenants, in round order two pairs that
    cannot pay (quantum 0.01, cost 5,000), then one that pays a job per turn (quantum 1, cost
    1): now the first read takes as many pairs as the tier's last run in memory took turns,
    plus one (at least two), and no run starts before a dispatch's fourth such turn."""
    _payers_every(conn, 3, tenants=300, jobs=3)
    with psycopg.connect(db_dsn) as claimer:
        claimed = claimer.execute("SELECT id FROM pgqueue.claim(20, 'w', 60)").fetchall()
        assert len(claimed) == 20
        # the queued jobs the claim holds locked, seen from another session before it commits
        locked = conn.execute(
            "SELECT count(*) FROM pgqueue.jobs WHERE state = 'queued' AND id NOT IN "
            "(SELECT id FROM pgqueue.jobs WHERE state = 'queued' FOR UPDATE SKIP LOCKED)"
        ).fetchone()
        claimer.rollback()
    conn.rollback()
    # the 20 jobs taken and the next due job of each pair looked at: 80 at revision 0027, 81
    # here (a read takes at least two pairs), 140 when every read took as many as the last
    assert locked is not None and locked[0] <= 85, locked


#: Statements of revision 0027's claim in the test below (measured on the old chain before it
#: was replaced by the baseline; the count does not depend on timing).
STATEMENTS_AT_0027 = 72


def test_where_every_second_pair_pays_no_more_statements_than_0027(db_dsn):
    """Found by a second fresh tester: a run in memory from a dispatch's third turn handed a
    pair that pays back with one job buffered, where a head load buffers the jobs its credit
    covers, so its next dispatch fetched again: about one statement more per dispatch than
    revision 0027 (311 against 212 in their claim of 100)."""
    with psycopg.connect(db_dsn) as c:
        _payers_every(c, 2, tenants=20, jobs=10)
    ids, statements = _claim_logging_statements(db_dsn, 30)
    assert len(ids) == 30
    assert len(statements) <= STATEMENTS_AT_0027, len(statements)
