"""Budgets and automatic demotion: throttles or spend demote a tenant to batch, for a while."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgqueue
from pgqueue.db import queries
from pgqueue.scheduling.demotion import DemotionRule, demotion_reason
from pgqueue.worker.completer import success_batch

PAYLOAD = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def _claim_one(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    [row] = queries.run(
        conn, "job_claim", {"limit": 1, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []}
    )
    return row


def _throttle(conn: psycopg.Connection[Any], job: dict[str, Any]) -> str:
    row = queries.run(
        conn,
        "job_throttle",
        {
            "id": job["id"],
            "tenant_id": job["tenant_id"],
            "lease_token": job["lease_token"],
            "error": "HTTP 429",
            "wait_seconds": 0.0,
            "status_code": 429,
            "retry_after_seconds": 1.0,
            "max_throttle_wait_seconds": None,
        },
    )
    return str(row["state"])


def _priority_of_new_job(conn: psycopg.Connection[Any], tenant: str) -> str:
    job_id = pgqueue.enqueue(conn, tenant_id=tenant, origin="user_action", payload=PAYLOAD)
    return conn.execute(
        "SELECT priority::text FROM pgqueue.jobs WHERE id = %s", (job_id,)
    ).fetchone()[0]


def test_five_throttles_in_a_minute_demote_the_tenant(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.enqueue(conn, tenant_id="runaway", origin="user_action", payload=PAYLOAD)
        pgqueue.enqueue(conn, tenant_id="calm", origin="user_action", payload=PAYLOAD)
        for n in range(5):
            job = _claim_one(conn)
            if job["tenant_id"] == "calm":  # the calm tenant's job just succeeds
                queries.run(
                    conn,
                    "job_complete",
                    {
                        "id": job["id"],
                        "tenant_id": "calm",
                        "lease_token": job["lease_token"],
                        "result": None,
                        "input_tokens": None,
                        "output_tokens": None,
                    },
                )
                job = _claim_one(conn)
            _throttle(conn, job)
            demoted = conn.execute("SELECT pgqueue.is_demoted('runaway')").fetchone()[0]
            assert demoted is (n == 4), f"after {n + 1} throttle events"
        reason, seconds = conn.execute(
            "SELECT reason, extract(epoch FROM expires_at - demoted_at) FROM pgqueue.demotions"
            " WHERE tenant_id = 'runaway'"
        ).fetchone()
        assert "5 throttle events" in reason
        assert float(seconds) == pytest.approx(300.0)
        assert _priority_of_new_job(conn, "runaway") == "batch"
        assert _priority_of_new_job(conn, "calm") == "critical"
        assert conn.execute("SELECT count(*) FROM pgqueue.demotions").fetchone()[0] == 1


def test_old_throttles_do_not_count(conn):
    pgqueue.enqueue(conn, tenant_id="t", origin="user_action", payload=PAYLOAD)
    conn.execute("SET session_replication_role = replica")  # seed without triggers
    conn.execute(
        "INSERT INTO pgqueue.throttle_events (tenant_id, status_code, occurred_at)"
        " SELECT 't', 429, now() - interval '2 minutes' FROM generate_series(1, 10)"
    )
    conn.execute("SET session_replication_role = origin")
    conn.execute("INSERT INTO pgqueue.throttle_events (tenant_id, status_code) VALUES ('t', 429)")
    assert conn.execute("SELECT pgqueue.is_demoted('t')").fetchone()[0] is False


def test_demotion_expires_by_itself(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SET pgqueue.demotion_seconds = 0.3")
        conn.execute("SET pgqueue.demotion_throttle_threshold = 1")
        pgqueue.enqueue(conn, tenant_id="r", origin="user_action", payload=PAYLOAD)
        _throttle(conn, _claim_one(conn))
        assert _priority_of_new_job(conn, "r") == "batch"
        deadline = time.monotonic() + 10
        while conn.execute("SELECT pgqueue.is_demoted('r')").fetchone()[0]:
            assert time.monotonic() < deadline, "demotion did not expire"
            time.sleep(0.05)
        assert _priority_of_new_job(conn, "r") == "critical"
        # a new offence demotes again: one active demotion at a time, history kept
        _throttle(conn, _claim_one(conn))
        assert conn.execute("SELECT count(*) FROM pgqueue.demotions").fetchone()[0] == 2


def _complete_with_usage(conn, tokens: int, tenant: str = "spender") -> None:
    pgqueue.enqueue(conn, tenant_id=tenant, origin="scheduled", sla_seconds=60, payload=PAYLOAD)
    job = _claim_one(conn)
    changed = queries.run(
        conn,
        "job_complete",
        {
            "id": job["id"],
            "tenant_id": job["tenant_id"],
            "lease_token": job["lease_token"],
            "result": None,
            "input_tokens": tokens,
            "output_tokens": 10,
        },
    )
    assert changed == 1


def test_usage_is_charged_per_day(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _complete_with_usage(conn, 1000)
        _complete_with_usage(conn, 2500)
        row = conn.execute(
            "SELECT requests, input_tokens, output_tokens, day = (now() AT TIME ZONE 'UTC')::date"
            " FROM pgqueue.usage_daily WHERE tenant_id = 'spender'"
        ).fetchone()
    assert row == (2, 3500, 20, True)


def test_over_150_percent_of_the_daily_budget_demotes(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        queries.run(
            conn,
            "tenant_upsert",
            {"tenant_id": "spender", "plan": None, "quantum": None, "daily_token_budget": 10_000},
        )
        _complete_with_usage(conn, 15_000)  # exactly 150 %: not over
        assert conn.execute("SELECT pgqueue.is_demoted('spender')").fetchone()[0] is False
        _complete_with_usage(conn, 1)
        reason = conn.execute(
            "SELECT reason FROM pgqueue.demotions WHERE tenant_id = 'spender'"
        ).fetchone()[0]
        assert "over 1.5 × the daily budget of 10000" in reason
        assert _priority_of_new_job(conn, "spender") == "batch"


def test_demote_queued_standard_jobs_when_configured(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SET pgqueue.demote_queued_jobs = on")
        conn.execute("SET pgqueue.demotion_throttle_threshold = 1")
        pgqueue.enqueue(conn, tenant_id="r", origin="user_action", payload=PAYLOAD)
        for _ in range(3):
            pgqueue.enqueue(
                conn, tenant_id="r", origin="scheduled", sla_seconds=60, payload=PAYLOAD
            )
        _throttle(conn, _claim_one(conn))  # the critical job is claimed first
        tiers = conn.execute(
            "SELECT priority::text, count(*) FROM pgqueue.jobs WHERE state = 'queued'"
            " GROUP BY 1 ORDER BY 1"
        ).fetchall()
        assert tiers == [("critical", 1), ("batch", 3)] or tiers == [("batch", 3), ("critical", 1)]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    throttles=st.integers(0, 7),
    tokens=st.integers(0, 400_000),
    budget=st.one_of(st.none(), st.integers(0, 250_000)),
)
def test_sql_rule_matches_the_reference(conn, throttles, tokens, budget):
    conn.execute(
        "DELETE FROM pgqueue.demotions; DELETE FROM pgqueue.throttle_events;"
        " DELETE FROM pgqueue.usage_daily; DELETE FROM pgqueue.tenants"
    )
    conn.execute(
        "INSERT INTO pgqueue.tenants (tenant_id, daily_token_budget) VALUES ('x', %s)", (budget,)
    )
    conn.execute("SET session_replication_role = replica")
    conn.execute(
        "INSERT INTO pgqueue.throttle_events (tenant_id, status_code)"
        " SELECT 'x', 429 FROM generate_series(1, %s)",
        (throttles,),
    )
    conn.execute(
        "INSERT INTO pgqueue.usage_daily (tenant_id, day, input_tokens)"
        " VALUES ('x', pgqueue.budget_day(), %s)",
        (tokens,),
    )
    conn.execute("SET session_replication_role = origin")
    sql = conn.execute("SELECT pgqueue.demotion_check('x')").fetchone()[0]
    ref = demotion_reason(
        DemotionRule(),
        throttles_in_window=throttles,
        input_tokens_today=tokens,
        daily_budget_tokens=budget,
    )
    assert (sql is None) == (ref is None)


def test_concurrent_batched_completions_do_not_deadlock_on_usage(db_dsn):
    """Two workers completing batches that touch the same tenants in opposite orders."""
    import threading

    tenants = [f"u{i:02d}" for i in range(40)]
    errors: list[BaseException] = []
    for _round in range(25):
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM pgqueue.jobs")
            pgqueue.enqueue_many(
                conn, [pgqueue.JobSpec(t, "scheduled", {}, 60, "pgqueue.noop") for t in tenants * 2]
            )
            claimed = queries.run(
                conn,
                "job_claim",
                {"limit": 100, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []},
            )
        by_tenant = sorted(claimed, key=lambda j: j["tenant_id"])
        halves = [by_tenant[::2], by_tenant[1::2][::-1]]  # same tenants, opposite orders
        barrier = threading.Barrier(2)

        def complete(jobs: list[dict[str, Any]], barrier: threading.Barrier = barrier) -> None:
            try:
                with psycopg.connect(db_dsn, autocommit=True) as conn:
                    barrier.wait(timeout=10)
                    queries.run(
                        conn,
                        "job_complete_many",
                        success_batch(
                            (j["id"], j["tenant_id"], j["lease_token"], None, 10, 1) for j in jobs
                        ),
                    )
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=complete, args=(h,)) for h in halves]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert not errors, errors[:2]
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute(
            "SELECT sum(requests), sum(input_tokens) FROM pgqueue.usage_daily"
        ).fetchone() == (25 * 80, 25 * 800)
