"""Many ``pgqueue.enqueue`` calls in one transaction (``SELECT pgqueue.enqueue(...) FROM
generate_series(1, 200000)``, issue 28's loose end): every call updated the same queued-counter
rows again, the transaction kept every version, and each call stepped over them all (99 rows/s
at 50,000). From a transaction's 16th counter write, ``queue_counts_add`` updates the version
of a key's row that the transaction wrote last, by its ctid (a transaction-local note,
``pgqueue.queue_counts_rows``): a call's work no longer grows with the calls before it, and
the counters stay exact."""

from __future__ import annotations

import json

import psycopg

_COUNTS = """
SELECT c.tier::text, c.tenant_id, sum(c.queued)::bigint FROM pgqueue.queue_counts c
GROUP BY 1, 2 HAVING sum(c.queued) <> 0 ORDER BY 1, 2
"""
_FROM_JOBS = """
SELECT j.priority::text, t.tenant_id, count(*)
FROM pgqueue.jobs j, LATERAL (VALUES (j.tenant_id), (NULL)) t(tenant_id)
WHERE j.state = 'queued'
GROUP BY 1, 2 ORDER BY 1, 2
"""
_ENQUEUE = (
    "SELECT count(pgqueue.enqueue('t' || (g %% %(tenants)s), o, '{}', kind => 'pgqueue.noop'))"
    " FROM generate_series(1, %(n)s) g,"
    " LATERAL (SELECT CASE WHEN g %% 3 = 0 THEN 'user_action' ELSE 'scheduled' END AS o) x"
)


def _buffers_of_one_enqueue(conn: psycopg.Connection) -> int:
    plan = conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)"
        " SELECT pgqueue.enqueue('t1', 'scheduled', '{}', kind => 'pgqueue.noop')"
    ).fetchone()[0][0]  # type: ignore[index]
    return int(plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"])


def test_a_call_does_not_grow_with_the_calls_before_it(conn: psycopg.Connection) -> None:
    """Buffers read by one enqueue after 200 and after 4,000 calls in the same transaction:
    about the same (before: the counters' part grew with every call, 300 buffers at 5,000)."""
    conn.execute(_ENQUEUE, {"tenants": 10, "n": 200})
    early = _buffers_of_one_enqueue(conn)
    conn.execute(_ENQUEUE, {"tenants": 10, "n": 3800})
    late = _buffers_of_one_enqueue(conn)
    assert late <= early + 15, (early, late)
    conn.commit()


def test_the_counters_stay_exact(conn: psycopg.Connection) -> None:
    """Calls over 7 tenants and two tiers, a savepoint rolled back (its calls' notes go with
    it), cancels in the same transaction (the update trigger's path), a compaction; then the
    counters equal the jobs, in the transaction and after it."""
    conn.execute(_ENQUEUE, {"tenants": 7, "n": 700})
    conn.execute("SAVEPOINT s")
    conn.execute(_ENQUEUE, {"tenants": 7, "n": 300})
    conn.execute("ROLLBACK TO SAVEPOINT s")
    conn.execute(_ENQUEUE, {"tenants": 5, "n": 300})
    conn.execute(
        "UPDATE pgqueue.jobs SET state = 'cancelled', finished_at = now()"
        " WHERE id IN (SELECT id FROM pgqueue.jobs WHERE state = 'queued' AND id % 11 = 0)"
    )
    conn.execute(_ENQUEUE, {"tenants": 7, "n": 200})
    conn.execute("SELECT pgqueue.queue_counts_compact('batch', 't1', 1000)")
    conn.execute(_ENQUEUE, {"tenants": 3, "n": 100})
    assert conn.execute(_COUNTS).fetchall() == conn.execute(_FROM_JOBS).fetchall()
    note = conn.execute("SELECT current_setting('pgqueue.queue_counts_rows', true)").fetchone()
    assert note is not None and note[0] and note[0].count(";") <= 32
    conn.commit()
    assert conn.execute(_COUNTS).fetchall() == conn.execute(_FROM_JOBS).fetchall()
    queued = conn.execute("SELECT count(*) FROM pgqueue.jobs WHERE state = 'queued'").fetchone()
    assert queued is not None and queued[0] > 1000
    # the note is the transaction's: gone after it
    assert conn.execute(
        "SELECT coalesce(current_setting('pgqueue.queue_counts_rows', true), '')"
    ).fetchone() == ("",)


def test_a_note_set_by_hand_is_only_a_hint(conn: psycopg.Connection) -> None:
    """A session that sets the note itself (to another key's row, or to nonsense) cannot
    move a delta to another key: the row's key is checked."""
    conn.execute(_ENQUEUE, {"tenants": 2, "n": 10})
    conn.commit()
    rows = conn.execute(
        "SELECT c.ctid::text FROM pgqueue.queue_counts c WHERE c.tenant_id = 't0'"
    ).fetchall()
    wrong = "".join(
        f";{tier}/{tenant}={ctid}"
        for (ctid,) in rows
        for tier, tenant in (("batch", ""), ("critical", ""), ("batch", "t1"), ("critical", "t1"))
    )
    conn.execute("SELECT set_config('pgqueue.queue_counts_rows', %s, false)", (wrong + ";zz",))
    conn.execute(_ENQUEUE, {"tenants": 2, "n": 20})
    conn.commit()
    assert conn.execute(_COUNTS).fetchall() == conn.execute(_FROM_JOBS).fetchall()
    assert json.dumps(conn.execute(_COUNTS).fetchall())
