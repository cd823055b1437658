"""pgqueue.queue_depth: the numbers (queued, due, running, oldest queued age per tier) are the
jobs table's, and reading them never scans the finished jobs (issue 28: its `state IN
('queued', 'running')` matched no partial index; the exporter read the whole table every 30 s).
"""

from __future__ import annotations

import json

import psycopg
import pytest

#: What the view showed before revision 0046, from the jobs table itself: the reference.
_FROM_JOBS = """
SELECT t.tier::text,
       count(j.id) FILTER (WHERE j.state = 'queued'),
       count(j.id) FILTER (WHERE j.state = 'queued' AND j.run_at <= now()),
       count(j.id) FILTER (WHERE j.state = 'running'),
       extract(epoch FROM now() - min(j.enqueued_at) FILTER (WHERE j.state = 'queued'))::float8
FROM unnest(enum_range(NULL::pgqueue.tier)) t(tier)
LEFT JOIN pgqueue.jobs j ON j.priority = t.tier
GROUP BY t.tier ORDER BY t.tier
"""


def _fill(conn: psycopg.Connection, finished: int) -> None:
    """Tenants a, b; ``finished`` succeeded jobs; in critical and batch, queued jobs (some
    not due yet, some enqueued an hour ago) and running ones; standard has none (zeros)."""
    conn.execute("INSERT INTO pgqueue.tenants (tenant_id) VALUES ('a'), ('b')")
    conn.execute(
        "INSERT INTO pgqueue.jobs (tenant_id, origin, priority, state, payload, cost,"
        " enqueued_at, started_at, finished_at)"
        " SELECT (ARRAY['a', 'b'])[1 + g %% 2], 'scheduled', 'standard', 'succeeded',"
        " jsonb_build_object('prompt', repeat('x', 200)), 1,"
        " now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'"
        " FROM generate_series(1, %s) g",
        (finished,),
    )
    conn.execute(
        "INSERT INTO pgqueue.jobs (tenant_id, origin, priority, payload, run_at, enqueued_at)"
        " SELECT (ARRAY['a', 'b'])[1 + g % 2], 'scheduled', p::pgqueue.tier, '{}',"
        " now() + CASE WHEN g % 4 = 0 THEN interval '1 hour' ELSE interval '-1 minute' END,"
        " now() - g * interval '1 minute'"
        " FROM generate_series(1, 60) g, unnest(ARRAY['critical', 'batch']) p"
    )
    conn.execute(  # 5 running in critical, 2 in batch
        "UPDATE pgqueue.jobs SET state = 'running', started_at = now(), attempts = 1,"
        " lease_expires_at = now() + interval '1 minute', worker_id = 'w'"
        " WHERE id IN (SELECT x.id FROM (SELECT id, priority, row_number() OVER"
        "              (PARTITION BY priority ORDER BY id) AS n"
        "              FROM pgqueue.jobs WHERE state = 'queued') x"
        "              WHERE (x.priority = 'critical' AND x.n <= 5)"
        "                 OR (x.priority = 'batch' AND x.n <= 2))"
    )
    conn.execute(  # finished in every way, and a job cancelled while queued
        "UPDATE pgqueue.jobs SET state = 'cancelled', finished_at = now()"
        " WHERE id = (SELECT max(id) FROM pgqueue.jobs WHERE state = 'queued')"
    )


def _rows(conn: psycopg.Connection, query: str) -> list[tuple]:
    return [
        (tier, queued, due, running, None if oldest is None else round(oldest, 3))
        for tier, queued, due, running, oldest in conn.execute(query).fetchall()
    ]


def test_depth_is_the_jobs_tables(db_dsn):
    """Same rows as counting the jobs, every tier listed (standard: zeros and no age), in
    one transaction and after further changes; the column types did not change."""
    with psycopg.connect(db_dsn) as conn:
        _fill(conn, finished=500)
        view = (
            "SELECT tier::text, queued, due, running, oldest_queued_seconds"
            " FROM pgqueue.queue_depth"
        )
        assert _rows(conn, view) == _rows(conn, _FROM_JOBS)
        conn.commit()
        rows = _rows(conn, view)
        assert rows == _rows(conn, _FROM_JOBS)
        assert rows[1] == ("standard", 0, 0, 0, None)
        (_, queued, due, running, _), _, (_, b_queued, b_due, b_running, _) = rows
        assert (running, b_running) == (5, 2)
        assert 0 < due < queued and 0 < b_due < b_queued
        conn.execute("DELETE FROM pgqueue.jobs WHERE state = 'queued' AND priority = 'batch'")
        conn.execute(
            "UPDATE pgqueue.jobs SET run_at = now() + interval '1 day'"
            " WHERE state = 'queued' AND priority = 'critical' AND id % 3 = 0"
        )
        conn.commit()
        assert _rows(conn, view) == _rows(conn, _FROM_JOBS)
        types = conn.execute(
            "SELECT array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum)"
            " FROM pg_attribute a WHERE a.attrelid = 'pgqueue.queue_depth'::regclass"
            " AND a.attnum > 0"
        ).fetchone()[0]
        assert types == ["pgqueue.tier", "bigint", "bigint", "bigint", "double precision"]


def _plan(conn: psycopg.Connection, query: str) -> dict:
    return conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {query}").fetchone()[0][0]


def _nodes(node: dict):
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


@pytest.mark.parametrize(
    ("columns", "indexes"),
    [
        # the exporter's read (pgqueue.sql.queries.metrics): counters and the running jobs
        ("tier, queued, running", {"jobs_running_lease_idx"}),
        ("tier, due", {"jobs_queued_run_at_idx"}),
        ("tier, oldest_queued_seconds", {"jobs_queued_enqueued_idx"}),
        (
            "*",
            {"jobs_running_lease_idx", "jobs_queued_run_at_idx", "jobs_queued_enqueued_idx"},
        ),
    ],
)
def test_depth_never_reads_the_finished_jobs(db_dsn, columns, indexes):
    """EXPLAIN guard, 20,000 finished jobs beside ~120 live ones: no sequential scan of jobs,
    only partial indexes of live jobs, and a fraction of the table's ~1,000 pages read (buffer
    accesses: one per live job at most); the columns the exporter reads touch no queued job."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _fill(conn, finished=20_000)
        conn.execute("VACUUM ANALYZE pgqueue.jobs")
        table_pages = conn.execute(
            "SELECT pg_relation_size('pgqueue.jobs') / current_setting('block_size')::int"
        ).fetchone()[0]
        plan = _plan(conn, f"SELECT {columns} FROM pgqueue.queue_depth")
    nodes = list(_nodes(plan["Plan"]))
    on_jobs = [n for n in nodes if n.get("Relation Name") == "jobs"]
    shown = json.dumps(plan, indent=1)
    assert all(n["Node Type"] != "Seq Scan" for n in on_jobs), shown
    assert {n.get("Index Name") for n in on_jobs} <= indexes, shown
    pages = plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]
    assert table_pages > 500 and pages < table_pages / 4, (table_pages, pages, shown)


def test_the_oldest_is_one_probe_per_tier(db_dsn):
    """At 20,000 queued jobs the oldest one's age reads a few index pages per tier (revision
    0049: it read every queued job, ~0.2 s a read at 1M), and is still the jobs table's."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _fill(conn, finished=0)
        conn.execute(
            "INSERT INTO pgqueue.jobs (tenant_id, origin, priority, payload, enqueued_at)"
            " SELECT (ARRAY['a', 'b'])[1 + g % 2], 'scheduled', 'standard', '{}',"
            " now() - g * interval '1 second' FROM generate_series(1, 20000) g"
        )
        conn.execute("VACUUM ANALYZE pgqueue.jobs")
        plan = _plan(conn, "SELECT tier, oldest_queued_seconds FROM pgqueue.queue_depth")
        view = "SELECT tier::text, queued, due, running, oldest_queued_seconds FROM pgqueue."
        with conn.transaction():  # one now() for both
            assert _rows(conn, view + "queue_depth") == _rows(conn, _FROM_JOBS)
    pages = plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]
    assert pages <= 20, json.dumps(plan, indent=1)
