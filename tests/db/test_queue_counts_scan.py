"""The claim path's counter writes probe pgqueue.queue_counts by index, never by Seq Scan."""

from __future__ import annotations

import time

import psycopg

import pgqueue
from pgqueue import JobSpec


def _scans_and_updates(dsn: str) -> tuple[int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT seq_scan, n_tup_upd FROM pg_stat_user_tables"
            " WHERE relid = 'pgqueue.queue_counts'::regclass"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_claims_never_read_the_counters_by_seq_scan(db_dsn: str) -> None:
    """Found by callgrind with two claimers (bench/claim_instructions_peer.py --conns 2):
    queue_counts_add's generic plans read the one-page counter table by Seq Scan and updated
    it by Seq Scan instead of TID, testing every dead version of its rows (212 to 384 a job
    once another claimer's snapshot held pruning back)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.enqueue_many(
            conn,
            [JobSpec(f"t{i % 10}", "scheduled", {}, kind="pgqueue.noop") for i in range(300)],
        )
        conn.execute("ANALYZE pgqueue.queue_counts")  # as autovacuum would: one page
    # a backend's counters reach pg_stat_user_tables when it exits at the latest
    scans, updates = _scans_and_updates(db_dsn)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        claimed = 0
        for _ in range(20):
            claimed += len(conn.execute("SELECT id FROM pgqueue.claim(10, 'w', 60)").fetchall())
        conn.execute(
            "UPDATE pgqueue.jobs SET state = 'succeeded', finished_at = now(),"
            " lease_expires_at = NULL WHERE state = 'running'"
        )
    assert claimed == 200
    deadline = time.monotonic() + 10
    scans_after, updates_after = _scans_and_updates(db_dsn)
    while updates_after == updates and time.monotonic() < deadline:  # not flushed yet
        time.sleep(0.1)
        scans_after, updates_after = _scans_and_updates(db_dsn)
    assert updates_after > updates  # the claims' counter writes are counted now
    assert scans_after == scans
