"""Cancelling jobs: :func:`cancel` (one job) and :func:`cancel_queued` (a tenant's backlog),
the Python faces of the SQL functions ``pgqueue.cancel`` and ``pgqueue.cancel_queued``.

Like :func:`pgqueue.enqueue`, it takes a psycopg ``Connection`` or ``AsyncConnection`` or a
SQLAlchemy ``Session`` or ``AsyncSession`` (psycopg driver) and runs in the caller's
transaction: the cancellation commits or rolls back with it.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, overload

import psycopg

from pgqueue.db import queries
from pgqueue.enqueue import (
    AsyncTarget,
    SyncTarget,
    _async_conn,
    _is_async,
    _sync_conn,
    _translate,
)
from pgqueue.errors import InvalidArgument
from pgqueue.models import Tier
from pgqueue.validation import _check_text, _shown, check_tenant_id

#: Longest cancellation reason, in characters (as ``pgqueue.cancel`` checks).
MAX_REASON_CHARS = 1000

_BIGINT_MAX = 2**63 - 1


def _params(job_id: int, tenant_id: str | None, reason: str | None) -> dict[str, Any]:
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 1 <= job_id <= _BIGINT_MAX:
        raise InvalidArgument(f"job_id must be an integer from 1 to 2^63-1, got {job_id!r}")
    if tenant_id is not None:
        tenant_id = check_tenant_id(tenant_id)
    if reason is not None:
        reason = _check_text(reason, "reason", MAX_REASON_CHARS, InvalidArgument)
    return {"job_id": job_id, "tenant_id": tenant_id, "reason": reason}


@overload
def cancel(
    conn: AsyncTarget, job_id: int, *, tenant_id: str | None = None, reason: str | None = None
) -> Awaitable[str]: ...
@overload
def cancel(
    conn: SyncTarget, job_id: int, *, tenant_id: str | None = None, reason: str | None = None
) -> str: ...
def cancel(
    conn: SyncTarget | AsyncTarget,
    job_id: int,
    *,
    tenant_id: str | None = None,
    reason: str | None = None,
) -> str | Awaitable[str]:
    """Cancel a queued or running job, in the caller's transaction; return its state after.

    A queued job is never claimed. A running job loses its lease at once: its worker's outcome
    write is fenced off (dropped, and its tokens are not charged to the tenant's budget), and
    the worker stops the handler at its next heartbeat (``heartbeat_seconds``, default 15 s),
    freeing the slot; a provider call already sent may still be billed by the provider. A
    finished job is left as it is.

    Args:
        conn: as for :func:`pgqueue.enqueue`; an async one makes this return an awaitable.
        job_id: the id :func:`pgqueue.enqueue` returned.
        tenant_id: when given, only that tenant's job (a job of another tenant is reported as
            unknown, so ids cannot be probed across tenants). A session that sets
            ``pgqueue.tenant_id`` only ever reaches its own tenant's jobs; a producer session
            (role ``pgqueue_producer``, see ``pgqueue grant``) must set it.
        reason: optional, 1 to 1,000 characters, stored in ``last_error`` as
            ``cancelled: <reason>`` (``cancelled`` without one).

    Returns:
        ``"cancelled"`` (now, or already before), or ``"succeeded"`` / ``"failed"`` when the
        job had already finished that way (nothing changed).

    Raises:
        UnknownJob: no such job (for that tenant); the caller's transaction is aborted, as
            with any database error (use a savepoint to keep it).
        InvalidArgument, InvalidTenant, NulCharacter: bad arguments, before any statement.
        psycopg.errors.InsufficientPrivilege: a producer session without ``pgqueue.tenant_id``.
        SchemaOutOfDate: the database predates revision 0024 (run ``pgqueue migrate``).

    The row stays locked until the caller's transaction ends; workers go on with their other
    jobs meanwhile (they skip a held row and write its outcome on its own).
    """
    params = _params(job_id, tenant_id, reason)
    if _is_async(conn):
        return _as_text(_run_async(conn, "job_cancel", params), "state")  # type: ignore[arg-type]
    return str(_run_sync(conn, "job_cancel", params)["state"])  # type: ignore[arg-type]


def _run_sync(conn: SyncTarget, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The one row of the named query on the caller's connection; database errors mapped to
    pgqueue's (``UnknownJob`` and the rest, :func:`pgqueue.errors.from_sqlstate`)."""
    try:
        row: dict[str, Any] = queries.run(_sync_conn(conn), name, params)
    except psycopg.Error as exc:
        raise _translate(exc) from exc
    return row


async def _run_async(conn: AsyncTarget, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """:func:`_run_sync` on an async connection."""
    aconn = await _async_conn(conn)
    try:
        row: dict[str, Any] = await queries.arun(aconn, name, params)
    except psycopg.Error as exc:
        raise _translate(exc) from exc
    return row


async def _as_text(row: Awaitable[dict[str, Any]], column: str) -> str:
    return str((await row)[column])


async def _as_int(row: Awaitable[dict[str, Any]], column: str) -> int:
    return int((await row)[column])


@overload
def cancel_queued(
    conn: AsyncTarget,
    tenant_id: str,
    *,
    tier: Tier | str | None = None,
    reason: str | None = None,
) -> Awaitable[int]: ...
@overload
def cancel_queued(
    conn: SyncTarget,
    tenant_id: str,
    *,
    tier: Tier | str | None = None,
    reason: str | None = None,
) -> int: ...
def cancel_queued(
    conn: SyncTarget | AsyncTarget,
    tenant_id: str,
    *,
    tier: Tier | str | None = None,
    reason: str | None = None,
) -> int | Awaitable[int]:
    """Cancel every queued job of ``tenant_id`` (of one ``tier``, when given), in the caller's
    transaction; return how many. Running jobs are left to finish (:func:`cancel` them one by
    one). A row another transaction holds at that moment (a claim taking it) is skipped, not
    waited for.

    Args:
        conn: as for :func:`pgqueue.enqueue`; an async one makes this return an awaitable.
        tenant_id: 1 to 128 characters. A session that sets ``pgqueue.tenant_id`` may only
            name that tenant; a producer session must set it.
        tier: ``critical`` | ``standard`` | ``batch``, or None for all three.
        reason: as for :func:`cancel`.

    Raises:
        InvalidTenant, InvalidArgument, NulCharacter: bad arguments (an unknown tier too),
            before any statement.
        psycopg.errors.InsufficientPrivilege: another tenant than the session's scope, or a
            producer session without one (the caller's transaction is aborted).
        SchemaOutOfDate: the database predates revision 0024 (run ``pgqueue migrate``).
    """
    checked = check_tenant_id(tenant_id)
    tier_value: str | None = None
    if tier is not None:
        try:
            tier_value = Tier(tier).value
        except ValueError:
            raise InvalidArgument(f"unknown tier {_shown(tier)}") from None
    if reason is not None:
        reason = _check_text(reason, "reason", MAX_REASON_CHARS, InvalidArgument)
    params = {"tenant_id": checked, "tier": tier_value, "reason": reason}
    if _is_async(conn):
        row = _run_async(conn, "job_cancel_queued", params)  # type: ignore[arg-type]
        return _as_int(row, "cancelled")
    return int(_run_sync(conn, "job_cancel_queued", params)["cancelled"])  # type: ignore[arg-type]
