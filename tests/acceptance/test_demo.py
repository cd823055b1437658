"""The demo runs end to end in its own database and never touches the user's queue."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

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
    # Its own database, not `pgqueue_demo`: found by a tester, two test runs (or a user's demo)
    # on one server dropped each other's demo database mid-run (DROP ... WITH (FORCE)).
    database = f"pgqueue_demo_test_{uuid.uuid4().hex[:10]}"
    options = DemoOptions(requests=40, speedup=200, concurrency=8, database=database)
    try:
        report = run_demo(db_dsn, Settings(), options)
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
            )
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
