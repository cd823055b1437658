"""Cancelling a job (``pgqueue.cancel``, revision 0024): queued, running and finished jobs, the
books it keeps, and the errors at its boundary."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import pgqueue
from pgqueue.db import queries
from pgqueue.errors import InvalidArgument, InvalidTenant, NulCharacter, UnknownJob
from pgqueue.worker.completer import success_batch

PAYLOAD = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
CLAIM = {"limit": 10, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []}

Conn = psycopg.Connection[Any]


@pytest.fixture
def auto(db_dsn: str) -> Any:
    with psycopg.connect(db_dsn, autocommit=True) as connection:
        yield connection


def _enqueue(conn: Conn, tenant: str = "acme") -> int:
    job_id = pgqueue.enqueue(
        conn, tenant_id=tenant, origin="scheduled", sla_seconds=60, payload=PAYLOAD
    )
    assert job_id is not None
    return job_id


def _row(conn: Conn, job_id: int) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            "SELECT state::text AS state, last_error, finished_at, lease_token "
            "FROM pgqueue.jobs WHERE id = %s",
            (job_id,),
        ).fetchone()
    assert row is not None
    return row


def _queued_counts(conn: Conn) -> dict[str | None, int]:
    rows = conn.execute(
        "SELECT tenant_id, sum(queued)::bigint FROM pgqueue.queue_counts GROUP BY tenant_id"
    ).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def test_a_cancelled_queued_job_is_never_claimed_and_leaves_the_counts(auto: Conn) -> None:
    doomed, kept = _enqueue(auto), _enqueue(auto)
    assert _queued_counts(auto) == {None: 2, "acme": 2}
    assert pgqueue.cancel(auto, doomed, reason="customer asked") == "cancelled"
    row = _row(auto, doomed)
    assert row["state"] == "cancelled"
    assert row["last_error"] == "cancelled: customer asked"
    assert row["finished_at"] is not None
    assert _queued_counts(auto) == {None: 1, "acme": 1}
    claimed = queries.run(auto, "job_claim", CLAIM)
    assert [r["id"] for r in claimed] == [kept]
    # cancelling again answers the same, and changes nothing
    assert pgqueue.cancel(auto, doomed) == "cancelled"
    assert _row(auto, doomed)["last_error"] == "cancelled: customer asked"


def test_a_cancelled_running_job_cannot_record_its_outcome(auto: Conn) -> None:
    job_id = _enqueue(auto)
    (claimed,) = queries.run(auto, "job_claim", CLAIM)
    assert pgqueue.cancel(auto, job_id, tenant_id="acme") == "cancelled"
    row = _row(auto, job_id)
    assert row["state"] == "cancelled" and row["lease_token"] is None
    assert row["last_error"] == "cancelled"
    batch = success_batch([(job_id, "acme", claimed["lease_token"], {"text": "late"}, 10, 20)])
    assert queries.run(auto, "job_complete_many", batch) == []  # fenced off
    assert _row(auto, job_id)["state"] == "cancelled"
    usage = auto.execute("SELECT count(*) FROM pgqueue.usage_daily").fetchone()
    assert usage is not None and usage[0] == 0  # nothing charged
    assert _queued_counts(auto) == {None: 0, "acme": 0}


def test_a_finished_job_is_left_as_it_is(auto: Conn) -> None:
    job_id = _enqueue(auto)
    (claimed,) = queries.run(auto, "job_claim", CLAIM)
    batch = success_batch([(job_id, "acme", claimed["lease_token"], None, None, None)])
    assert len(queries.run(auto, "job_complete_many", batch)) == 1
    assert pgqueue.cancel(auto, job_id) == "succeeded"
    row = _row(auto, job_id)
    assert row["state"] == "succeeded" and row["last_error"] is None


def test_unknown_jobs_and_other_tenants_jobs_are_refused(auto: Conn) -> None:
    job_id = _enqueue(auto, "acme")
    with pytest.raises(UnknownJob, match=r"no job 999999$"):
        pgqueue.cancel(auto, 999_999)
    with pytest.raises(UnknownJob, match=rf"no job {job_id} of tenant 'globex'"):
        pgqueue.cancel(auto, job_id, tenant_id="globex")
    # a session scoped to another tenant does not reach it either
    auto.execute("SET pgqueue.tenant_id = 'globex'")
    with pytest.raises(UnknownJob):
        pgqueue.cancel(auto, job_id)
    auto.execute("RESET pgqueue.tenant_id")
    assert _row(auto, job_id)["state"] == "queued"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"job_id": 0}, InvalidArgument),
        ({"job_id": -5}, InvalidArgument),
        ({"job_id": 2**63}, InvalidArgument),
        ({"job_id": True}, InvalidArgument),
        ({"job_id": "1"}, InvalidArgument),
        ({"job_id": 1, "tenant_id": ""}, InvalidTenant),
        ({"job_id": 1, "tenant_id": "x" * 129}, InvalidTenant),
        ({"job_id": 1, "reason": ""}, InvalidArgument),
        ({"job_id": 1, "reason": "r" * 1001}, InvalidArgument),
        ({"job_id": 1, "reason": "a\x00b"}, NulCharacter),
    ],
)
def test_bad_arguments_get_typed_errors_before_any_statement(
    conn: Conn, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    job_id = _enqueue(conn)
    with pytest.raises(error):
        pgqueue.cancel(conn, **kwargs)
    # nothing was sent: the caller's transaction is still usable, and the job still there
    assert _row(conn, job_id)["state"] == "queued"


def test_the_sql_function_checks_its_reason(auto: Conn) -> None:
    job_id = _enqueue(auto)
    with pytest.raises(psycopg.Error) as info:
        auto.execute("SELECT pgqueue.cancel(%s, reason => '')", (job_id,))
    assert info.value.sqlstate == "PQ009"
    row = auto.execute("SELECT pgqueue.cancel(%s)", (job_id,)).fetchone()
    assert row == ("cancelled",)


def test_cancel_joins_the_callers_transaction(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as conn:
        job_id = _enqueue(conn)
        conn.commit()
        assert pgqueue.cancel(conn, job_id) == "cancelled"
        conn.rollback()
        assert _row(conn, job_id)["state"] == "queued"


async def test_cancel_on_an_async_connection(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        job_id = _enqueue(conn)
    async with await psycopg.AsyncConnection.connect(db_dsn, autocommit=True) as aconn:
        assert await pgqueue.cancel(aconn, job_id) == "cancelled"
        with pytest.raises(UnknownJob):
            await pgqueue.cancel(aconn, job_id + 1000)


def test_a_tenants_queued_backlog_is_cancelled_and_running_jobs_left(auto: Conn) -> None:
    running = _enqueue(auto, "acme")
    (claimed,) = queries.run(auto, "job_claim", {**CLAIM, "limit": 1})
    assert claimed["id"] == running
    acme = [_enqueue(auto, "acme") for _ in range(3)]
    urgent = pgqueue.enqueue(auto, tenant_id="acme", origin="user_action", payload=PAYLOAD)
    other = _enqueue(auto, "globex")
    # one tier only
    assert pgqueue.cancel_queued(auto, "acme", tier="critical", reason="purge") == 1
    assert _row(auto, urgent)["state"] == "cancelled"
    # then the rest of the tenant's queue; its running job and other tenants are untouched
    assert pgqueue.cancel_queued(auto, "acme") == 3
    assert [_row(auto, j)["state"] for j in acme] == ["cancelled"] * 3
    assert _row(auto, acme[0])["last_error"] == "cancelled"
    assert _row(auto, urgent)["last_error"] == "cancelled: purge"
    assert _row(auto, running)["state"] == "running"
    assert _row(auto, other)["state"] == "queued"
    assert _queued_counts(auto) == {None: 1, "acme": 0, "globex": 1}
    assert [r["id"] for r in queries.run(auto, "job_claim", CLAIM)] == [other]
    assert pgqueue.cancel_queued(auto, "nobody") == 0


def test_cancel_queued_checks_its_arguments_and_the_sessions_scope(conn: Conn) -> None:
    job_id = _enqueue(conn, "acme")
    conn.commit()
    for kwargs, error in (
        ({"tenant_id": ""}, InvalidTenant),
        ({"tenant_id": "acme", "tier": "urgent"}, InvalidArgument),
        ({"tenant_id": "acme", "reason": ""}, InvalidArgument),
        ({"tenant_id": "acme", "reason": "a\x00"}, NulCharacter),
    ):
        with pytest.raises(error):
            pgqueue.cancel_queued(conn, **kwargs)
    conn.execute("SET pgqueue.tenant_id = 'globex'")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        pgqueue.cancel_queued(conn, "acme")
    conn.rollback()
    assert _row(conn, job_id)["state"] == "queued"


def test_cancel_queued_skips_rows_another_transaction_holds(db_dsn: str, auto: Conn) -> None:
    """A row another transaction holds (a claim taking it) is skipped, not waited for: waiting,
    cancel_queued kept the lock on such a row until the caller's transaction ended, though the
    row was then running, and the worker's batched completion waited on it (found by a
    tester: a cancel_queued held open stopped a worker for every tenant)."""
    jobs = [_enqueue(auto, "acme") for _ in range(4)]
    with psycopg.connect(db_dsn) as holder:
        holder.execute("SET statement_timeout = '10s'")
        holder.execute("SELECT 1 FROM pgqueue.jobs WHERE id = %s FOR UPDATE", (jobs[0],))
        with psycopg.connect(db_dsn) as caller:
            caller.execute("SET statement_timeout = '5s'")  # a wait would fail the test
            assert pgqueue.cancel_queued(caller, "acme") == 3
            held: Any = caller.execute(
                "SELECT id FROM pgqueue.jobs WHERE id = %s FOR UPDATE NOWAIT", (jobs[1],)
            ).fetchone()
            assert held == (jobs[1],)  # the caller holds the rows it cancelled
            caller.commit()
        holder.rollback()
    assert [_row(auto, j)["state"] for j in jobs] == ["queued"] + ["cancelled"] * 3
