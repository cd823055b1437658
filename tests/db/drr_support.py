"""Helpers for the DRR claim tests: put jobs straight into pgqueue.jobs, claim, reset, and
mirror the same inputs into the pure reference (pgqueue.scheduling.lanes.LaneScheduler: keyed
DRR per lane and tier, tiers in priority order as under the strict policy). Every job here is
in one lane (kind anthropic.messages without a model: not rate limited)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql

from pgqueue.models import Tier
from pgqueue.scheduling.dispatch import Dispatch
from pgqueue.scheduling.drr import quantum_for_plan
from pgqueue.scheduling.keys import to_units
from pgqueue.scheduling.lanes import LaneScheduler

LANE = "anthropic.messages"


class Reference:
    """The claim's reference: a LaneScheduler with one unlimited lane, one job per next()."""

    def __init__(self, quantum_of: Callable[[str], float]) -> None:
        self._lanes = LaneScheduler(lambda tenant: to_units(quantum_of(tenant)), horizon_rounds=4)
        self._cost: dict[int, float] = {}

    def enqueue(self, tier: Tier, tenant_id: str, job_id: int, cost: float) -> None:
        self._cost[job_id] = cost
        self._lanes.enqueue(LANE, tier, tenant_id, job_id, to_units(cost))

    def next(self) -> Dispatch | None:
        got = self._lanes.claim(1, 0.0)
        if not got:
            return None
        d = got[0]
        return Dispatch(d.tier, d.tenant_id, d.job_id, self._cost.pop(d.job_id))


PAYLOAD = '{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}'
ORIGIN = {Tier.CRITICAL: "user_action", Tier.STANDARD: "scheduled", Tier.BATCH: "batch_job"}

Conn = psycopg.Connection[Any]


def set_tenant(conn: Conn, tenant: str, plan: str = "free", quantum: float | None = None) -> None:
    conn.execute(
        "INSERT INTO pgqueue.tenants (tenant_id, plan, quantum) VALUES (%s, %s, %s) "
        "ON CONFLICT (tenant_id) DO UPDATE SET plan = excluded.plan, quantum = excluded.quantum",
        (tenant, plan, quantum),
    )


def add_jobs(
    conn: Conn,
    jobs: Sequence[tuple[Tier, str, float]],
    ref: Reference | None = None,
    *,
    run_at_offset_seconds: float = 0.0,
) -> list[int]:
    """Insert (tier, tenant, cost) jobs in one statement, in order; commit; mirror into ref."""
    if not jobs:
        return []
    for tenant in sorted({tenant for _, tenant, _ in jobs}):
        conn.execute(
            "INSERT INTO pgqueue.tenants (tenant_id) VALUES (%s) ON CONFLICT DO NOTHING",
            (tenant,),
        )
    rows = conn.execute(
        """
        INSERT INTO pgqueue.jobs (tenant_id, origin, priority, payload, cost, run_at)
        SELECT t, o::pgqueue.origin, p::pgqueue.tier, %s::jsonb, c,
               now() + make_interval(secs => %s)
        FROM unnest(%s::text[], %s::text[], %s::text[], %s::float8[])
             WITH ORDINALITY AS u(t, o, p, c, ord)
        ORDER BY ord
        RETURNING id
        """,
        (
            PAYLOAD,
            run_at_offset_seconds,
            [tenant for _, tenant, _ in jobs],
            [ORIGIN[tier] for tier, _, _ in jobs],
            [tier.value for tier, _, _ in jobs],
            [cost for _, _, cost in jobs],
        ),
    ).fetchall()
    conn.commit()
    ids = sorted(row[0] for row in rows)
    if ref is not None:
        for job_id, (tier, tenant, cost) in zip(ids, jobs, strict=True):
            ref.enqueue(tier, tenant, job_id, cost)
    return ids


def claim(conn: Conn, limit: int = 1, worker: str = "test") -> list[Dispatch]:
    rows = conn.execute(
        "SELECT priority::text, tenant_id, id, cost FROM pgqueue.claim(%s, %s, 60)",
        (limit, worker),
    ).fetchall()
    conn.commit()
    return [Dispatch(Tier(p), t, i, c) for p, t, i, c in rows]


def claim_n(conn: Conn, n: int, batch: int = 10) -> list[Dispatch]:
    out: list[Dispatch] = []
    while len(out) < n:
        got = claim(conn, min(batch, n - len(out)))
        if not got:
            break
        out.extend(got)
    return out


def reference(conn: Conn) -> Reference:
    """A reference whose quanta are read from pgqueue.tenants the way the SQL reads them."""
    plans = {
        t: (plan, q)
        for t, plan, q in conn.execute("SELECT tenant_id, plan, quantum FROM pgqueue.tenants")
    }

    def quantum_of(tenant: str) -> float:
        plan, override = plans.get(tenant, ("free", None))
        return quantum_for_plan(plan, override=override)

    return Reference(quantum_of)


def reset(conn: Conn) -> None:
    """Empty the queue and the scheduler state (between hypothesis examples); the session
    claims under the strict tier policy, as the reference does."""
    # DELETE, not TRUNCATE: a TRUNCATE syncs every new file of the tables and their indexes
    # to disk, seconds per example on a busy machine.
    for table in (
        "jobs",
        "flows",
        "lane_tiers",
        "cursors",
        "throttle_events",
        "demotions",
        "usage_daily",
        "queue_counts",
        "tenants",
    ):
        conn.execute(sql.SQL("DELETE FROM pgqueue.{}").format(sql.Identifier(table)))
    conn.execute("SET pgqueue.tier_policy = 'strict'")
    conn.commit()


def ref_take(ref: Reference, n: int) -> list[Dispatch]:
    out: list[Dispatch] = []
    while len(out) < n and (item := ref.next()) is not None:
        out.append(item)
    return out


def allow_requests(conn: Conn, model: str, requests: int) -> None:
    """Model ``model``'s limiter: ``requests`` requests left now (of 60 a minute), tokens
    plenty, so that the next ``requests`` jobs of it are admitted and the one after is not."""
    conn.execute(
        "INSERT INTO pgqueue.rate_limits (model, requests_per_minute, input_tokens_per_minute,"
        " output_tokens_per_minute, requests_available, input_tokens_available,"
        " output_tokens_available) VALUES (%s, 60, 40000, 8000, %s, 40000, 8000)",
        (model, requests),
    )
