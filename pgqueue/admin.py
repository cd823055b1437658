"""Operator actions on stored jobs and tenants (``pgqueue retry``, ``pgqueue tenants set``,
the dashboard's actions), each one named statement."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from pgqueue.db import queries
from pgqueue.errors import InvalidArgument, from_sqlstate
from pgqueue.models import Tier
from pgqueue.validation import check_tenant_id, check_tier


@dataclass(frozen=True)
class HeldJob:
    """A failed job that a bulk retry left failed: a live (queued or running) job of its
    tenant holds its dedupe key. ``held_by`` is that job's id (None when it committed after
    the snapshot of a ``REPEATABLE READ`` transaction)."""

    job_id: int
    dedupe_key: str
    held_by: int | None


class Requeued(list[int]):
    """What :func:`requeue_failed` did: a list of the ids re-queued, as before revision 0070
    (now in increasing order), and ``skipped``, the :class:`HeldJob` of each matching job left
    failed because a live job holds its dedupe key, by id (before, one such job made the whole
    retry fail with a unique violation)."""

    def __init__(self, ids: list[int], skipped: list[HeldJob]) -> None:
        super().__init__(ids)
        self.skipped = skipped


def requeue_failed(
    conn: psycopg.Connection[Any],
    *,
    tenant_id: str | None = None,
    tier: Tier | str | None = None,
    reason: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Requeued:
    """Put failed jobs back in the queue with fresh attempt and throttle counters
    (``pgqueue.retry_failed_outcomes``).

    Filters combine with AND: ``tenant_id``; ``tier`` (any case: ``BATCH`` is ``batch``);
    ``reason``, a case-insensitive substring of ``last_error``; ``since``/``until``, a range of
    ``finished_at`` (timezone-aware). A job whose dedupe key a live job of its tenant holds is
    left failed (only one live job may hold a key); of failed jobs sharing a key, the newest is
    re-queued. Runs in the caller's transaction. Returns a :class:`Requeued`: a list of the ids
    re-queued, with the jobs skipped in its ``skipped``.

    Raises:
        InvalidArgument: an unknown tier, naive datetimes, or ``since`` after ``until``.
        InvalidTenant: a ``tenant_id`` that is empty or too long (no tenant has it).
    """
    if tenant_id is not None:
        check_tenant_id(tenant_id)
    tier_value = None if tier is None else check_tier(tier)
    for moment in (since, until):
        if moment is not None and moment.tzinfo is None:
            raise InvalidArgument("since/until must be timezone-aware datetimes")
    if since is not None and until is not None and since > until:
        raise InvalidArgument("since must not be after until")
    rows = queries.run(
        conn,
        "job_requeue_failed",
        {
            "tenant_id": tenant_id,
            "tier": tier_value,
            # a substring, literally: pgqueue.retry_failed_outcomes matches with strpos, not
            # LIKE (found by a tester: `--reason '%'` re-queued every failed job)
            "reason": reason,
            "since": since,
            "until": until,
        },
    )
    return Requeued(
        [int(r["id"]) for r in rows if r["requeued"]],
        [HeldJob(int(r["id"]), r["dedupe_key"], r["held_by"]) for r in rows if not r["requeued"]],
    )


def retry_job(conn: psycopg.Connection[Any], job_id: int) -> str:
    """Put one failed or cancelled job back in the queue with fresh attempt and throttle
    counters (``pgqueue.retry``), in the caller's transaction. Returns its state after:
    ``queued``, or its state unchanged when it was not failed or cancelled.

    Raises:
        InvalidArgument: ``job_id`` out of 1 to 2^63-1.
        UnknownJob: no such job (the caller's transaction is aborted).
        DedupeKeyHeld: a live job of its tenant holds its dedupe key (the caller's
            transaction is aborted).
        SchemaOutOfDate: the database predates revision 0034 (run ``pgqueue migrate``).
    """
    if isinstance(job_id, bool) or not 1 <= job_id <= 2**63 - 1:
        raise InvalidArgument(f"job_id must be an integer from 1 to 2^63-1, got {job_id!r}")
    try:
        row = queries.run(conn, "job_retry_one", {"job_id": job_id, "tenant_id": None})
    except psycopg.Error as exc:
        mapped = from_sqlstate(
            exc.sqlstate, exc.diag.message_primary or str(exc), exc.diag.message_detail
        )
        if mapped is not None:
            raise mapped from exc
        raise
    return str(row["state"])


def set_tenant(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    *,
    plan: str | None = None,
    quantum: float | None = None,
    daily_token_budget: int | None = None,
) -> dict[str, Any]:
    """Create a tenant or change its plan, DRR quantum (cost units) or daily input-token
    budget (``pgqueue.tenant_set``); None keeps a value (a new tenant: plan ``free``, the
    default quantum and budget). Returns the tenant's row: tenant_id, plan, quantum,
    daily_token_budget. In the caller's transaction.

    Raises:
        InvalidTenant, NulCharacter: a bad tenant id. InvalidArgument: an unknown plan.
        psycopg.errors.CheckViolation: a quantum or budget the table refuses.
    """
    from pgqueue.validation import check_plan

    check_tenant_id(tenant_id)
    params = {
        "tenant_id": tenant_id,
        "plan": None if plan is None else check_plan(plan),
        "quantum": quantum,
        "daily_token_budget": daily_token_budget,
    }
    row: dict[str, Any] = queries.run(conn, "tenant_upsert", params)
    return row


def prune_finished(
    conn: psycopg.Connection[Any], *, older_than_seconds: float, batch: int = 10_000
) -> int:
    """Delete finished jobs (succeeded, failed, cancelled) that finished more than
    ``older_than_seconds`` ago, in batches of ``batch`` (each its own statement); returns how
    many. Queued and running jobs are never touched. One pruner at a time (the row ``prune``
    of ``pgqueue.leader_locks``): a concurrent call deletes nothing.

    Raises:
        InvalidArgument: a negative age or a batch below 1.
    """
    if older_than_seconds < 0 or batch < 1:
        raise InvalidArgument("older_than_seconds must be >= 0 and batch >= 1")
    total = 0
    while True:
        row = queries.run(
            conn,
            "job_prune",
            {"older_than_seconds": older_than_seconds, "limit": batch},
        )
        if not conn.autocommit:
            conn.commit()
        deleted = int(row["deleted"])
        total += deleted
        if deleted < batch:
            return total


def prune_flows(conn: psycopg.Connection[Any], *, batch: int = 10_000) -> int:
    """Delete the scheduler's flow rows (``pgqueue.flows``) of tenants that left a lane and tier
    (not cut, last stamped job no longer queued, last key reached by the cursor), which rejoin
    afresh at their next job, in the same order (see ``docs/drr.md``, "Pruning"). In batches
    of ``batch`` rows (each its own statement); returns how many. Lanes and tiers being folded
    just then are skipped. One pruner at a time (the row ``prune`` of
    ``pgqueue.leader_locks``): a concurrent call deletes nothing.

    Raises:
        InvalidArgument: a batch below 1.
    """
    if batch < 1:
        raise InvalidArgument("batch must be >= 1")
    total = 0
    while True:
        row = queries.run(conn, "flow_prune", {"limit": batch})
        if not conn.autocommit:
            conn.commit()
        deleted = int(row["deleted"])
        total += deleted
        if deleted < batch:
            return total
