"""Least privilege and tenant isolation (issue 7, done-when 7), tested as the roles."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgqueue
from pgqueue.db import queries

PAYLOAD = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def roles(db_dsn: str) -> Iterator[dict[str, str]]:
    """`pgqueue grant`, then one login role per group role; yields role -> DSN."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        queries.run(conn, "security_grant")
        queries.run(conn, "security_grant")  # idempotent
        made: dict[str, str] = {}
        for group in ("producer", "worker"):
            name = f"pq_{group}_{uuid.uuid4().hex[:8]}"
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                    sql.Identifier(name), sql.Identifier(f"pgqueue_{group}")
                )
            )
            made[group] = name
    try:
        yield {group: make_conninfo(db_dsn, user=name) for group, name in made.items()}
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            for name in made.values():
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_producer_sees_and_enqueues_only_its_tenant(db_dsn, roles):
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        b_job = pgqueue.enqueue(owner, tenant_id="b", origin="user_action", payload=PAYLOAD)
    with psycopg.connect(roles["producer"], autocommit=True) as conn:
        conn.execute("SET pgqueue.tenant_id = 'a'")
        a_job = pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
        [a_many] = pgqueue.enqueue_many(conn, [pgqueue.JobSpec("a", "batch_job", PAYLOAD)])
        seen = {r[0] for r in conn.execute("SELECT id FROM pgqueue.jobs")}
        assert seen == {a_job, a_many}  # b's job is invisible
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            pgqueue.enqueue(conn, tenant_id="b", origin="user_action", payload=PAYLOAD)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            pgqueue.enqueue_many(
                conn,
                [
                    pgqueue.JobSpec("a", "batch_job", PAYLOAD),
                    pgqueue.JobSpec("b", "batch_job", PAYLOAD),
                ],
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE pgqueue.jobs SET payload = '{}' WHERE id = %s", (b_job,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE pgqueue.jobs SET payload = '{}' WHERE id = %s", (a_job,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM pgqueue.jobs")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM pgqueue.claim(1, 'x', 60)")
        conn.execute("SET pgqueue.tenant_id = 'b'")
        assert {r[0] for r in conn.execute("SELECT id FROM pgqueue.jobs")} == {b_job}
        conn.execute("RESET pgqueue.tenant_id")
        assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()[0] == 0
    with psycopg.connect(db_dsn) as owner:
        rows = owner.execute(
            "SELECT tenant_id, count(*) FROM pgqueue.jobs GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert rows == [("a", 2), ("b", 1)]  # the refused enqueues wrote nothing


def test_worker_role_can_run_the_whole_life_cycle(db_dsn, roles):
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        pgqueue.enqueue(owner, tenant_id="a", origin="user_action", payload=PAYLOAD)
    with psycopg.connect(roles["worker"], autocommit=True) as conn:
        [job] = queries.run(
            conn, "job_claim", {"limit": 1, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []}
        )
        assert job["tenant_id"] == "a"
        assert (
            queries.run(
                conn,
                "job_complete",
                {
                    "id": job["id"],
                    "tenant_id": "a",
                    "lease_token": job["lease_token"],
                    "result": None,
                    "input_tokens": 10,
                    "output_tokens": 2,
                },
            )
            == 1
        )
        assert conn.execute("SELECT sum(input_tokens) FROM pgqueue.usage_daily").fetchone()[0] == 10
        queries.run(conn, "job_rescue", {"limit": 10})


def test_one_grant_leaves_no_function_executable_by_public(db_dsn: str) -> None:
    """Found by a tester: the tenant-scope trigger function, created by `pgqueue grant` after
    its REVOKE, stayed executable by PUBLIC until a second grant."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        queries.run(conn, "security_grant")
        public: list[tuple[str]] = conn.execute(
            """
            SELECT p.proname FROM pg_proc p
            WHERE p.pronamespace = 'pgqueue'::regnamespace
              AND has_function_privilege('public', p.oid, 'EXECUTE')
            """
        ).fetchall()
    assert public == []


def test_producer_cancels_only_its_tenants_jobs(db_dsn, roles):
    """pgqueue.cancel is a producer's function too (SECURITY DEFINER after `pgqueue grant`),
    and a session scoped to a tenant reaches only that tenant's jobs."""
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        b_job = pgqueue.enqueue(owner, tenant_id="b", origin="user_action", payload=PAYLOAD)
        a_job = pgqueue.enqueue(owner, tenant_id="a", origin="user_action", payload=PAYLOAD)
    with psycopg.connect(roles["producer"], autocommit=True) as conn:
        # without a tenant scope a producer reads no job (row-level security), and cancels
        # none (found by a tester: it could cancel any tenant's job, and probe their states)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=r"pgqueue\.tenant_id"):
            pgqueue.cancel(conn, b_job)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=r"pgqueue\.tenant_id"):
            pgqueue.cancel_queued(conn, "b")
        conn.execute("SET pgqueue.tenant_id = 'a'")
        with pytest.raises(pgqueue.UnknownJob):
            pgqueue.cancel(conn, b_job)
        assert pgqueue.cancel(conn, a_job) == "cancelled"
        # no direct writes: the function is the only way in
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE pgqueue.jobs SET state = 'cancelled' WHERE id = %s", (b_job,))
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        states = dict(owner.execute("SELECT id, state::text FROM pgqueue.jobs").fetchall())
    assert states == {a_job: "cancelled", b_job: "queued"}


def test_a_role_that_may_write_jobs_cancels_without_a_scope(db_dsn, roles):
    """Whether a session must set its tenant scope to cancel is asked of its privilege on
    pgqueue.jobs, not of role names: found by a tester, a database's owner who was also a
    member of pgqueue_producer (for another database) was refused here."""
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        job = pgqueue.enqueue(owner, tenant_id="b", origin="user_action", payload=PAYLOAD)
        name = conninfo_to_dict(roles["producer"])["user"]
        owner.execute(sql.SQL("GRANT UPDATE ON pgqueue.jobs TO {}").format(sql.Identifier(name)))
    with psycopg.connect(roles["producer"], autocommit=True) as conn:
        assert pgqueue.cancel(conn, job) == "cancelled"
