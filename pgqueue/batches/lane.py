"""Parking claimed jobs in a collecting batch, and switching the lane on or off.

A worker's claim returns batch-lane jobs (``pgqueue.batch_lane_takes``) in DRR order among
tenants, like any other job; instead of running them, the worker parks them here: each joins
a collecting batch (one with room, else a new one) and stays ``running`` under its lease,
owned from now on by the batch (:mod:`pgqueue.batches.poller`), never by the worker's slots.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from pgqueue.db import queries
from pgqueue.models import Job
from pgqueue.worker.transient import first_line

log = logging.getLogger("pgqueue.worker")


async def park(conn: psycopg.AsyncConnection[Any], jobs: Sequence[Job], max_requests: int) -> int:
    """Link ``jobs`` (claimed, still leased) to a collecting batch with room for them all,
    opening one if none has room; one transaction. Returns the batch id.

    A job whose lease was lost meanwhile (cancelled) is left out. The batch's row is locked
    until commit, so a worker sealing batches skips it meanwhile.

    Raises:
        psycopg.Error: the database failed; nothing is linked and the jobs' leases run out
            (the rescuer puts them back: none of them was sent).
    """
    async with conn.transaction():
        row = await queries.arun(
            conn, "batch_collecting", {"n": len(jobs), "max_requests": max_requests}
        )
        if row is None:
            row = await queries.arun(conn, "batch_open")
        batch_id = int(row["id"])
        await queries.arun(
            conn,
            "batch_add_jobs",
            {
                "batch_id": batch_id,
                "ids": [j.id for j in jobs],
                "tenants": [j.tenant_id for j in jobs],
                "tokens": [j.lease_token for j in jobs],
            },
        )
    return batch_id


def set_lane(conn: psycopg.Connection[Any], tenant_id: str | None, enabled: bool) -> None:
    """Switch the batches lane on or off for ``tenant_id``, or for every tenant without a
    setting of its own (``None``). Takes effect at the next claim."""
    queries.run(conn, "batch_lane_set", {"tenant_id": tenant_id or "", "enabled": enabled})


async def park_claimed(
    pool: AsyncConnectionPool[Any], jobs: Sequence[Job], max_requests: int
) -> None:
    """:func:`park` on a pooled connection, for the worker's claim; a database error is
    logged (the jobs' leases run out and the rescuer puts them back, unsent)."""
    try:
        async with pool.connection() as conn:
            await park(conn, jobs, max_requests)
    except (psycopg.Error, PoolTimeout) as exc:
        log.warning("batches: could not park %d job(s) (%s)", len(jobs), first_line(exc))


async def open_batches(pool: AsyncConnectionPool[Any]) -> int:
    """How many batches have not ended (a burst worker waits for them)."""
    async with pool.connection() as conn:
        row = await queries.arun(conn, "batch_open_count")
    return int(row["open"])
