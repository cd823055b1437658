"""The demo runs end to end in its own database and never touches the user's queue."""

from __future__ import annotations

import psycopg
import pytest

import pgqueue
from pgqueue.demo import DemoOptions, run_demo
from pgqueue.settings import Settings


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_reports_and_leaves_the_users_queue_alone(db_dsn):
    payload = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "mine"}]}
    with psycopg.connect(db_dsn) as conn:
        mine = pgqueue.enqueue(conn, tenant_id="me", origin="user_action", payload=payload)
        conn.commit()
    report = run_demo(db_dsn, Settings(), DemoOptions(requests=40, speedup=200, concurrency=8))
    with psycopg.connect(db_dsn) as conn:
        state = conn.execute(
            "SELECT state::text FROM pgqueue.jobs WHERE id = %s", (mine,)
        ).fetchone()
    assert state == ("queued",)
    tiers = {row["tier"]: row for row in report["tiers"]}
    assert sum(row["jobs"] for row in tiers.values()) == 40
    assert all(row["succeeded"] + row["failed"] == row["jobs"] for row in tiers.values())
    assert {t["tenant_id"] for t in report["tenants"]} <= {f"t{i:02d}" for i in range(8)}
    assert report["replay"]["jobs"] == 40
