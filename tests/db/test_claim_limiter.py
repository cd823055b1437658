"""The provider's rate limiter at claim time (pgqueue.claim_admitted).

A lane is a rate-limit pool (the model of a Messages API job, else the kind): a model in
cooldown or out of tokens stops its own lane only, and the claim says how long it waits.
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

CLAIM = {"worker_id": "w", "lease_seconds": 30, "skip_kinds": []}


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
        "SELECT f::text FROM pgqueue.flows f UNION ALL SELECT c::text FROM pgqueue.cursors c"
        " UNION ALL SELECT j.id::text || ' ' || j.state FROM pgqueue.jobs j ORDER BY 1"
    ).fetchall()


def test_a_claim_stopped_by_a_cooldown_takes_nothing_and_leaves_the_round_as_it_was(db_dsn):
    """One model in use (the usual case): a cooldown stops every due job; the claim says how
    long the model waits and leaves the flows, the cursors and the jobs as they were."""
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


def test_a_model_in_cooldown_does_not_stop_the_jobs_of_other_models_and_kinds(db_dsn):
    """Across lanes, the highest tier first, then the lane whose head job came first (as
    pgqueue.scheduling.lanes.LaneScheduler): A's model waits, B's and C's lanes go on."""
    with psycopg.connect(db_dsn) as c:
        c.execute("SELECT pgqueue.ratelimit_cooldown('slow', 120)")
        pgqueue.enqueue_many(
            c,
            [JobSpec("A", "user_action", _payload("slow")) for _ in range(3)]
            + [JobSpec("B", "user_action", _payload("fast")) for _ in range(3)]
            + [JobSpec("C", "user_action", {}, kind=NOOP) for _ in range(3)],
        )
    with psycopg.connect(db_dsn, autocommit=True) as c:
        rows = _claim(c, 5)
        assert _jobs(rows) == [("B", "fast")] * 3 + [("C", None)] * 2
        assert _blocked(rows) == []  # five claimed: nothing to wait for
        rows = _claim(c, 5)
        assert _jobs(rows) == [("C", None)]
        assert len(_blocked(rows)) == 1 and 110 < _blocked(rows)[0] <= 120


def test_a_model_held_to_6_rpm_costs_another_model_nothing(db_dsn):
    """One model's requests bucket nearly spent (6 a minute, 1 left): the claim takes that
    one, then every job of the other model, and says when the first has room again."""
    with psycopg.connect(db_dsn) as c:
        c.execute(
            "INSERT INTO pgqueue.rate_limits (model, requests_per_minute, input_tokens_per_minute,"
            " output_tokens_per_minute, requests_available, input_tokens_available,"
            " output_tokens_available) VALUES ('slow', 6, 40000, 8000, 1, 40000, 8000)"
        )
        specs = []
        for i in range(5):
            specs += [JobSpec(f"s{i}", "user_action", _payload("slow"))]
            specs += [JobSpec(f"f{i}", "user_action", _payload("fast"))]
        pgqueue.enqueue_many(c, specs)
    with psycopg.connect(db_dsn, autocommit=True) as c:
        rows = _claim(c, 10)
        models = [model for _, model in _jobs(rows)]
        assert models.count("slow") == 1 and models.count("fast") == 5
        assert len(_blocked(rows)) == 1 and 0 < _blocked(rows)[0] <= 10


def test_only_a_claim_that_took_from_a_models_buckets_skips_its_wal_flush(db_dsn):
    """A claim of Messages API jobs holds the model's bucket rows until it commits, so it
    commits without waiting for its WAL flush and says so (`durable` false: the worker then
    runs job_claim_durable); any other claim is durable at its commit, with no second
    statement (that round trip and its flush cost a no-op claim half its time)."""
    with psycopg.connect(db_dsn) as c:
        pgqueue.enqueue_many(
            c,
            [JobSpec("A", "user_action", {}, kind=NOOP) for _ in range(3)]
            + [JobSpec("B", "scheduled", _payload("m")) for _ in range(3)],
        )
    with psycopg.connect(db_dsn, autocommit=True) as c:
        rows = _claim(c, 3)  # the critical no-op jobs first
        assert _jobs(rows) == [("A", None)] * 3
        assert all(r["durable"] for r in rows)
        rows = _claim(c, 3)
        assert _jobs(rows) == [("B", "m")] * 3
        assert not any(r["durable"] for r in rows)
        assert c.execute("SHOW synchronous_commit").fetchone() == ("on",)  # the claim's alone


def test_a_worker_leaves_the_lanes_of_kinds_it_cannot_run(db_dsn):
    """A worker with no API key claims with skip_kinds ['anthropic.messages']: the model's jobs
    stay queued with their keys, and nothing is taken from its buckets (before, such a worker
    claimed them, took their requests and tokens, and put them back unrun for 60 s)."""
    with psycopg.connect(db_dsn) as c:
        allow_requests(c, "m", 5)
        pgqueue.enqueue_many(
            c,
            [JobSpec("A", "user_action", _payload("m")) for _ in range(2)]
            + [JobSpec("B", "scheduled", {}, kind=NOOP) for _ in range(2)],
        )
    with psycopg.connect(db_dsn, autocommit=True) as c:
        params = {"limit": 10, **CLAIM, "skip_kinds": ["anthropic.messages"]}
        assert _jobs(queries.run(c, "job_claim", params)) == [("B", None)] * 2
        assert c.execute("SELECT requests_available FROM pgqueue.rate_limits").fetchone() == (5,)
        assert _jobs(_claim(c, 10)) == [("A", "m")] * 2  # a worker that can run them
