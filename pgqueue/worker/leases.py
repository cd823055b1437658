"""Leases in the database: extending the ones a worker holds (heartbeat) and putting back the
jobs whose lease expired (rescue). When they run and what the worker counts from the answers
is :mod:`pgqueue.worker.lease_keeper`'s.

Every write is fenced by the lease token (``docs/operations.md``); a database error is logged
(unless the worker's outage report covers it: :func:`pgqueue.worker.outage.upkeep_failed`) and
the next round tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from pgqueue.db import queries
from pgqueue.models import Job, Lease
from pgqueue.worker.outage import UPKEEP_CONNECTION_WAIT_SECONDS, upkeep_answered, upkeep_failed

log = logging.getLogger("pgqueue.worker")


def held_leases(jobs: Iterable[Job]) -> dict[str, Jsonb]:
    """The ``held`` parameter of the named query ``job_heartbeat``: the leases ``jobs`` hold,
    as ONE jsonb object ``{"<id>": [tenant_id, lease_token]}``."""
    return {"held": Jsonb({str(j.id): [j.tenant_id, j.lease_token] for j in jobs})}


async def extend(
    pool: AsyncConnectionPool[Any], jobs: list[Job], lease_seconds: float
) -> set[Lease] | None:
    """Extend the leases of ``jobs`` (at most one lease per job id) to ``lease_seconds`` from
    now (database clock).

    Returns the leases (:attr:`Job.lease`) still held (a row another transaction has locked
    is skipped this round), or None when the database could not be asked (logged).
    """
    params = {**held_leases(jobs), "lease_seconds": lease_seconds}
    try:
        async with pool.connection(timeout=UPKEEP_CONNECTION_WAIT_SECONDS) as conn:
            rows = await queries.arun(conn, "job_heartbeat", params)
    except psycopg.Error as exc:
        upkeep_failed(pool, "heartbeat", exc)
        return None
    upkeep_answered(pool)
    return {(r["id"], r["lease_token"]) for r in rows}


async def why_not_extended(
    pool: AsyncConnectionPool[Any], jobs: list[Job]
) -> dict[Lease, str] | None:
    """Why a heartbeat could not extend the leases of ``jobs``, by lease, from their committed
    state and lease token, read without a lock: ``"held"`` (still this lease: another
    transaction holds the row, a cancel not yet committed or a user's UPDATE; ask again next
    time), ``"cancelled"`` (``pgqueue.cancel``: stop the handler), ``"deleted"`` (no such row
    any more: stop the handler too), or ``"lost"`` (rescued, claimed again or finished). None
    on a database error (logged; the next heartbeat asks again). Found by a tester: a held row
    was taken for a lost lease, for good."""
    try:
        async with pool.connection(timeout=UPKEEP_CONNECTION_WAIT_SECONDS) as conn:
            rows = await queries.arun(conn, "job_lease_states", {"ids": [j.id for j in jobs]})
    except psycopg.Error as exc:
        upkeep_failed(pool, "reading the state of jobs whose lease was not extended", exc)
        return None
    committed = {r["id"]: (r["state"], r["lease_token"], r["tenant_id"]) for r in rows}
    verdicts: dict[Lease, str] = {}
    for job in jobs:
        if job.id not in committed:
            verdicts[job.lease] = "deleted"
            continue
        state, token, tenant = committed[job.id]
        # (a job moved to another tenant by hand is lost: every write is fenced by the tenant
        # too, so it was "held" at every heartbeat until its lease ran out; found by a tester)
        if state == "running" and token == job.lease_token and tenant == job.tenant_id:
            verdicts[job.lease] = "held"
        elif state == "cancelled":
            verdicts[job.lease] = "cancelled"
        else:
            verdicts[job.lease] = "lost"
    return verdicts


async def rescue(pool: AsyncConnectionPool[Any], limit: int = 1000) -> list[dict[str, Any]]:
    """Put back (or fail, once their attempts are spent) up to ``limit`` jobs whose lease
    expired; one rescuer at a time across workers (the row ``rescue`` of
    ``pgqueue.leader_locks``). Returns their
    ``id`` and new ``state``; an empty list on a database error (logged)."""
    try:
        async with pool.connection(timeout=UPKEEP_CONNECTION_WAIT_SECONDS) as conn:
            rows: list[dict[str, Any]] = await queries.arun(conn, "job_rescue", {"limit": limit})
    except psycopg.Error as exc:
        upkeep_failed(pool, "rescue", exc)
        return []
    upkeep_answered(pool)
    return rows
