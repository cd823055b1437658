"""EXPLAIN guard: every statement the claim runs uses an index on a large queue (no seq scan of
pgqueue.jobs), captured with auto_explain on the real claim; and the migration goes both ways."""

from __future__ import annotations

import psycopg
import pytest

from pgqueue.db import migrate

QUEUED = 120_000
TENANTS = 1_000


def claim_plans(dsn: str, limit: int = 10) -> list[str]:
    """Plans of every statement pgqueue.claim runs (auto_explain, nested statements)."""
    plans: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as c:
        try:
            c.execute("LOAD 'auto_explain'")
        except psycopg.Error:
            pytest.skip("auto_explain is not available on this server")
        c.execute("SET auto_explain.log_min_duration = 0")
        c.execute("SET auto_explain.log_nested_statements = on")
        c.execute("SET client_min_messages = log")
        c.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
        rows = c.execute("SELECT id FROM pgqueue.claim(%s, 'explain', 60)", (limit,)).fetchall()
        assert len(rows) == limit
    return plans


@pytest.mark.slow
def test_claim_uses_indexes_at_scale(conn, db_dsn):
    conn.execute(
        """
        INSERT INTO pgqueue.tenants (tenant_id)
        SELECT 't' || g FROM generate_series(0, %s - 1) g
        """,
        (TENANTS,),
    )
    conn.execute(
        """
        INSERT INTO pgqueue.jobs (tenant_id, origin, priority, payload, cost)
        SELECT 't' || (g %% %s), 'user_action', 'critical', '{}'::jsonb, 1 + g %% 7
        FROM generate_series(1, %s) g
        """,
        (TENANTS, QUEUED),
    )
    conn.commit()
    conn.execute("ANALYZE pgqueue.jobs")
    conn.commit()
    claim_plans(db_dsn)  # the first claim folds 1,000 new tenants into the round
    plans = claim_plans(db_dsn)
    on_jobs = [p for p in plans if "pgqueue.jobs" in p or " on jobs" in p]
    assert on_jobs, plans
    for plan in plans:
        assert "Seq Scan on jobs" not in plan, plan
    assert any("jobs_queued_tenant_head_idx" in p for p in plans)


def test_migration_0002_downgrades_and_upgrades(empty_db_dsn):
    migrate.upgrade(empty_db_dsn)
    with psycopg.connect(empty_db_dsn) as c:
        c.execute(
            "SELECT pgqueue.enqueue('a', 'user_action', %s::jsonb)",
            ('{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}',),
        )
    migrate.downgrade(empty_db_dsn, "0001")
    with psycopg.connect(empty_db_dsn) as c:
        assert c.execute("SELECT to_regclass('pgqueue.deficits')").fetchone() == (None,)
    migrate.upgrade(empty_db_dsn)
    with psycopg.connect(empty_db_dsn) as c:
        got = c.execute("SELECT tenant_id FROM pgqueue.claim(5, 'w', 30)").fetchall()
    assert got == [("a",)]  # queued before the upgrade, folded in by the migration
