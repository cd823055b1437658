"""The claim of a rate-limited lane shares the model's input-token bucket between the tiers
(issue 28, "tiers share the pool's capacity"; the rule of
:class:`pgqueue.scheduling.capacity.TierShares`, in SQL ``pgqueue.ratelimit_pick_tier``).

Through the worker's claim (``job_claim`` → ``pgqueue.claim_admitted``), policy ``weighted``:
- a higher tier's job that fits the bucket now never waits behind a lower tier's that does not
  (v1 held a 500-token critical job behind a 7,434-token standard one for 11.6 s);
- while critical is idle, a lower tier leaves the trunk reserve in the bucket, so the next
  critical job does not arrive to an empty one.
"""

from __future__ import annotations

from typing import Any

import psycopg

import pgqueue
from pgqueue.db import queries

MODEL = "m"
LIMIT = 40_000  # input tokens per minute (Tier 1)


def _payload(tokens: int) -> dict[str, Any]:
    """A Messages API payload estimated at about ``tokens`` input tokens (4 characters each)."""
    return {
        "model": MODEL,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "x" * (4 * tokens)}],
    }


def _bucket(conn: psycopg.Connection[Any], level: float) -> None:
    """Tier-1 limits, the input bucket at ``level`` tokens, nothing else binding."""
    queries.run(conn, "ratelimit_set", {"model": MODEL, "rpm": 1_000, "itpm": LIMIT, "otpm": 10**6})
    conn.execute(
        "UPDATE pgqueue.rate_limits SET input_tokens_available = %s, refreshed_at = now(),"
        " guarantees_at = now() WHERE model = %s",
        (level, MODEL),
    )
    conn.commit()


def _claim(dsn: str, limit: int) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = queries.run(
            conn,
            "job_claim",
            {"limit": limit, "worker_id": "w", "lease_seconds": 300, "skip_kinds": []},
        )
    return [r for r in rows if r["id"] is not None]


def test_a_critical_job_that_fits_is_not_held_behind_a_standard_job_that_does_not(
    db_dsn: str,
) -> None:
    with psycopg.connect(db_dsn) as conn:
        _bucket(conn, 3_000)
        big = pgqueue.enqueue(
            conn, tenant_id="acme", origin="scheduled", payload=_payload(7_000), sla_seconds=300
        )
        small = pgqueue.enqueue(
            conn, tenant_id="globex", origin="user_action", payload=_payload(500)
        )
        conn.commit()
    assert [r["id"] for r in _claim(db_dsn, 5)] == [small]
    with psycopg.connect(db_dsn) as conn:
        state = conn.execute("SELECT state::text FROM pgqueue.jobs WHERE id = %s", (big,))
        assert state.fetchone() == ("queued",)


def test_a_lower_tier_leaves_the_trunk_reserve_while_critical_is_idle(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as conn:
        reserve = pgqueue_setting(conn, "ratelimit_trunk_reserve", 0.25) * LIMIT
        # room for one 2,000-token job above the reserve, not for two
        _bucket(conn, reserve + 3_000)
        ids = [
            pgqueue.enqueue(
                conn,
                tenant_id="acme",
                origin="scheduled",
                payload=_payload(2_000),
                sla_seconds=300,
            )
            for _ in range(3)
        ]
        conn.commit()
    taken = _claim(db_dsn, 5)
    assert [r["id"] for r in taken] == ids[:1]
    with psycopg.connect(db_dsn) as conn:
        level = conn.execute(
            "SELECT input_tokens_available FROM pgqueue.rate_limits WHERE model = %s", (MODEL,)
        ).fetchone()
        assert level is not None and level[0] >= reserve
        # a critical job arriving now finds the reserve and goes at once
        urgent = pgqueue.enqueue(
            conn, tenant_id="globex", origin="user_action", payload=_payload(2_000)
        )
        conn.commit()
    assert [r["id"] for r in _claim(db_dsn, 5)] == [urgent]


def pgqueue_setting(conn: psycopg.Connection[Any], name: str, default: float) -> float:
    row = conn.execute("SELECT pgqueue.setting(%s, %s)", (name, default)).fetchone()
    assert row is not None
    return float(row[0])
