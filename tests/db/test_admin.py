"""`pgqueue retry`: bulk re-queue of failed jobs by tenant, tier, reason and time."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import pgqueue
from pgqueue.admin import requeue_failed

PAYLOAD = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def _fail_all(conn, error: str, where: str = "true") -> None:
    conn.execute(
        f"UPDATE pgqueue.jobs SET state = 'failed', attempts = 5, throttle_retries = 2,"
        f" finished_at = now(), last_error = %s WHERE {where}",
        (error,),
    )


def test_requeue_by_filters(conn):
    a = pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
    b = pgqueue.enqueue(conn, tenant_id="b", origin="batch_job", payload=PAYLOAD)
    c = pgqueue.enqueue(conn, tenant_id="b", origin="user_action", payload=PAYLOAD)
    _fail_all(conn, "HTTP 500: overloaded upstream", f"id IN ({a}, {b})")
    _fail_all(conn, "throttled: HTTP 429", f"id = {c}")
    assert requeue_failed(conn, tenant_id="nobody") == []
    assert requeue_failed(conn, tenant_id="b", reason="429") == [c]
    assert requeue_failed(conn, tier="batch") == [b]
    future = datetime.now(UTC) + timedelta(hours=1)
    assert requeue_failed(conn, since=future) == []
    assert requeue_failed(conn, until=future) == [a]
    rows = conn.execute(
        "SELECT state::text, attempts, throttle_retries, finished_at FROM pgqueue.jobs"
    ).fetchall()
    assert rows == [("queued", 0, 0, None)] * 3


def test_a_reason_is_a_literal_substring(conn):
    """Found by a tester: `--reason '%'` (or '_') re-queued every failed job: the reason went
    into ILIKE with its wildcards."""
    a = pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
    b = pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
    _fail_all(conn, "quota 100% used: a_b\\c", f"id = {a}")
    _fail_all(conn, "HTTP 500", f"id = {b}")
    for reason in ("%", "_", "\\", "100%", "A_B\\C"):  # only a's error holds them
        assert requeue_failed(conn, reason=reason) == [a], reason
        _fail_all(conn, "quota 100% used: a_b\\c", f"id = {a}")
    assert requeue_failed(conn, reason="x%") == []


def test_requeue_rejects_bad_filters(conn):
    with pytest.raises(pgqueue.InvalidArgument):
        requeue_failed(conn, tier="urgent")
    with pytest.raises(pgqueue.InvalidArgument):
        requeue_failed(conn, since=datetime(2020, 1, 1))
    with pytest.raises(pgqueue.InvalidArgument):
        requeue_failed(
            conn, since=datetime(2021, 1, 1, tzinfo=UTC), until=datetime(2020, 1, 1, tzinfo=UTC)
        )


def test_retry_cli(db_dsn):
    import psycopg

    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
        _fail_all(conn, "boom")
        conn.commit()
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from pgqueue.cli import app; app()",
            "retry",
            "--reason",
            "BOOM",
            "--dsn",
            db_dsn,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "re-queued 1" in out.stdout
    bad = subprocess.run(
        [
            sys.executable,
            "-c",
            "from pgqueue.cli import app; app()",
            "retry",
            "--tier",
            "urgent",
            "--dsn",
            db_dsn,
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "InvalidArgument" in bad.stderr


def test_prune_deletes_only_old_finished_jobs(db_dsn):
    import psycopg

    from pgqueue.admin import prune_finished

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        ids = [
            pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
            for _ in range(6)
        ]
        conn.execute(
            "UPDATE pgqueue.jobs SET state = 'succeeded', finished_at = now() - interval '2 days'"
            " WHERE id = ANY(%s)",
            (ids[:3],),
        )
        conn.execute(
            "UPDATE pgqueue.jobs SET state = 'failed', finished_at = now() - interval '1 hour'"
            " WHERE id = %s",
            (ids[3],),
        )
        conn.execute("UPDATE pgqueue.jobs SET state = 'running' WHERE id = %s", (ids[4],))
        assert prune_finished(conn, older_than_seconds=86_400, batch=2) == 3
        left = {r[0] for r in conn.execute("SELECT id FROM pgqueue.jobs")}
        assert left == set(ids[3:])
        assert prune_finished(conn, older_than_seconds=0) == 1  # the failed one
        with pytest.raises(pgqueue.InvalidArgument):
            prune_finished(conn, older_than_seconds=-1)


def test_the_known_plans_are_the_ones_sql_prices(conn) -> None:
    """`tenants set --plan` accepts drr.KNOWN_PLANS; pgqueue.plan_quantum (revision 0002)
    prices plans by name too. The two lists must agree, or a plan the CLI accepts would
    silently mean x1 (found by a tester: any name was accepted)."""
    from pgqueue.scheduling.drr import KNOWN_PLANS, PLAN_QUANTUM_MULTIPLIERS

    for plan in KNOWN_PLANS:
        row = conn.execute("SELECT pgqueue.plan_quantum(%s, NULL, 10.0)", (plan,)).fetchone()
        assert row[0] == 10.0 * PLAN_QUANTUM_MULTIPLIERS.get(plan, 1.0), plan


def _counters_match(conn) -> None:
    from pgqueue.db import queries

    counted = [r for r in queries.run(conn, "queue_counts_by_key") if r["queued"]]
    actual = queries.run(conn, "queue_counts_actual")

    def key(r):
        return (r["tier"], r["tenant_id"] or "", r["queued"])

    assert sorted(map(key, counted)) == sorted(map(key, actual))


def test_retry_one_job(conn):
    """pgqueue.retry (revision 0034): a failed or cancelled job goes back to the queue with
    fresh counters, is claimable, and is counted; any other state is left as it is."""
    from pgqueue.admin import retry_job

    failed = pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
    cancelled = pgqueue.enqueue(conn, tenant_id="b", origin="batch_job", payload=PAYLOAD)
    queued = pgqueue.enqueue(conn, tenant_id="b", origin="batch_job", payload=PAYLOAD)
    _fail_all(conn, "HTTP 500", f"id = {failed}")
    assert pgqueue.cancel(conn, cancelled, reason="oops") == "cancelled"
    assert retry_job(conn, failed) == "queued"
    assert retry_job(conn, cancelled) == "queued"
    assert retry_job(conn, queued) == "queued"  # was queued already: unchanged
    rows = conn.execute(
        "SELECT id, state::text, attempts, throttle_retries, finished_at FROM pgqueue.jobs"
        " ORDER BY id"
    ).fetchall()
    assert rows == [(i, "queued", 0, 0, None) for i in (failed, cancelled, queued)]
    _counters_match(conn)
    conn.commit()
    claimed = conn.execute("SELECT count(*) FROM pgqueue.claim(10, 'w', 60)").fetchone()
    assert claimed == (3,)


def test_retry_of_an_unknown_job(conn):
    from pgqueue.admin import retry_job

    job = pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
    conn.commit()
    with pytest.raises(pgqueue.UnknownJob, match="no job 999999"):
        retry_job(conn, 999_999)
    conn.rollback()
    with pytest.raises(psycopg.Error, match="of tenant 'b'") as raised:
        conn.execute("SELECT pgqueue.retry(%s, 'b')", (job,))
    assert raised.value.sqlstate == "PQ011"
    conn.rollback()
    with pytest.raises(pgqueue.InvalidArgument):
        retry_job(conn, 0)
