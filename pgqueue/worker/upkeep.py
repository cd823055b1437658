"""Table upkeep a worker runs beside its jobs: retention, the pruning of the scheduler's idle
flow rows, counter compaction, and the vacuum of the scheduler's small, hot tables. Each
touches only the database (no worker state); the worker (``pgqueue.worker.runtime``) starts
the loops and passes its pool (retention and flows on the rescuer's round,
``pgqueue.worker.lease_keeper``). A failure is logged unless the worker's outage report covers
it (:func:`pgqueue.worker.outage.upkeep_failed`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from pgqueue.db import queries
from pgqueue.worker.outage import UPKEEP_CONNECTION_WAIT_SECONDS, upkeep_answered, upkeep_failed

log = logging.getLogger("pgqueue.worker")

Pool = AsyncConnectionPool[Any]


async def _every(interval: float, rng: random.Random, step: Callable[[], Awaitable[bool]]) -> None:
    """Run ``step`` every ``interval`` seconds (± 20 % jitter) until it returns False."""
    while True:
        await asyncio.sleep(interval * rng.uniform(0.8, 1.2))
        if not await step():
            return


async def prune(pool: Pool, older_than_seconds: float) -> None:
    """Retention: delete one batch of jobs finished longer ago than ``older_than_seconds``,
    one pruner at a time (the row ``prune`` of ``pgqueue.leader_locks``). Database errors are
    logged."""
    params = {"older_than_seconds": older_than_seconds, "limit": 5000}
    try:
        async with pool.connection(timeout=UPKEEP_CONNECTION_WAIT_SECONDS) as conn:
            await queries.arun(conn, "job_prune", params)
    except psycopg.Error as exc:
        upkeep_failed(pool, "prune", exc)


async def prune_flows(pool: Pool, limit: int = 5000) -> int:
    """Delete up to ``limit`` rows of the scheduler's ``pgqueue.flows`` of tenants that left
    a lane and tier (``flow_prune``; they rejoin afresh, in the same order), one pruner at a
    time (the row ``prune`` of ``pgqueue.leader_locks``). Returns how many rows went; 0 on a
    database error, which is logged."""
    try:
        async with pool.connection(timeout=UPKEEP_CONNECTION_WAIT_SECONDS) as conn:
            row = await queries.arun(conn, "flow_prune", {"limit": limit})
    except psycopg.Error as exc:
        upkeep_failed(pool, "pruning idle flows", exc)
        return 0
    return 0 if row is None else int(row["deleted"])


async def compact_loop(pool: Pool, interval: float, rng: random.Random) -> None:
    """Fold the queued counters' delta rows (admission control) every ``interval`` seconds:
    first any claim rows left by scheduler v1's claims become ordinary rows (a short
    statement, in a transaction of its own), then every unheld row is folded into one per
    key."""

    async def step() -> bool:
        try:
            async with pool.connection(timeout=UPKEEP_CONNECTION_WAIT_SECONDS) as conn:
                await queries.arun(conn, "queue_counts_release_claims")
                await queries.arun(conn, "queue_counts_compact", {"max_rows": 10000})
        except psycopg.Error as exc:
            upkeep_failed(pool, "counter compaction", exc)
        else:
            upkeep_answered(pool)
        return True

    await _every(interval, rng, step)


async def analyze_jobs_if_stale(pool: Pool) -> str:
    """``ANALYZE pgqueue.jobs`` when its planner statistics are missing or describe a table of
    another size (``jobs_analyze_due``: never analyzed, or live rows off from the rows its
    last ANALYZE counted by more than half of them plus 1,000), which autovacuum would fix
    only at its next round. Rows written are not the test: a drain writes each job three
    times without changing the table's size.

    Returns ``"analyzed"``, ``"not due"``, ``"not allowed"`` (this role may not analyze it) or
    ``"failed"`` (a database error, logged). The claim's statements run generic plans made
    once a session; made without statistics they read whole indexes (a claim of 10 took
    6.9 ms instead of 1.6 ms with 10,000 jobs just enqueued), until the next ANALYZE.
    """
    return await _maintain_if_due(
        pool,
        due="jobs_analyze_due",
        params={},
        command="jobs_analyze",
        done="analyzed",
        what="ANALYZE of pgqueue.jobs",
    )


async def analyze_loop(pool: Pool, interval: float, rng: random.Random) -> None:
    """:func:`analyze_jobs_if_stale` at once and every ``interval`` seconds (a cheap look at
    the table's counters; an ANALYZE only when due); returns if this role may not analyze."""
    if await analyze_jobs_if_stale(pool) == "not allowed":
        return

    async def step() -> bool:
        return await analyze_jobs_if_stale(pool) != "not allowed"

    await _every(interval, rng, step)


async def vacuum_loop(pool: Pool, interval: float, rng: random.Random) -> None:
    """:func:`vacuum_hot_tables` every ``interval`` seconds, unless someone did within ~that;
    returns, with one warning, if this role may not vacuum them."""

    async def step() -> bool:
        if await vacuum_hot_tables(pool, interval * 0.8) != "not allowed":
            return True
        log.warning(
            "this role may not VACUUM pgqueue's hot tables (it needs to own them, or "
            "the MAINTAIN privilege on Postgres 17+, which `pgqueue grant` gives "
            "pgqueue_worker): leaving them to autovacuum; set "
            "PGQUEUE_HOT_TABLES_VACUUM_INTERVAL_SECONDS=none to silence this"
        )
        return False

    await _every(interval, rng, step)


async def vacuum_hot_tables(pool: Pool, unless_done_within_seconds: float = 0.0) -> str:
    """``VACUUM`` the scheduler's small, hot tables (``lane_tiers``, ``flows``, ``cursors``),
    the counters and the rate limits, unless someone did within ``unless_done_within_seconds``.

    Returns ``"vacuumed"``, ``"not due"``, ``"not allowed"`` (this role may not vacuum them)
    or ``"failed"`` (a database error, logged; the next round tries again). Every claim moves
    its cursor row and every fold rewrites its lane's rows; the stamper and the claims read
    them by index, and their dead rows would otherwise accumulate for up to
    ``autovacuum_naptime`` (see ``sql/queries/maintenance.sql``).
    """
    return await _maintain_if_due(
        pool,
        due="hot_tables_vacuum_due",
        params={"seconds": unless_done_within_seconds},
        command="hot_tables_vacuum",
        done="vacuumed",
        what="vacuum of the hot tables",
    )


async def _maintain_if_due(
    pool: Pool, *, due: str, params: dict[str, Any], command: str, done: str, what: str
) -> str:
    """Run the maintenance statement ``command`` (never prepared: VACUUM and ANALYZE cannot
    be) when the named query ``due`` says ``due`` and ``allowed``; returns ``done``,
    ``"not due"``, ``"not allowed"`` or ``"failed"`` (a database error, logged)."""
    try:
        async with pool.connection(timeout=UPKEEP_CONNECTION_WAIT_SECONDS) as conn:
            row = await queries.arun(conn, due, params)
            upkeep_answered(pool)
            if row is None or not row["allowed"]:
                return "not allowed"
            if not row["due"]:
                return "not due"
            await queries.arun(conn, command, prepare=False)
    except psycopg.Error as exc:
        upkeep_failed(pool, what, exc)
        return "failed"
    return done
