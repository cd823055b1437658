"""``bench/claim_floor.sql`` (the ``pgqueue-floor`` system of ``bench/cpu_per_job.py``) must
replace ``pgqueue.claim_lanes``, not add an overload beside it: with an old signature it left
the real claim in place and the floor measured the scheduler it meant to take out (found in
issue 28's measurements, after revision 0048 gave the claim its ``p_skip_kinds``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

import pgqueue
from pgqueue import JobSpec
from pgqueue.db import queries
from pgqueue.handlers.registry import NOOP_KIND

FLOOR = Path(__file__).resolve().parents[2] / "bench" / "claim_floor.sql"


def test_floor_replaces_the_claim(conn: psycopg.Connection[Any]) -> None:
    overloads = (
        "SELECT count(*) FROM pg_proc WHERE oid::regprocedure::text LIKE 'pgqueue.claim_lanes(%'"
    )
    assert conn.execute(overloads).fetchone() == (1,)
    conn.execute(FLOOR.read_text())
    assert conn.execute(overloads).fetchone() == (1,)
    specs = [
        JobSpec(tenant_id=f"t{i % 3}", origin="user_action", payload={}, kind=NOOP_KIND)
        for i in range(6)
    ]
    pgqueue.enqueue_many(conn, specs)
    conn.commit()
    claim = {"limit": 10, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []}
    rows = [r for r in queries.run(conn, "job_claim", claim) if r["id"] is not None]
    assert len(rows) == 6
    # the floor takes no keys: a plain queue's oldest-first claim
    stamped = "SELECT count(*) FROM pgqueue.jobs WHERE key_round IS NOT NULL"
    assert conn.execute(stamped).fetchone() == (0,)
