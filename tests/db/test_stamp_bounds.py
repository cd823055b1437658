"""Bounds on one fold's work (issue 28, done-when 5; bench/scale.py): pgqueue.stamp visits a
number of tenants bounded by the arrivals and pgqueue.stamp_slice_flows, and stamps a few
jobs per tenant it visits, however deep the backlog and however many flows the horizon cut.
Counts, not times: tenants visited = calls of pgqueue.tenant_quantum (one per visited flow),
flows read = pg_stat_get_xact_tuples_fetched of pgqueue.flows, in the fold's transaction."""

from __future__ import annotations

from typing import Any

import psycopg

LANE, TIER = "pgqueue.noop", "standard"
SLICE = 8
HORIZON = 4
PER_ROUND = 5  # default quantum 5, cost 1


def _enqueue(conn: psycopg.Connection[Any], prefix: str, tenants: int, jobs: int) -> None:
    conn.execute(
        "INSERT INTO pgqueue.tenants (tenant_id) SELECT %s || g FROM generate_series(0, %s) g"
        " ON CONFLICT DO NOTHING",
        (prefix, tenants - 1),
    )
    conn.execute(
        """
        SELECT count(*) FROM pgqueue.enqueue_many(
            ARRAY(SELECT %(p)s || (g %% %(t)s) FROM generate_series(1, %(n)s) g),
            array_fill('scheduled'::text, ARRAY[%(n)s]),
            ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, %(n)s) g),
            array_fill(300::float8, ARRAY[%(n)s]), array_fill('pgqueue.noop'::text, ARRAY[%(n)s]))
        """,
        {"p": prefix, "t": tenants, "n": jobs},
    )
    conn.commit()


def _fold(conn: psycopg.Connection[Any], sweep: bool = False) -> tuple[int, int, int]:
    """One fold in its own transaction: (jobs stamped, tenants visited, flows rows read)."""
    conn.execute("SET track_functions = 'all'")
    conn.execute(f"SET pgqueue.stamp_slice_flows = {SLICE}")
    conn.execute(f"SET pgqueue.stamp_horizon_rounds = {HORIZON}")
    # the once-a-second sweep is due, or not (whatever the time the test took)
    conn.execute(
        "UPDATE pgqueue.lane_tiers SET full_at = %s::timestamptz",
        ("-infinity" if sweep else "infinity",),
    )
    # counters of this backend not yet reported (Postgres 15 reports them at most once a
    # second, so they may span transactions): differences within one transaction
    counters = (
        "SELECT coalesce(pg_stat_get_xact_function_calls('pgqueue.tenant_quantum'::regproc), 0),"
        " pg_stat_get_xact_tuples_fetched('pgqueue.flows'::regclass)"
    )
    before = conn.execute(counters).fetchone()
    row = conn.execute("SELECT pgqueue.fold(%s, %s)", (LANE, TIER)).fetchone()
    after = conn.execute(counters).fetchone()
    conn.commit()
    assert row is not None and before is not None and after is not None
    return int(row[0]), int(after[0]) - int(before[0]), int(after[1]) - int(before[1])


def _claim(conn: psycopg.Connection[Any], n: int) -> list[str]:
    rows = conn.execute("SELECT tenant_id FROM pgqueue.claim(%s, 'w', 60)", (n,)).fetchall()
    conn.commit()
    return [r[0] for r in rows]


def test_joiners_get_their_first_job_and_cut_flows_go_on_in_slices(conn):
    """200 tenants' 40 jobs each arrive at once: the first fold stamps the horizon of SLICE of
    them and one job of each other (was 20 of every one), the next ones at most SLICE flows'
    horizon each; stamping everything within the horizon takes many folds, and no fold reads
    every flow."""
    _enqueue(conn, "t", 200, 8000)
    per_flow = (HORIZON + 2) * PER_ROUND
    stamped, visited, _ = _fold(conn)
    assert visited == 200
    assert stamped <= SLICE * per_flow + 200
    folds = 0
    total = stamped
    while True:
        stamped, visited, flows_read = _fold(conn)
        if stamped == 0:
            break
        folds += 1
        total += stamped
        assert visited <= 2 * SLICE
        assert stamped <= 2 * SLICE * per_flow
        assert flows_read <= 4 * SLICE + 2
    assert folds >= 200 // SLICE
    # within the horizon, everything: five rounds of each flow
    assert total == 200 * (HORIZON + 1) * PER_ROUND
    # every flow is cut, none within the horizon: a fold visits nobody and reads few flows
    stamped, visited, flows_read = _fold(conn)
    assert (stamped, visited) == (0, 0)
    assert flows_read <= 2


def test_the_sweep_skips_cut_flows_and_restarts_its_clock_when_it_ends(conn):
    """The once-a-second sweep (a job whose transaction committed after a later fold began)
    visited every tenant with unstamped jobs: at 1,000,000 jobs of 10,000 cut flows 3.5 s, and
    as it took longer than its one-second period, every claim ran it (bench/scale.py)."""
    _enqueue(conn, "t", 120, 120 * 40)
    while _fold(conn)[0]:
        pass
    stamped, visited, _ = _fold(conn, sweep=True)
    assert (stamped, visited) == (0, 0)
    # the sweep's clock restarts when it ends, not when its transaction began
    conn.execute("UPDATE pgqueue.lane_tiers SET full_at = '-infinity'")
    conn.execute("SELECT pgqueue.fold(%s, %s)", (LANE, TIER))
    late = conn.execute(
        "SELECT full_at > now() FROM pgqueue.lane_tiers WHERE lane = %s AND tier = %s",
        (LANE, TIER),
    ).fetchone()
    conn.rollback()
    assert late == (True,)
    # A tenant with no cut flow whose job the arrival scan missed (run_at before the last
    # fold) is still found by the sweep.
    conn.execute("INSERT INTO pgqueue.tenants (tenant_id) VALUES ('late')")
    conn.execute(
        "SELECT pgqueue.enqueue('late', 'scheduled', '{}'::jsonb, 300, 'pgqueue.noop',"
        " run_at => now() - interval '1 hour')"
    )
    conn.commit()
    assert _fold(conn)[:2] == (0, 0)
    assert _fold(conn, sweep=True)[:2] == (1, 1)


def test_one_tenants_backlog_costs_a_fold_one_flow(conn):
    """One tenant's 20,000 jobs, then another tenant's one: every fold stamps a bounded number
    of jobs, and the other tenant's job is claimed within the first round (PER_ROUND jobs)."""
    _enqueue(conn, "big", 1, 20_000)
    assert _claim(conn, 1) == ["big0"]
    _enqueue(conn, "small", 1, 1)
    got: list[str] = []
    while "small0" not in got:
        got += _claim(conn, 1)
        assert len(got) <= PER_ROUND + 1
    stamped, visited, _ = _fold(conn)
    assert visited <= 1
    assert stamped <= (HORIZON + 2) * PER_ROUND


def test_a_job_committed_just_after_a_fold_began_is_found_by_the_next(conn, db_dsn):
    """An enqueue's run_at is its transaction's start: a fold that began between it and the
    commit moved the arrival scan past it, and the job waited for the once-a-second sweep
    (a new tenant's job waited up to 1 s behind a claim loop, bench/scale.py). The scan starts
    0.1 s (pgqueue.stamp_arrival_margin) before the last fold now."""
    conn.execute("INSERT INTO pgqueue.tenants (tenant_id) VALUES ('a'), ('b')")
    conn.execute("SET pgqueue.stamp_arrival_margin = 60")  # seconds: whatever the box's load
    conn.commit()
    _fold(conn)
    with psycopg.connect(db_dsn) as other:
        other.execute("SELECT pgqueue.enqueue('b', 'scheduled', '{}'::jsonb, 300, 'pgqueue.noop')")
        assert _fold(conn)[0] == 0  # not committed yet
        other.commit()
    assert _fold(conn)[:2] == (1, 1)  # no sweep
