"""Revision 0015: what the SQL entry points refuse, and how they name it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import psycopg
import pytest
from psycopg.types.json import Jsonb

import pgqueue
from pgqueue.validation import RUN_AT_MAX, RUN_AT_MIN

PAYLOAD = {
    "model": "claude-haiku-4-5",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "hi"}],
}


@pytest.mark.parametrize(
    "when", ["infinity", "-infinity", "294276-12-31 23:59:59+00", "4000-01-01 BC", "10000-01-01"]
)
def test_sql_enqueue_refuses_a_run_at_python_cannot_hold_and_keeps_what_is_stored(
    db_dsn: str, when: str
) -> None:
    """Found in review: `run_at => 'infinity'` stored a job that could never be due; a tester
    then stored one in the year 294276, which psycopg could not read back."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("SELECT pgqueue.enqueue('t1', 'user_action', %s)", (Jsonb(PAYLOAD),))
        with pytest.raises(psycopg.errors.CheckViolation, match="jobs_run_at_range"):
            c.execute(
                "SELECT pgqueue.enqueue('t1', 'user_action', %s, run_at => %s::timestamptz)",
                (Jsonb(PAYLOAD), when),
            )
        with pytest.raises(psycopg.errors.CheckViolation, match="jobs_run_at_range"):
            c.execute("UPDATE pgqueue.jobs SET run_at = %s::timestamptz", (when,))
        assert c.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (1,)
        c.execute("SELECT run_at FROM pgqueue.jobs").fetchall()  # readable by Python
        assert c.execute("SELECT sum(queued) FROM pgqueue.queue_counts").fetchone() == (2,)


def test_sql_batch_errors_name_the_bad_job(db_dsn: str) -> None:
    """Found in review: a SQL batch error did not say which of its jobs was bad."""
    good = Jsonb(PAYLOAD)
    with psycopg.connect(db_dsn, autocommit=True) as c:
        with pytest.raises(psycopg.Error) as single:
            c.execute("SELECT pgqueue.enqueue('t1', 'nope', %s)", (good,))
        with pytest.raises(psycopg.Error) as caught:
            c.execute(
                "SELECT pgqueue.enqueue_many(%s, %s, %s)",
                (["t1", "t1", "t1"], ["user_action", "user_action", "nope"], [good] * 3),
            )
        assert str(caught.value.diag.message_primary).startswith(
            "job #3 of the batch (counting from 1): "
        )
        assert "unknown origin 'nope'" in str(caught.value)
        assert caught.value.sqlstate == single.value.sqlstate
        with pytest.raises(psycopg.Error) as empty:
            c.execute(
                "SELECT pgqueue.enqueue_many(%s, %s, %s)",
                (["t1", ""], ["user_action", "user_action"], [good] * 2),
            )
        assert empty.value.sqlstate == "PQ006"  # the job's own SQLSTATE is kept
        assert str(empty.value.diag.message_primary).startswith(
            "job #2 of the batch (counting from 1): tenant_id"
        )
        assert c.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (0,)


@pytest.mark.parametrize(
    "when",
    [
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(1, 1, 1, 23, 59, tzinfo=UTC),
        datetime(1, 1, 2, 0, 30, tzinfo=timezone(timedelta(hours=1))),  # 0001-01-01 in UTC
        datetime(9999, 12, 30, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-5))),  # after 9999 in UTC
    ],
)
def test_python_enqueue_refuses_a_run_at_the_constraint_refuses_before_any_statement(
    db_dsn: str, when: datetime
) -> None:
    """Found by a tester: datetimes Python holds but `jobs_run_at_range` refuses (the first and
    last day of years 0001-9999) reached the constraint; its untyped CheckViolation aborted the
    caller's transaction, and on a full tier with the drop policy the job counted as dropped.
    They get InvalidArgument before any statement, so the transaction stays usable."""
    with psycopg.connect(db_dsn) as c:
        first = pgqueue.enqueue(c, tenant_id="t1", origin="user_action", payload=PAYLOAD)
        with pytest.raises(pgqueue.InvalidArgument, match="run_at must be from"):
            pgqueue.enqueue(c, tenant_id="t1", origin="user_action", payload=PAYLOAD, run_at=when)
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert c.execute("SELECT array_agg(id) FROM pgqueue.jobs").fetchone() == ([first],)
    for edge in (RUN_AT_MIN, RUN_AT_MAX - timedelta(microseconds=1)):
        with psycopg.connect(db_dsn) as c:
            pgqueue.enqueue(c, tenant_id="t1", origin="user_action", payload=PAYLOAD, run_at=edge)
