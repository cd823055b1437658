"""Revision 0017: a claim counts its own jobs, into claim rows that only claims write.

The queued counters must stay exact (the sum over a key's rows equals count(*) of its queued
jobs in every snapshot), a claim must never wait on a counter row, and the update trigger must
skip exactly the claim's own batch write: not a later write in the same transaction, not a
claim attempt that the rate limiter rolled back.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue import JobSpec
from pgqueue.db import queries
from pgqueue.handlers.registry import NOOP_KIND as NOOP
from tests.db.drr_support import allow_requests

Conn = psycopg.Connection[Any]

PAYLOAD = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
CLAIM = {"worker_id": "w", "lease_seconds": 30}


def _fill(dsn: str, n: int, tenants: int = 3) -> None:
    with psycopg.connect(dsn) as c:
        pgqueue.enqueue_many(
            c,
            [
                JobSpec(
                    f"t{i % tenants}", ("user_action", "scheduled")[i % 2], PAYLOAD, 60, kind=NOOP
                )
                for i in range(n)
            ],
        )


def _mismatches(conn: Conn) -> list[Any]:
    """Keys whose counters differ from count(*), both read in ONE statement (one snapshot)."""
    return conn.execute(
        """
        SELECT c.tier, c.tenant_id, c.n, j.n
        FROM (SELECT tier, tenant_id, sum(queued) AS n FROM pgqueue.queue_counts
              GROUP BY tier, tenant_id HAVING sum(queued) <> 0) c
        FULL JOIN (SELECT priority AS tier, tenant_id, count(*) AS n FROM pgqueue.jobs
                   WHERE state = 'queued'
                   GROUP BY GROUPING SETS ((priority, tenant_id), (priority))) j
          ON j.tier = c.tier AND j.tenant_id IS NOT DISTINCT FROM c.tenant_id
        WHERE c.n IS DISTINCT FROM j.n
        """
    ).fetchall()


def _claim_rows(conn: Conn) -> int:
    return conn.execute("SELECT count(*) FROM pgqueue.queue_counts WHERE claim_stripe").fetchone()[
        0
    ]


def test_claims_count_into_one_row_per_key(db_dsn):
    _fill(db_dsn, 60)
    with psycopg.connect(db_dsn, autocommit=True) as c:
        for _ in range(4):
            assert len(queries.run(c, "job_claim", {"limit": 10, **CLAIM})) == 10
        assert _mismatches(c) == []
        keys = c.execute(
            "SELECT count(*) FROM (SELECT DISTINCT priority, tenant_id FROM pgqueue.jobs"
            " WHERE state = 'running') k"
        ).fetchone()[0]
        tiers = c.execute(
            "SELECT count(DISTINCT priority) FROM pgqueue.jobs WHERE state = 'running'"
        ).fetchone()[0]
        assert _claim_rows(c) == keys + tiers  # one per key claimed from, whatever the claims
        assert c.execute("SELECT current_setting('pgqueue.claim_counted', true)").fetchone()[0] in (
            None,
            "",
        )


def test_a_write_after_a_claim_in_the_same_transaction_is_counted(db_dsn):
    """The mark that makes the update trigger skip the claim's batch write is cleared right
    after it: a cancel, a requeue or a claim-like UPDATE later in the same transaction is
    counted by the trigger as before."""
    _fill(db_dsn, 12)
    with psycopg.connect(db_dsn) as c:
        claimed = c.execute("SELECT id FROM pgqueue.claim(3, 'w', 30)").fetchall()
        assert len(claimed) == 3
        c.execute(
            "UPDATE pgqueue.jobs SET state = 'cancelled', finished_at = now()"
            " WHERE id = (SELECT min(id) FROM pgqueue.jobs WHERE state = 'queued')"
        )
        c.execute(
            "UPDATE pgqueue.jobs SET state = 'running', attempts = 1, started_at = now(),"
            " lease_expires_at = now() + interval '30 seconds', lease_token = gen_random_uuid()"
            " WHERE id = (SELECT max(id) FROM pgqueue.jobs WHERE state = 'queued')"
        )
        c.execute("UPDATE pgqueue.jobs SET state = 'queued' WHERE id = %s", (claimed[0][0],))
        assert _mismatches(c) == []
        c.commit()
    with psycopg.connect(db_dsn, autocommit=True) as c:
        assert _mismatches(c) == []
        assert c.execute("SELECT count(*) FROM pgqueue.jobs WHERE state = 'queued'").fetchone() == (
            12 - 3 - 1 - 1 + 1,
        )


def test_a_claim_the_rate_limiter_rolls_back_is_not_counted(db_dsn):
    """claim_admitted undoes a dispatch that the provider's limits stop (a subtransaction):
    the counts written by that attempt go with it, and the retry counts only what it keeps."""
    with psycopg.connect(db_dsn) as c:
        allow_requests(c, "m", 2)
        pgqueue.enqueue_many(
            c,
            [
                JobSpec(f"t{i % 2}", "user_action", PAYLOAD, kind="anthropic.messages")
                for i in range(6)
            ],
        )
        c.commit()
    with psycopg.connect(db_dsn, autocommit=True) as c:
        rows = queries.run(c, "job_claim", {"limit": 5, **CLAIM})
        assert [r["id"] is not None for r in rows] == [True, True, False]  # 2, then blocked
        assert _mismatches(c) == []
        assert c.execute("SELECT count(*) FROM pgqueue.jobs WHERE state = 'queued'").fetchone() == (
            4,
        )


def test_claim_rows_never_make_a_claim_wait(db_dsn):
    """A producer whose open transaction enqueued and folded the counters (so it holds every
    row it could lock) does not block the next claim: claim rows are never locked by
    producers or the compactor."""
    _fill(db_dsn, 30)
    with psycopg.connect(db_dsn, autocommit=True) as worker:
        assert len(queries.run(worker, "job_claim", {"limit": 5, **CLAIM})) == 5  # claim rows
        assert _claim_rows(worker) > 0
        with psycopg.connect(db_dsn) as producer:
            _fill_in(producer)
            producer.execute("SELECT pgqueue.queue_counts_compact()")
            worker.execute("SET lock_timeout = '2s'")
            assert len(queries.run(worker, "job_claim", {"limit": 5, **CLAIM})) == 5
            producer.commit()
        assert _mismatches(worker) == []


def _fill_in(conn: Conn) -> None:
    pgqueue.enqueue(conn, tenant_id="t0", origin="user_action", payload=PAYLOAD, kind=NOOP)


def test_handing_claim_rows_over_waits_for_a_claim_under_way(db_dsn):
    """queue_counts_release_claims takes the scheduler's lock: it never changes a claim row
    while a claim that wrote it is still open."""
    _fill(db_dsn, 10)
    with psycopg.connect(db_dsn) as claimer, psycopg.connect(db_dsn, autocommit=True) as other:
        assert len(claimer.execute("SELECT id FROM pgqueue.claim(4, 'w', 30)").fetchall()) == 4
        other.execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            queries.run(other, "queue_counts_release_claims")
        claimer.commit()
        assert queries.run(other, "queue_counts_release_claims")["released"] > 0
        assert _claim_rows(other) == 0
        queries.run(other, "queue_counts_compact", {"max_rows": 1000})
        assert _mismatches(other) == []


def test_the_mark_set_outside_a_claim_switches_nothing_off(db_dsn):
    """Found by a tester: while the mark was the value 'on', a session (or a role, or a
    database) that set pgqueue.claim_counted made the update trigger skip every write of its
    own, and the counters drifted until a rebuild. The mark now names the claim's transaction."""
    _fill(db_dsn, 12)
    with psycopg.connect(db_dsn, autocommit=True) as c:
        cancel_two = (
            "UPDATE pgqueue.jobs SET state = 'cancelled', finished_at = now()"
            " WHERE id IN (SELECT id FROM pgqueue.jobs WHERE state = 'queued' LIMIT 2)"
        )
        c.execute("SET pgqueue.claim_counted = 'on'")  # what the mark used to be
        c.execute(cancel_two)
        assert _mismatches(c) == []
        xid = c.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        # a past transaction's id, set for the session
        c.execute("SELECT set_config('pgqueue.claim_counted', %s, false)", (xid,))
        c.execute(cancel_two)
        assert _mismatches(c) == []
        assert len(queries.run(c, "job_claim", {"limit": 3, **CLAIM})) == 3
        c.execute(
            "UPDATE pgqueue.jobs SET state = 'cancelled', finished_at = now()"
            " WHERE id IN (SELECT id FROM pgqueue.jobs WHERE state = 'queued' LIMIT 1)"
        )
        assert _mismatches(c) == []
