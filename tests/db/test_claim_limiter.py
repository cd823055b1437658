"""Revision 0030: a claim passes over the jobs of a model the provider's limits stop.

Found by a fresh tester: one model in cooldown made every claim come back empty, for every
tenant, model and kind, while jobs that could be sent were due (the contract: no claim comes
back empty while any eligible job exists).
"""

from __future__ import annotations

from typing import Any

import psycopg

import pgqueue
from pgqueue import JobSpec
from pgqueue.db import queries
from pgqueue.handlers.registry import NOOP_KIND as NOOP
from tests.db.drr_support import allow_requests

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


def _three_kinds(dsn: str) -> None:
    """Tenant A's jobs on a model in cooldown come first in the round; B's are on another
    model, C's are no-op jobs (never sent)."""
    with psycopg.connect(dsn) as c:
        c.execute("SELECT pgqueue.ratelimit_cooldown('slow', 120)")
        pgqueue.enqueue_many(
            c,
            [JobSpec("A", "user_action", _payload("slow")) for _ in range(3)]
            + [JobSpec("B", "user_action", _payload("fast")) for _ in range(3)]
            + [JobSpec("C", "user_action", {}, kind=NOOP) for _ in range(3)],
        )


def test_a_model_in_cooldown_does_not_stop_the_jobs_of_other_models_and_kinds(db_dsn):
    _three_kinds(db_dsn)
    with psycopg.connect(db_dsn, autocommit=True) as c:
        # claim_order knows nothing of the limiter: A's jobs are next there
        order = c.execute("SELECT tenant_id FROM pgqueue.claim_order LIMIT 3").fetchall()
        assert order == [("A",)] * 3
        first = _claim(c, 5)
        assert sorted(_jobs(first)) == [("B", "fast")] * 2 + [("C", None)] * 3
        assert _blocked(first) == []  # a full claim
        second = _claim(c, 5)
        assert _jobs(second) == [("B", "fast")]
        left = c.execute(
            "SELECT tenant_id, count(*) FROM pgqueue.jobs WHERE state = 'queued' GROUP BY 1"
        ).fetchall()
        assert left == [("A", 3)]
        # Only A's jobs are left: the claim says how long the model waits, and takes nothing;
        # the setting that told the dispatch which models to pass over is cleared before the
        # claim returns (it would steer a later dispatch of the same transaction).
        with psycopg.connect(db_dsn) as t:
            third = _claim(t, 5)
            assert t.execute("SELECT current_setting('pgqueue.claim_skip_models')").fetchone() == (
                "",
            )
        assert _jobs(third) == []
        assert len(_blocked(third)) == 1 and 100 < _blocked(third)[0] <= 120


def test_a_claim_that_finds_only_jobs_waiting_for_the_model_leaves_the_round_as_it_was(db_dsn):
    """One model in use (the usual case): a cooldown stops every due job, and the claim undoes
    its second dispatch too, so deficits, positions and the tier state stay as they were."""
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
        assert _round(c) == before
        assert c.execute("SELECT count(*) FROM pgqueue.jobs WHERE state = 'queued'").fetchone() == (
            8,
        )


def test_a_stop_at_a_later_job_takes_the_jobs_before_it_then_passes_over_its_model(db_dsn):
    """The limiter admits two requests of model m: the claim takes them, then fills the rest
    from the jobs of another model, in DRR order, and says how long m waits."""
    with psycopg.connect(db_dsn) as c:
        allow_requests(c, "m", 2)
        pgqueue.enqueue_many(
            c,
            [JobSpec("t0", "user_action", _payload("m")) for _ in range(4)]
            + [JobSpec("t1", "user_action", _payload("other")) for _ in range(4)],
        )
    with psycopg.connect(db_dsn, autocommit=True) as c:
        rows = _claim(c, 6)
        assert _jobs(rows) == [("t0", "m"), ("t0", "m")] + [("t1", "other")] * 4
        assert _blocked(rows) == []  # six asked, six taken
        rows = _claim(c, 6)
        assert _jobs(rows) == []
        assert len(_blocked(rows)) == 1 and 0 < _blocked(rows)[0] <= 60
        queued = c.execute(
            "SELECT tenant_id, model, count(*) FROM pgqueue.jobs WHERE state = 'queued'"
            " GROUP BY 1, 2"
        ).fetchall()
        assert queued == [("t0", "m", 2)]


def _solo(conn: Conn, jobs: list[str | None]) -> None:
    """One tenant with a quantum that covers every job in one turn, its jobs in this order:
    a model's name for a Messages API job of that model, None for a no-op job."""
    conn.execute("INSERT INTO pgqueue.tenants (tenant_id, quantum) VALUES ('solo', 100)")
    for model in jobs:
        if model is None:
            pgqueue.enqueue(conn, tenant_id="solo", origin="user_action", payload={}, kind=NOOP)
        else:
            pgqueue.enqueue(conn, tenant_id="solo", origin="user_action", payload=_payload(model))


def test_many_models_in_cooldown_ahead_cost_one_more_dispatch_not_the_claim(db_dsn):
    """Found by a fresh tester: with at most eight dispatches per claim, one model set aside
    each, eight models in cooldown ahead in the round left every claim empty. A stop now sets
    aside every model in cooldown."""
    with psycopg.connect(db_dsn) as c:
        _solo(c, [f"m{i}" for i in range(12)] + [None] * 3)
        for i in range(12):
            c.execute("SELECT pgqueue.ratelimit_cooldown(%s, 120)", (f"m{i}",))
    with psycopg.connect(db_dsn) as c:
        c.execute("SET track_functions = 'all'")
        rows = _claim(c, 3)  # in this transaction, to read its own function counts
        assert _jobs(rows) == [("solo", None)] * 3
        calls = c.execute(
            "SELECT calls FROM pg_stat_xact_user_functions WHERE funcname = 'drr_dispatch'"
        ).fetchall()
        assert calls == [(2,)]  # the stop, then one dispatch with all twelve set aside


def test_a_tenant_stopped_twice_waits_for_its_next_turn_and_the_others_go_on(db_dsn):
    """Found by fresh testers: with a fixed bound on dispatches and one model set aside per
    stop, four models with spent buckets cut a claim short, and one tenant's jobs on 70 such
    models left every claim empty. A tenant stopped a second time is now set aside."""
    with psycopg.connect(db_dsn) as c:
        _solo(c, [None, "q1", None, "q2", None, "q3"] + [None] * 6)
        for model in ("q1", "q2", "q3"):
            allow_requests(c, model, 0)
        pgqueue.enqueue_many(c, [JobSpec("other", "user_action", {}, kind=NOOP)] * 12)
    with psycopg.connect(db_dsn, autocommit=True) as c:
        rows = _claim(c, 10)
        assert _blocked(rows) == []  # ten asked, ten taken
        taken = _jobs(rows)
        assert taken.count(("solo", None)) == 2  # the no-op jobs before q1 and before q2
        assert taken.count(("other", None)) == 8


def test_one_tenants_jobs_on_many_spent_models_do_not_empty_the_claims(db_dsn):
    """The flooding tenant's jobs are critical, the other's batch: every dispatch starts
    with a job the limiter stops."""
    with psycopg.connect(db_dsn) as c:
        for i in range(70):  # more than the 64 dispatches a claim may run
            allow_requests(c, f"spent{i}", 0)
        pgqueue.enqueue_many(
            c,
            [JobSpec("flood", "user_action", _payload(f"spent{i}")) for i in range(70)]
            + [JobSpec("b", "batch_job", {}, kind=NOOP)] * 30,
        )
    with psycopg.connect(db_dsn, autocommit=True) as c:
        for _ in range(3):
            c.execute("UPDATE pgqueue.deficits SET due_at = now() WHERE pos IS NULL")
            rows = _claim(c, 10)
            assert _jobs(rows) == [("b", None)] * 10
