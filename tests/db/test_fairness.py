"""`pgqueue.fairness`: Jain's index over the tenants backlogged now, over the span they were
all backlogged; no data is NULL (status: "no data", exporter: NaN), never 1.0."""

from __future__ import annotations

import io
import math

import psycopg
import pytest
from rich.console import Console

from pgqueue.observability.metrics import database_registry
from pgqueue.observability.report import collect_status, render_status


def _job(conn, tenant: str, state: str, enqueued_ago: float, started_ago: float | None) -> None:
    conn.execute(
        "INSERT INTO pgqueue.jobs (tenant_id, origin, priority, state, payload, cost,"
        " enqueued_at, run_at, started_at, finished_at)"
        " VALUES (%(t)s, 'scheduled', 'standard', %(state)s::pgqueue.job_state, '{}', 1,"
        " now() - make_interval(secs => %(e)s), now() - make_interval(secs => %(e)s),"
        " now() - make_interval(secs => %(s)s),"
        " CASE WHEN %(state)s = 'succeeded' THEN now() - make_interval(secs => %(s)s) END)",
        {"t": tenant, "state": state, "e": enqueued_ago, "s": started_ago},
    )


def _tenants(conn, names) -> None:
    for name in names:
        conn.execute(
            "INSERT INTO pgqueue.tenants (tenant_id) VALUES (%s) ON CONFLICT DO NOTHING", (name,)
        )


def _fairness(conn, window: str = "5m"):
    return conn.execute(
        "SELECT tier::text, tenants, jain_weighted FROM pgqueue.fairness"
        " WHERE window_name = %s ORDER BY tier NULLS FIRST",
        (window,),
    ).fetchall()


def test_nothing_served_is_no_data_not_one(db_dsn):
    """Found by a tester: with nothing served, status and the view said 1.000 over 4 tenants."""
    with psycopg.connect(db_dsn) as conn:
        _tenants(conn, ["a", "b", "c", "d"])
        for tenant in ("a", "b", "c", "d"):
            _job(conn, tenant, "queued", 30, None)
        conn.commit()
        assert _fairness(conn) == [(None, 4, None), ("standard", 4, None)]
        status = collect_status(conn)
    assert status["fairness"]["all"]["jain_weighted"] is None
    out = io.StringIO()
    render_status(status, Console(file=out, width=200))
    assert "Jain's fairness index: no data (4 tenant(s) backlogged now" in out.getvalue()
    registry = database_registry(db_dsn, refresh_seconds=0)
    assert math.isnan(registry.get_sample_value("claude_drr_fairness_index"))


def test_drained_tenants_are_not_compared(db_dsn):
    """Found by a tester: 8 tenants served fairly while all were backlogged, then 6 drained
    and the view, counting as backlogged every tenant served in the window, read the schedule
    as unfair (0.33 over 5 minutes). Only the tenants backlogged now are compared, over the
    span they have all been backlogged: t00 and t01, served alike."""
    with psycopg.connect(db_dsn) as conn:
        names = [f"t{i:02d}" for i in range(8)]
        _tenants(conn, names)
        for i, tenant in enumerate(names):
            if i < 2:  # backlogged for 200 s and still: 20 jobs served each, one waiting
                _job(conn, tenant, "queued", 200, None)
                for k in range(20):
                    _job(conn, tenant, "succeeded", 200, 200 - 10 * k - 5)
            else:  # 5 jobs served in the first 50 s, then drained
                for k in range(5):
                    _job(conn, tenant, "succeeded", 200, 200 - 10 * k - 2)
        conn.commit()
        rows = _fairness(conn)
    assert [(tier, tenants) for tier, tenants, _ in rows] == [(None, 2), ("standard", 2)]
    assert all(jain == pytest.approx(1.0) for _, _, jain in rows)


def test_a_lone_backlogged_tenant_is_no_data(db_dsn):
    with psycopg.connect(db_dsn) as conn:
        _tenants(conn, ["solo", "done"])
        _job(conn, "solo", "queued", 100, None)
        for k in range(10):
            _job(conn, "solo", "succeeded", 100, 95 - k)
            _job(conn, "done", "succeeded", 100, 99 - k)
        conn.commit()
        assert _fairness(conn) == [(None, 1, None), ("standard", 1, None)]


def test_fairness_reads_only_the_windows_jobs(db_dsn):
    """EXPLAIN guard: pgqueue.fairness_in joined the served jobs to the backlogged tenants by
    sorting the whole jobs table (3 s at 1M jobs, bench/dashboard.py: `pgqueue status`, the
    exporter and the dashboard's overview read it); with the window as a bound (revision
    0034) it reads them by index (revision 0060: the three partial indexes of
    pgqueue.jobs_started_since)."""
    from tests.db.test_drr_explain import _load_auto_explain, _log_plans

    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("INSERT INTO pgqueue.tenants (tenant_id) VALUES ('a'), ('b')")
        c.execute(
            "INSERT INTO pgqueue.jobs (tenant_id, origin, priority, state, payload, cost,"
            " enqueued_at, started_at, finished_at)"
            " SELECT (ARRAY['a', 'b'])[1 + g % 2], 'scheduled', 'standard', 'succeeded', '{}', 1,"
            " now() - interval '2 days', now() - interval '2 days', now() - interval '2 days'"
            " FROM generate_series(1, 50000) g"
        )
        for tenant in ("a", "b"):
            _job(c, tenant, "queued", 30.0, None)
            _job(c, tenant, "succeeded", 60.0, 20.0)
        c.execute("ANALYZE pgqueue.jobs")
        plans: list[str] = []
        _load_auto_explain(c)
        _log_plans(c, plans)
        c.execute("SELECT * FROM pgqueue.fairness_in(interval '5 minutes')").fetchall()
    text = "\n".join(plans)
    assert "fairness_in" in text or "jobs" in text, text
    assert "Seq Scan on jobs" not in text, text
