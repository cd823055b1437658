"""The provider's rate limiter at claim time (pgqueue.claim_admitted).

A known limitation, found by a fresh tester and not fixed: the claim stops at the first job
the limiter cannot admit, so while one model is in cooldown (after a 429) or its buckets are
spent, jobs of other models and kinds queued behind its jobs in DRR order wait too. A fix that
passed over such jobs in the dispatch was tried and withdrawn: its scans of the jobs passed
over grew with the queue (a claim under the scheduler's lock went from 2.5 ms to 0.3 s with
200,000 jobs on the cooled model), and it let tenants on many spent models empty claims.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue import JobSpec
from pgqueue.db import queries
from pgqueue.handlers.registry import NOOP_KIND as NOOP

Conn = psycopg.Connection[Any]

CLAIM = {"worker_id": "w", "lease_seconds": 30}


def _payload(model: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def _claim(conn: Conn, limit: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = queries.run(conn, "job_claim", {"limit": limit, **CLAIM})
    return rows


def _jobs(rows: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(r["tenant_id"], r["model"]) for r in rows if r["id"] is not None]


def _blocked(rows: list[dict[str, Any]]) -> list[float]:
    return [float(r["blocked_seconds"]) for r in rows if r["id"] is None]


def _round(conn: Conn) -> list[Any]:
    """The scheduler's state, as text (its timestamps may be infinite)."""
    return conn.execute(
        "SELECT d::text FROM pgqueue.deficits d UNION ALL SELECT s::text FROM pgqueue.tier_state s"
        " ORDER BY 1"
    ).fetchall()


def test_a_claim_stopped_by_a_cooldown_takes_nothing_and_leaves_the_round_as_it_was(db_dsn):
    """One model in use (the usual case): a cooldown stops every due job; the claim says how
    long the model waits and undoes its dispatch, so deficits, positions and the tier state
    stay as they were."""
    with psycopg.connect(db_dsn) as c:
        pgqueue.enqueue_many(
            c, [JobSpec(f"t{i % 3}", "user_action", _payload("m")) for i in range(12)]
        )
    with psycopg.connect(db_dsn, autocommit=True) as c:
        assert len(_jobs(_claim(c, 4))) == 4  # a round under way
        c.execute("SELECT pgqueue.ratelimit_cooldown('m', 60)")
        before = _round(c)
        rows = _claim(c, 4)
        assert _jobs(rows) == [] and len(_blocked(rows)) == 1
        assert 50 < _blocked(rows)[0] <= 60
        assert _round(c) == before


@pytest.mark.xfail(strict=True, reason="known limitation: a stopped job stops the claim")
def test_a_model_in_cooldown_does_not_stop_the_jobs_of_other_models_and_kinds(db_dsn):
    with psycopg.connect(db_dsn) as c:
        c.execute("SELECT pgqueue.ratelimit_cooldown('slow', 120)")
        pgqueue.enqueue_many(
            c,
            [JobSpec("A", "user_action", _payload("slow")) for _ in range(3)]
            + [JobSpec("B", "user_action", _payload("fast")) for _ in range(3)]
            + [JobSpec("C", "user_action", {}, kind=NOOP) for _ in range(3)],
        )
    with psycopg.connect(db_dsn, autocommit=True) as c:
        order = c.execute("SELECT tenant_id FROM pgqueue.claim_order LIMIT 3").fetchall()
        assert order == [("A",)] * 3  # A's jobs come first in the round
        assert sorted(_jobs(_claim(c, 5))) == [("B", "fast")] * 2 + [("C", None)] * 3
