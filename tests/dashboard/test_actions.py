"""The dashboard's actions over HTTP, once unlocked: retry a job, re-queue a tenant's failed
jobs, change a tenant's plan or quantum; each lands in the database, bad input is a 400."""

from __future__ import annotations

import psycopg
import pytest

from pgqueue.dashboard.data import slo_class
from tests.dashboard.conftest import TOKEN, Client, Seeded, job_state

pytestmark = pytest.mark.timeout(60)


def _unlocked(client: Client) -> Client:
    assert client.post("/login", {"token": TOKEN})[0] == 303
    return client


def _fail(dsn: str, *job_ids: int) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "UPDATE pgqueue.jobs SET state = 'failed', attempts = 5, finished_at = now(),"
            " last_error = 'boom' WHERE id = ANY(%s)",
            (list(job_ids),),
        )


def test_redrive_requeues_one_tenants_failed_jobs(client: Client, seeded: Seeded, db_dsn):
    acme = seeded.by_tier["critical"][0]  # tenants cycle acme, globex, initech
    globex = seeded.by_tier["critical"][1]
    _fail(db_dsn, acme, globex)
    status, headers, _ = _unlocked(client).post("/actions/redrive", {"tenant_id": "acme"})
    assert status == 303
    assert headers["location"] == "/tenants?done=redriven&n=1"
    assert (job_state(db_dsn, acme), job_state(db_dsn, globex)) == ("queued", "failed")
    status, _, page = client.request(headers["location"])
    assert "Failed jobs re-queued: 1." in page


def test_a_dedupe_key_held_by_a_live_job(client: Client, db_dsn):
    """Found by a tester: retrying a failed job whose dedupe key a queued job holds answered
    500 (the raw unique violation); now 409 with the message naming both jobs. Re-queueing
    the tenant's failed jobs skips it and says so."""
    import pgqueue

    payload = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    with psycopg.connect(db_dsn) as conn:
        held, plain = (
            pgqueue.enqueue(
                conn, tenant_id="acme", origin="batch_job", payload=payload, dedupe_key=key
            )
            for key in ("K", None)
        )
        conn.commit()
    assert held is not None and plain is not None
    _fail(db_dsn, held, plain)
    with psycopg.connect(db_dsn) as conn:
        holder = pgqueue.enqueue(
            conn, tenant_id="acme", origin="batch_job", payload=payload, dedupe_key="K"
        )
        conn.commit()
    status, _, page = _unlocked(client).post("/actions/retry", {"job_id": str(held)})
    assert status == 409, page
    assert f"job {held} not retried: its dedupe key &#39;K&#39; (tenant &#39;acme&#39;) is" in page
    assert f"held by live job {holder}" in page
    status, headers, _ = client.post("/actions/redrive", {"tenant_id": "acme"})
    assert status == 303
    assert headers["location"] == "/tenants?done=redriven-skipped&n=1&m=1"
    assert (job_state(db_dsn, held), job_state(db_dsn, plain)) == ("failed", "queued")
    _, _, page = client.request(headers["location"])
    assert "Failed jobs re-queued: 1. Left failed: 1, whose dedupe key a live job holds." in page


def test_tenant_plan_and_quantum(client: Client, seeded: Seeded, db_dsn):
    _unlocked(client)
    form = {"tenant_id": "globex", "plan": "pro", "quantum": ""}
    assert client.post("/actions/tenant", form)[0] == 303
    assert client.post("/actions/tenant", {"tenant_id": "globex", "quantum": "2.5"})[0] == 303
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute(
            "SELECT plan, quantum FROM pgqueue.tenants WHERE tenant_id = 'globex'"
        ).fetchone()
    assert row == ("pro", 2.5)
    for bad in ({"quantum": "nan"}, {"quantum": "0"}, {"plan": "gold"}, {}):
        status, _, body = client.post("/actions/tenant", {"tenant_id": "globex", **bad})
        assert status == 400, (bad, body)
    with psycopg.connect(db_dsn) as conn:
        again = conn.execute(
            "SELECT plan, quantum FROM pgqueue.tenants WHERE tenant_id = 'globex'"
        ).fetchone()
    assert again == ("pro", 2.5)


def test_slo_colours():
    assert slo_class(None, 2.0) == "none"
    assert slo_class(1.6, 2.0) == "ok"
    assert slo_class(1.61, 2.0) == "warn"
    assert slo_class(2.0, 2.0) == "warn"
    assert slo_class(2.01, 2.0) == "bad"
