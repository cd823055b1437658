"""Revision 0060: the stamp, the claim and a success write no entry in jobs_queued_run_at_idx,
jobs_unstamped_tenant_idx or jobs_started_at_idx (their predicates leave those row versions
out), and the readers of those indexes find the stamped, running and succeeded jobs through
jobs_claim_idx, jobs_running_lease_idx and jobs_finished_at_idx instead: same answers."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue.db import queries
from tests.db.test_drr_explain import _load_auto_explain, _log_plans

Conn = psycopg.Connection[Any]
KIND = "hot.path"


@pytest.fixture
def auto(db_dsn: str) -> Any:
    with psycopg.connect(db_dsn, autocommit=True) as connection:
        yield connection


def _enqueue(conn: Conn, tenant: str, n: int, *, kind: str = KIND, sla: float = 60) -> None:
    specs = [
        pgqueue.JobSpec(
            tenant_id=tenant, origin="scheduled", sla_seconds=sla, payload={"i": i}, kind=kind
        )
        for i in range(n)
    ]
    pgqueue.enqueue_many(conn, specs)


def _stamped(conn: Conn, tenant: str) -> tuple[int, int]:
    """(stamped, unstamped) queued jobs of the tenant."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE key_round IS NOT NULL),"
        " count(*) FILTER (WHERE key_round IS NULL)"
        " FROM pgqueue.jobs WHERE tenant_id = %s AND state = 'queued'",
        (tenant,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _fold(conn: Conn) -> None:
    conn.execute("SELECT pgqueue.fold(u.lane, u.tier) FROM pgqueue.lane_tiers_due() u")


def test_cancel_queued_takes_the_stamped_jobs_too(auto: Conn) -> None:
    auto.execute("SET pgqueue.stamp_horizon_rounds = 1")
    _enqueue(auto, "a", 40)
    _enqueue(auto, "b", 5)
    _fold(auto)
    stamped, unstamped = _stamped(auto, "a")
    assert stamped > 0 and unstamped > 0, (stamped, unstamped)
    assert pgqueue.cancel_queued(auto, "a") == 40
    assert _stamped(auto, "a") == (0, 0)
    assert _stamped(auto, "b") != (0, 0)
    rows = queries.run(auto, "tenant_list", {"limit": 10})
    assert {r["tenant_id"]: r["queued"] for r in rows} == {"a": 0, "b": 5}


def test_tenant_list_counts_stamped_and_unstamped_jobs(auto: Conn) -> None:
    auto.execute("SET pgqueue.stamp_horizon_rounds = 1")
    _enqueue(auto, "a", 30)
    _enqueue(auto, "a", 4, sla=3600)  # batch tier
    _fold(auto)
    assert _stamped(auto, "a")[0] > 0
    rows = queries.run(auto, "tenant_list", {"limit": 10})
    assert [(r["tenant_id"], r["queued"]) for r in rows] == [("a", 34)]


def test_next_due_and_due_kinds_see_the_stamped_jobs(auto: Conn) -> None:
    _enqueue(auto, "a", 3)
    _fold(auto)
    assert _stamped(auto, "a") == (3, 0)  # no job unstamped: only jobs_claim_idx holds them
    due = queries.run(auto, "job_next_due", {"skip_kinds": []})
    assert due is not None and due["seconds"] is not None and due["seconds"] <= 0
    skipped = queries.run(auto, "job_next_due", {"skip_kinds": [KIND]})
    assert skipped is not None and skipped["seconds"] is None
    kinds = queries.run(auto, "job_due_kinds_besides", {"kinds": [], "horizon_seconds": 60})
    assert [r["kind"] for r in kinds] == [KIND]
    kinds = queries.run(auto, "job_due_kinds_besides", {"kinds": [KIND], "horizon_seconds": 60})
    assert kinds == []
    auto.execute("UPDATE pgqueue.jobs SET run_at = now() + interval '30 seconds'")  # unstamps
    later = queries.run(auto, "job_next_due", {"skip_kinds": []})
    assert later is not None and 25 < later["seconds"] <= 30
    depth = auto.execute("SELECT sum(queued), sum(due) FROM pgqueue.queue_depth").fetchone()
    assert depth == (3, 0)


def test_jobs_started_since_is_every_job_started_since(auto: Conn) -> None:
    """Every state, started in the window or before it: the three partial indexes together
    give what `started_at >= since` over the whole table gives."""
    auto.execute("INSERT INTO pgqueue.tenants (tenant_id) VALUES ('t')")
    auto.execute(
        "INSERT INTO pgqueue.jobs (tenant_id, origin, priority, state, payload, started_at,"
        " finished_at, lease_expires_at)"
        " SELECT 't', 'scheduled', 'standard', s, '{}',"
        "        CASE WHEN s = 'queued' AND g = 0 THEN NULL"
        "             ELSE now() - make_interval(secs => 10 + g * 100) END,"
        "        CASE WHEN s IN ('succeeded', 'failed', 'cancelled')"
        "             THEN now() - make_interval(secs => 5 + g * 100) END,"
        "        CASE WHEN s = 'running' THEN now() + interval '1 minute' END"
        " FROM unnest(enum_range(NULL::pgqueue.job_state)) s, generate_series(0, 3) g"
    )
    for window in ("1 minute", "3 minutes", "1 hour"):
        expected = auto.execute(
            "SELECT array_agg(id ORDER BY id) FROM pgqueue.jobs"
            " WHERE started_at >= now() - %s::interval",
            (window,),
        ).fetchone()
        got = auto.execute(
            "SELECT array_agg(id ORDER BY id)"
            " FROM pgqueue.jobs_started_since(now() - %s::interval)",
            (window,),
        ).fetchone()
        assert got == expected, window


def test_cancel_queued_reads_no_finished_job(auto: Conn) -> None:
    """EXPLAIN guard, 20,000 finished jobs and 2,000 queued ones of other tenants beside a
    tenant's 40, some stamped: the tenant's jobs by an index of unstamped queued jobs and
    jobs_claim_idx, never a sequential scan nor a scan of jobs_pkey by its second column.
    Postgres 15 reads jobs_unstamped_tenant_idx; 18 (the embedded server) may skip-scan
    jobs_unstamped_idx by its tenant column instead (found by a fresh-machine trial): both
    hold queued unstamped jobs only."""
    auto.execute("SET pgqueue.stamp_horizon_rounds = 1")
    auto.execute("INSERT INTO pgqueue.tenants (tenant_id) VALUES ('a')")
    auto.execute("INSERT INTO pgqueue.tenants SELECT 'old' || g FROM generate_series(0, 99) g")
    auto.execute(
        "INSERT INTO pgqueue.jobs (tenant_id, origin, priority, state, payload, started_at,"
        " finished_at)"
        " SELECT 'old' || g % 100, 'scheduled', 'standard', 'succeeded', '{}',"
        "        now() - interval '2 days', now() - interval '2 days'"
        " FROM generate_series(1, 20000) g"
    )
    plans = _stamped_backlog_explained(auto, others=20)
    assert pgqueue.cancel_queued(auto, "a") == 40
    text = "\n".join(plans)
    unstamped = ("jobs_unstamped_tenant_idx", "jobs_unstamped_idx ")
    assert any(name in text for name in unstamped) and "jobs_claim_idx" in text, text
    assert "Seq Scan on jobs" not in text, text
    _assert_pkey_only_probed_by_id(text)
    # Locked by a join on the primary key, not found again by `ctid = ANY (list)`: each row
    # that workers change meanwhile is checked again at its newest version, and that check
    # searched the whole list (a tester: 60,000 jobs cancelled in 1-5 min, not 1 s; revision
    # 0063). The one `ctid = ANY` left is the update of the rows this statement locked.
    assert text.count("TID Cond: (ctid = ANY") == 1, text


def _stamped_backlog_explained(auto: Conn, others: int) -> list[str]:
    """40 queued jobs of tenant 'a' (some stamped) beside 100 each of ``others`` tenants,
    analyzed; from now on the plans of this session's statements are logged into the list
    returned (auto_explain)."""
    _enqueue(auto, "a", 40)
    for k in range(others):
        _enqueue(auto, f"other{k}", 100)
    _fold(auto)
    assert _stamped(auto, "a")[0] > 0
    auto.execute("VACUUM ANALYZE pgqueue.jobs")
    plans: list[str] = []
    _load_auto_explain(auto)
    _log_plans(auto, plans)
    return plans


def _assert_pkey_only_probed_by_id(text: str) -> None:
    """jobs_pkey is read only by probes of an id (the join's), never by its second column."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "jobs_pkey" in line:
            cond = next((x for x in lines[i + 1 : i + 4] if "Index Cond" in x), "")
            assert "(id = " in cond, "\n".join(lines[i : i + 4])


def test_demoting_queued_jobs_locks_them_by_a_join(auto: Conn) -> None:
    """EXPLAIN guard of demotion_check's move of a tenant's queued standard jobs to batch
    (stamped ones among them): joined by the primary key, never `ctid = ANY (list)` (whose
    check of each row changed meanwhile searched the whole list; revision 0063)."""
    auto.execute("SET pgqueue.stamp_horizon_rounds = 1")
    auto.execute("SET pgqueue.demote_queued_jobs = on")
    auto.execute("SET pgqueue.demotion_throttle_threshold = 1")
    plans = _stamped_backlog_explained(auto, others=5)
    auto.execute("INSERT INTO pgqueue.throttle_events (tenant_id, status_code) VALUES ('a', 429)")
    tiers = auto.execute(
        "SELECT priority::text, count(*) FROM pgqueue.jobs"
        " WHERE tenant_id = 'a' AND state = 'queued' GROUP BY 1"
    ).fetchall()
    assert tiers == [("batch", 40)]
    text = "\n".join(plans)
    assert "SET priority = 'batch'" in text, text
    assert "TID Cond: (ctid = ANY" not in text, text
    _assert_pkey_only_probed_by_id(text)
