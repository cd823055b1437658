"""``select tier from pgqueue.jobs`` (issue 29, item 9).

Found by trying the README as a new user: it says tier everywhere, and the first query a user
wrote, ``select tier from pgqueue.jobs``, failed (the column was only ``priority``). ``tier`` is a
generated column equal to ``priority`` (revision 0040); ``priority`` stays the column to write.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgqueue
from pgqueue.db import migrate, queries

PAYLOAD = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "schema_0030.sql"
SAME = "SELECT count(*) FILTER (WHERE tier = priority), count(*) FROM pgqueue.jobs"


def _one_of_each(conn: psycopg.Connection[Any], tenant: str) -> None:
    pgqueue.enqueue(conn, tenant_id=tenant, origin="user_action", payload=PAYLOAD)
    pgqueue.enqueue(conn, tenant_id=tenant, origin="scheduled", sla_seconds=60, payload=PAYLOAD)
    pgqueue.enqueue(conn, tenant_id=tenant, origin="batch_job", payload=PAYLOAD)


def test_select_tier_from_jobs_is_the_priority(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _one_of_each(conn, "a")
        rows = conn.execute(
            "SELECT tier::text, priority::text FROM pgqueue.jobs ORDER BY id"
        ).fetchall()
        assert rows == [(t, t) for t in ("critical", "standard", "batch")]
        # priority stays writable, and tier follows it; tier itself cannot be written
        conn.execute("UPDATE pgqueue.jobs SET priority = 'batch' WHERE tier = 'critical'")
        assert conn.execute(SAME).fetchone() == (3, 3)
        with pytest.raises(psycopg.errors.GeneratedAlways):
            conn.execute("UPDATE pgqueue.jobs SET tier = 'critical'")


def test_tier_follows_a_demotion(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SET pgqueue.demote_queued_jobs = on")
        conn.execute("SET pgqueue.demotion_throttle_threshold = 1")
        pgqueue.enqueue(conn, tenant_id="r", origin="user_action", payload=PAYLOAD)
        for _ in range(3):
            pgqueue.enqueue(
                conn, tenant_id="r", origin="scheduled", sla_seconds=60, payload=PAYLOAD
            )
        [job] = queries.run(
            conn, "job_claim", {"limit": 1, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []}
        )
        queries.run(
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
        tiers = conn.execute(
            "SELECT tier::text, count(*) FROM pgqueue.jobs WHERE state = 'queued'"
            " GROUP BY 1 ORDER BY 1"
        ).fetchall()
        assert sorted(tiers) == [("batch", 3), ("critical", 1)]
        assert conn.execute(SAME).fetchone() == (4, 4)


def test_claimed_rows_carry_the_tier(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _one_of_each(conn, "a")
        claimed = conn.execute(
            "SELECT c.tier::text, c.priority::text FROM pgqueue.claim(3, 'w', 60) c"
        ).fetchall()
        assert sorted(claimed) == sorted((t, t) for t in ("critical", "standard", "batch"))


@pytest.fixture
def acme_role(db_dsn: str) -> Iterator[str]:
    """`pgqueue grant` and a login role bound to tenant acme; yields its DSN."""
    role = f"pq29_acme_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        queries.run(conn, "security_grant")
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE pgqueue_producer").format(sql.Identifier(role))
        )
        conn.execute(
            "INSERT INTO pgqueue.tenant_roles (role_name, tenant_id) VALUES (%s, 'acme')", (role,)
        )
    try:
        yield make_conninfo(db_dsn, user=role)
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_tenant_role_reads_the_tier_of_its_own_jobs(db_dsn: str, acme_role: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        _one_of_each(owner, "globex")
    with psycopg.connect(acme_role, autocommit=True) as conn:
        _one_of_each(conn, "acme")
        rows = conn.execute("SELECT tenant_id, tier::text FROM pgqueue.jobs ORDER BY id").fetchall()
        assert rows == [("acme", t) for t in ("critical", "standard", "batch")]
        assert conn.execute(SAME).fetchone() == (3, 3)


def test_an_upgraded_database_gets_the_tier_of_every_job(db_dsn: str, empty_db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        queries.run(conn, "security_grant")  # the roles the dump's grants name
    with psycopg.connect(empty_db_dsn) as conn:
        conn.execute(FIXTURE.read_text(encoding="utf-8").encode())
    migrate.upgrade(empty_db_dsn)
    with psycopg.connect(empty_db_dsn) as conn:
        assert conn.execute(SAME).fetchone() == (59, 59)
