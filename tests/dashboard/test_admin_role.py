"""Every dashboard action is a SQL function that pgqueue_admin may call: the dashboard run
with a login role of that group (after `pgqueue grant`) cancels, retries, re-queues a
tenant's failed jobs and changes a tenant's plan and quantum, and shows the schedule."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgqueue.dashboard.app import DashboardConfig
from pgqueue.dashboard.server import running_dashboard
from pgqueue.db import queries
from tests.dashboard.conftest import MODEL, TOKEN, Client, Seeded, job_state

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def admin_dsn(db_dsn: str) -> Iterator[str]:
    name = f"pq_admin_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        queries.run(conn, "security_grant")
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE pgqueue_admin").format(sql.Identifier(name))
        )
    try:
        yield make_conninfo(db_dsn, user=name)
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_the_admin_role_runs_every_action(admin_dsn: str, db_dsn: str, seeded: Seeded):
    cancel, retry, redrive = seeded.by_tier["standard"][:3]
    with psycopg.connect(db_dsn) as conn:
        conn.execute(
            "UPDATE pgqueue.jobs SET state = 'failed', finished_at = now() WHERE id = ANY(%s)",
            ([retry, redrive],),
        )
    with running_dashboard(DashboardConfig(dsn=admin_dsn, token=TOKEN)) as url:
        client = Client(url)
        assert client.post("/login", {"token": TOKEN})[0] == 303
        assert client.post("/actions/cancel", {"job_id": str(cancel)})[0] == 303
        assert client.post("/actions/retry", {"job_id": str(retry)})[0] == 303
        tenant = "initech"  # the third standard job's tenant
        assert client.post("/actions/redrive", {"tenant_id": tenant, "tier": "standard"})[0] == 303
        form = {"tenant_id": "acme", "plan": "pro", "quantum": "7"}
        assert client.post("/actions/tenant", form)[0] == 303
        status, _, page = client.request(f"/jobs/{retry}")
        assert status == 200 and 'id="job-state" class="state-queued"' in page
        status, _, page = client.request("/schedule")
        assert status == 200 and f'<span class="lane">{MODEL}</span> critical' in page
    assert [job_state(db_dsn, j) for j in (cancel, retry, redrive)] == [
        "cancelled",
        "queued",
        "queued",
    ]
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute("SELECT plan, quantum FROM pgqueue.tenants WHERE tenant_id = 'acme'")
        assert row.fetchone() == ("pro", 7.0)
