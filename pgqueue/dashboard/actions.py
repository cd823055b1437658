"""The dashboard's actions: each one named SQL function that the admin role may call
(``pgqueue grant`` gives ``pgqueue_admin`` every function of the schema), run in its own
transaction.

- cancel a job: ``pgqueue.cancel`` (:func:`pgqueue.cancel`);
- retry a failed or cancelled job: ``pgqueue.retry`` (:func:`pgqueue.admin.retry_job`);
- redrive a tenant's failed jobs: ``pgqueue.retry_failed_outcomes``
  (:func:`pgqueue.admin.requeue_failed`, as ``pgqueue retry --tenant``);
- change a tenant's plan or quantum: ``pgqueue.tenant_set`` (as ``pgqueue tenants set``).
"""

from __future__ import annotations

from typing import Any

import psycopg

from pgqueue.admin import requeue_failed, retry_job, set_tenant
from pgqueue.cancel import cancel
from pgqueue.errors import InvalidArgument
from pgqueue.validation import check_plan, check_tenant_id, check_tier

_BIGINT_MAX = 2**63 - 1


def parse_job_id(text: str) -> int:
    """A job id from a form field.

    Raises:
        InvalidArgument: not an integer from 1 to 2^63-1.
    """
    try:
        value = int(text.strip())
    except ValueError:
        raise InvalidArgument(f"job id must be an integer, got {text[:40]!r}") from None
    if not 1 <= value <= _BIGINT_MAX:
        raise InvalidArgument(f"job id must be from 1 to 2^63-1, got {value}")
    return value


def cancel_job(conn: psycopg.Connection[Any], job_id: int, reason: str | None) -> str:
    """Cancel one job; its state after (``cancelled``, or how it had already finished).

    Raises:
        UnknownJob: no such job. InvalidArgument: a bad reason.
    """
    with conn.transaction():
        return cancel(conn, job_id, reason=reason or None)


def retry(conn: psycopg.Connection[Any], job_id: int) -> str:
    """Put a failed or cancelled job back in the queue; its state after (``queued``, or its
    state unchanged when it was neither).

    Raises:
        UnknownJob: no such job.
        DedupeKeyHeld: a live job of its tenant holds its dedupe key.
    """
    with conn.transaction():
        return retry_job(conn, job_id)


def redrive(conn: psycopg.Connection[Any], tenant_id: str, tier: str | None) -> tuple[int, int]:
    """Re-queue every failed job of ``tenant_id`` (of one ``tier``, when given); how many, and
    how many were left failed because a live job holds their dedupe key.

    Raises:
        InvalidTenant, InvalidArgument: a bad tenant id or tier.
    """
    check_tenant_id(tenant_id)
    with conn.transaction():
        done = requeue_failed(conn, tenant_id=tenant_id, tier=check_tier(tier) if tier else None)
    return len(done), len(done.skipped)


def configure_tenant(
    conn: psycopg.Connection[Any], tenant_id: str, plan: str | None, quantum: str | None
) -> dict[str, Any]:
    """Change a tenant's plan and/or quantum (cost units, 0.001 to 1e9); an empty field keeps
    the value. Returns the tenant's row.

    Raises:
        InvalidTenant, InvalidArgument: a bad tenant id, plan or quantum, or neither given.
    """
    check_tenant_id(tenant_id)
    plan_value = check_plan(plan) if plan else None
    quantum_value: float | None = None
    if quantum:
        try:
            quantum_value = float(quantum)
        except ValueError:
            raise InvalidArgument(f"quantum must be a number, got {quantum[:40]!r}") from None
        if not 0.001 <= quantum_value <= 1e9:  # NaN fails too
            raise InvalidArgument(f"quantum must be from 0.001 to 1e9, got {quantum[:40]!r}")
    if plan_value is None and quantum_value is None:
        raise InvalidArgument("give a plan or a quantum")
    with conn.transaction():
        return set_tenant(conn, tenant_id, plan=plan_value, quantum=quantum_value)
