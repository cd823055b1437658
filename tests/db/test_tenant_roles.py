"""Tenants bound to database roles (issue 32, defect 5), tested as a hostile tenant.

Found by a fault run: after `pgqueue grant`, a role meant for tenant acme ran
``SET pgqueue.tenant_id = 'globex'`` and read globex's payloads and cancelled its jobs. A role
bound to acme in ``pgqueue.tenant_roles`` (directly, or through a group role) is confined to acme
by the database, whatever it sets or calls.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

import pgqueue
from pgqueue.db import queries

PAYLOAD = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "secret"}]}
ATTEMPTS = (
    "SET pgqueue.tenant_id = 'globex'",
    "SELECT set_config('pgqueue.tenant_id', 'globex', false)",
    "SET ROLE pgqueue_producer",
    "RESET ROLE",
    "RESET pgqueue.tenant_id",
)


@pytest.fixture
def acme(db_dsn: str) -> Iterator[tuple[str, str]]:
    """`pgqueue grant`; a login role bound to acme directly, and one bound through a group role.
    Yields their DSNs."""
    suffix = uuid.uuid4().hex[:8]
    direct, group, member = f"pq_acme_{suffix}", f"pq_acme_grp_{suffix}", f"pq_acme_m_{suffix}"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        queries.run(conn, "security_grant")
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE pgqueue_producer").format(sql.Identifier(direct))
        )
        conn.execute(
            sql.SQL("CREATE ROLE {} NOLOGIN IN ROLE pgqueue_producer").format(sql.Identifier(group))
        )
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(*map(sql.Identifier, (member, group)))
        )
        conn.execute(
            "INSERT INTO pgqueue.tenant_roles (role_name, tenant_id)"
            " VALUES (%s, 'acme'), (%s, 'acme')",
            (direct, group),
        )
    try:
        yield make_conninfo(db_dsn, user=direct), make_conninfo(db_dsn, user=member)
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            for name in (member, direct, group):
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def _globex(db_dsn: str) -> tuple[int, int]:
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        running = pgqueue.enqueue(owner, tenant_id="globex", origin="user_action", payload=PAYLOAD)
        queued = pgqueue.enqueue(owner, tenant_id="globex", origin="scheduled", payload=PAYLOAD)
        owner.execute("UPDATE pgqueue.jobs SET state = 'running' WHERE id = %s", (running,))
    return running, queued


@pytest.mark.parametrize("which", ["direct", "through a group role"])
def test_a_bound_role_cannot_see_cancel_or_enqueue_another_tenant(
    db_dsn: str, acme: tuple[str, str], which: str
) -> None:
    globex = _globex(db_dsn)
    dsn = acme[0] if which == "direct" else acme[1]
    with psycopg.connect(dsn, autocommit=True) as conn:
        mine = pgqueue.enqueue(conn, tenant_id="acme", origin="user_action", payload=PAYLOAD)
        for attempt in ATTEMPTS:
            conn.execute(attempt)
            if attempt.startswith("SET pgqueue") or "set_config" in attempt:
                assert conn.execute("SHOW pgqueue.tenant_id").fetchone() == ("globex",)
            # it sees its own jobs and nothing of globex's
            assert {r[0] for r in conn.execute("SELECT id FROM pgqueue.jobs")} == {mine}
            assert conn.execute(
                "SELECT count(*) FROM pgqueue.usage_daily WHERE tenant_id = 'globex'"
            ).fetchone() == (0,)
            assert conn.execute("SELECT pgqueue.session_tenant_scope()").fetchone() == ("acme",)
            # it cannot enqueue for globex, by any entry point
            for call, args in (
                ("SELECT pgqueue.enqueue('globex', 'user_action', %s)", (Jsonb(PAYLOAD),)),
                (
                    "SELECT * FROM pgqueue.try_enqueue('globex', 'user_action', %s)",
                    (Jsonb(PAYLOAD),),
                ),
                (
                    "SELECT pgqueue.enqueue_many(ARRAY['acme', 'globex'],"
                    " ARRAY['batch_job', 'batch_job'], ARRAY[%s, %s]::jsonb[])",
                    (Jsonb(PAYLOAD), Jsonb(PAYLOAD)),
                ),
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(call, args)
            # it cannot cancel globex's jobs, queued or running, named or not
            for job_id in globex:
                for call in (
                    "SELECT pgqueue.cancel(%s)",
                    "SELECT pgqueue.cancel(%s, 'globex')",
                ):
                    with pytest.raises(psycopg.Error):
                        conn.execute(call, (job_id,))
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT pgqueue.cancel_queued('globex')")
            # nor rebind itself, nor read the bindings
            for call in (
                "UPDATE pgqueue.tenant_roles SET tenant_id = 'globex'",
                "INSERT INTO pgqueue.tenant_roles VALUES (current_user, 'globex')",
                "DELETE FROM pgqueue.tenant_roles",
                "SELECT * FROM pgqueue.tenant_roles",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(call)
        # its own tenant's jobs it may cancel, whatever it set
        conn.execute("SET pgqueue.tenant_id = 'globex'")
        assert conn.execute("SELECT pgqueue.cancel(%s)", (mine,)).fetchone() == ("cancelled",)
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        rows = owner.execute(
            "SELECT tenant_id, state::text, count(*) FROM pgqueue.jobs GROUP BY 1, 2 ORDER BY 1, 2"
        ).fetchall()
    assert rows == [("acme", "cancelled", 1), ("globex", "queued", 1), ("globex", "running", 1)]


def test_roles_bound_to_two_tenants_are_refused(db_dsn: str, acme: tuple[str, str]) -> None:
    """A login whose roles name two tenants gets neither (an admin's mistake, not a widening)."""
    direct, member = acme
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        owner.execute(
            "INSERT INTO pgqueue.tenant_roles VALUES (%s, 'globex')",
            (psycopg.conninfo.conninfo_to_dict(member)["user"],),
        )
    refused = pytest.raises(psycopg.errors.InsufficientPrivilege, match="more than one tenant")
    with psycopg.connect(member, autocommit=True) as conn, refused:
        conn.execute("SELECT id FROM pgqueue.jobs")
    with psycopg.connect(direct, autocommit=True) as conn:  # still acme only
        assert conn.execute("SELECT pgqueue.session_tenant_scope()").fetchone() == ("acme",)


@pytest.fixture
def evil(db_dsn: str) -> Iterator[str]:
    """`pgqueue grant`; a login role bound to tenant evil. Yields its DSN."""
    name = f"pq_evil_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        queries.run(conn, "security_grant")
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE pgqueue_producer").format(sql.Identifier(name))
        )
        conn.execute("INSERT INTO pgqueue.tenant_roles VALUES (%s, 'evil')", (name,))
    try:
        yield make_conninfo(db_dsn, user=name)
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


# The SQL ways in, for tenant acme: one job (payload, dedupe key), many jobs (payloads).
ONE_JOB = (
    "SELECT * FROM pgqueue.try_enqueue('acme', 'batch_job', %s, dedupe_key => %s)",
    "SELECT pgqueue.enqueue('acme', 'batch_job', %s, dedupe_key => %s)",
)
MANY_JOBS = (
    "SELECT * FROM pgqueue.try_enqueue_batch(ARRAY['acme'], ARRAY['batch_job'], %s)",
    "SELECT * FROM pgqueue.try_enqueue_many(ARRAY['acme'], ARRAY['batch_job'], ARRAY[%s])",
    "SELECT pgqueue.enqueue_many(ARRAY['acme'], ARRAY['batch_job'], ARRAY[%s])",
)


def test_another_tenants_dedupe_key_is_not_revealed(db_dsn: str, evil: str) -> None:
    """Found by a tester: evil's try_enqueue for acme with acme's dedupe key returned acme's
    job id ('duplicate'), and a key that did not exist the permission error. The tenant check
    comes first: the same error for both, and no id."""
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        pgqueue.enqueue(
            owner, tenant_id="acme", origin="batch_job", payload=PAYLOAD, dedupe_key="order-7"
        )
    with psycopg.connect(evil, autocommit=True) as conn:
        for key in ("order-7", "no-such-key"):
            for call in ONE_JOB:
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match="'evil'"):
                    conn.execute(call, (Jsonb(PAYLOAD), key))
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="'evil'"):
                pgqueue.enqueue(
                    conn, tenant_id="acme", origin="batch_job", payload=PAYLOAD, dedupe_key=key
                )


def test_another_tenants_full_drop_tier_refuses_not_drops(db_dsn: str, evil: str) -> None:
    """Found by a tester: evil's enqueue for acme into a full tier of policy drop was reported
    'dropped' (and counted) instead of refused. Every enqueue path refuses it; nothing counted."""
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        owner.execute("SELECT pgqueue.admission_set('batch', 1, NULL, 'drop')")
        pgqueue.enqueue(owner, tenant_id="acme", origin="batch_job", payload=PAYLOAD)
    with psycopg.connect(evil, autocommit=True) as conn:
        calls = [(c, (Jsonb(PAYLOAD), None)) for c in ONE_JOB]
        calls.append((MANY_JOBS[0], (Jsonb([PAYLOAD]),)))
        calls += [(c, (Jsonb(PAYLOAD),)) for c in MANY_JOBS[1:]]
        for call, args in calls:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="'evil'"):
                conn.execute(call, args)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="'evil'"):
            pgqueue.enqueue(conn, tenant_id="acme", origin="batch_job", payload=PAYLOAD)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="'evil'"):
            pgqueue.enqueue_many(conn, [pgqueue.JobSpec("acme", "batch_job", PAYLOAD)])
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        dropped = owner.execute("SELECT sum(dropped) FROM pgqueue.queue_counts").fetchone()
        jobs = owner.execute("SELECT tenant_id, count(*) FROM pgqueue.jobs GROUP BY 1").fetchall()
    assert dropped == (0,)
    assert jobs == [("acme", 1)]
