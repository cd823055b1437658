"""Transactional enqueue: jobs join the caller's transaction, and wake workers only on commit.

One function, :func:`enqueue`, takes a psycopg ``Connection`` or ``AsyncConnection`` or a
SQLAlchemy ``Session`` or ``AsyncSession`` (psycopg driver); with an async connection it
returns an awaitable. :func:`enqueue_many` does the same for many jobs in one round trip. Both
validate everything before the first statement (so a bad job leaves the caller's transaction
usable), then call the SQL functions ``pgqueue.try_enqueue`` / ``pgqueue.try_enqueue_batch`` —
the bodies of ``pgqueue.enqueue`` / ``pgqueue.enqueue_many`` that SQL callers use, so
classification and admission control live in one place.

Admission control (per-tier and per-tenant caps on queued jobs, see ``docs/admission.md``)
answers with a row rather than an error, so a full tier never aborts the caller's
transaction: ``reject`` raises :class:`~pgqueue.errors.QueueFull`, ``drop`` returns ``None``,
and ``block`` waits here for room (polling, with backoff) up to a timeout — but only when the
caller has no transaction open, since waiting would hold its locks
(:class:`~pgqueue.errors.CannotBlockInTransaction` otherwise).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Mapping, Sequence
from datetime import datetime
from typing import Any, overload

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy.orm import Session

from pgqueue.batch import JobSpec, check_batch
from pgqueue.db import queries
from pgqueue.enqueue_admission import EnqueueAdmission
from pgqueue.errors import (
    InvalidArgument,
    from_sqlstate,
)
from pgqueue.models import DEFAULT_KIND, Origin
from pgqueue.settings import Settings
from pgqueue.validation import (
    CheckedJob,
    check_job,
)

try:  # the asyncio extension needs greenlet: without it, a sync Session still works
    from sqlalchemy.ext.asyncio import AsyncSession
except ImportError:  # pragma: no cover  (found by a tester: SQLAlchemy 2.1 dropped greenlet)
    AsyncSession = None  # type: ignore[assignment,misc]

SyncTarget = psycopg.Connection[Any] | Session
AsyncTarget = psycopg.AsyncConnection[Any] | AsyncSession

_DEFAULT_SETTINGS: Settings | None = None


def _settings() -> Settings:
    global _DEFAULT_SETTINGS
    if _DEFAULT_SETTINGS is None:
        _DEFAULT_SETTINGS = Settings()
    return _DEFAULT_SETTINGS


def _params(job: CheckedJob) -> dict[str, Any]:
    return {
        "tenant_id": job.tenant_id,
        "origin": job.origin.value,
        "payload": job.payload_json,  # JSON text, cast to jsonb by the query
        "sla_seconds": job.sla_seconds,
        "kind": job.kind,
        "max_attempts": job.max_attempts,
        "run_at": job.run_at,
        "dedupe_key": job.dedupe_key,
    }


def _translate(exc: psycopg.Error) -> Exception:
    mapped = from_sqlstate(
        exc.sqlstate, exc.diag.message_primary or str(exc), exc.diag.message_detail
    )
    return mapped if mapped is not None else exc


def _in_transaction(status: TransactionStatus) -> bool:
    return status != TransactionStatus.IDLE


def _run_sync(
    target: SyncTarget,
    name: str,
    params: dict[str, Any],
    tenant_ids: Sequence[str],
    timeout_seconds: float,
    *,
    many: bool,
) -> list[dict[str, Any]]:
    conn = _sync_conn(target)
    status = conn.info.transaction_status
    adm = EnqueueAdmission(tenant_ids, timeout_seconds, in_transaction=_in_transaction(status))
    while True:
        try:
            result = queries.run(conn, name, params)
        except psycopg.Error as exc:
            raise _translate(exc) from exc
        pause = adm.step(_admission_rows(result, many), time.monotonic(), many=many)
        if pause is None:
            return [result]
        if conn.info.transaction_status == TransactionStatus.INTRANS:
            conn.rollback()  # the transaction our statement opened; nothing else is in it
        time.sleep(pause)


async def _run_async(
    target: AsyncTarget,
    name: str,
    params: dict[str, Any],
    tenant_ids: Sequence[str],
    timeout_seconds: float,
    *,
    many: bool,
) -> list[dict[str, Any]]:
    conn = await _async_conn(target)
    status = conn.info.transaction_status
    adm = EnqueueAdmission(tenant_ids, timeout_seconds, in_transaction=_in_transaction(status))
    while True:
        try:
            result = await queries.arun(conn, name, params)
        except psycopg.Error as exc:
            raise _translate(exc) from exc
        pause = adm.step(_admission_rows(result, many), time.monotonic(), many=many)
        if pause is None:
            return [result]
        if conn.info.transaction_status == TransactionStatus.INTRANS:
            await conn.rollback()  # the transaction our statement opened; nothing else is in it
        await asyncio.sleep(pause)


def _admission_rows(result: dict[str, Any], many: bool) -> list[dict[str, Any]]:
    """The rows admission control reads: the one row of a single enqueue, or a batch's jobs
    that were not enqueued (``job_try_enqueue_batch``'s ``others``)."""
    if not many:
        return [result]
    others: str | None = result["others"]  # JSON text: see the query
    return [] if others is None else list(json.loads(others))


def _batch_ids(row: Mapping[str, Any], jobs: int) -> list[int | None]:
    """A batch's ids in input order, ``None`` for a job dropped.

    Raises:
        RuntimeError: the database returned another number of ids than jobs sent (the schema
            is not the one this pgqueue expects).
    """
    ids = [None if i is None else int(i) for i in row["ids"] or ()]
    if len(ids) != jobs:
        raise RuntimeError(f"enqueue_many: {len(ids)} ids returned for {jobs} jobs")
    return ids


def _sync_conn(target: SyncTarget) -> psycopg.Connection[Any]:
    if isinstance(target, psycopg.Connection):
        return target
    if isinstance(target, Session):
        raw = target.connection().connection.driver_connection
        if isinstance(raw, psycopg.Connection):
            return raw
    raise InvalidArgument(
        "enqueue needs a psycopg Connection or a SQLAlchemy Session on the psycopg driver "
        f"(postgresql+psycopg://), got {type(target).__name__}"
    )


async def _async_conn(target: AsyncTarget) -> psycopg.AsyncConnection[Any]:
    if isinstance(target, psycopg.AsyncConnection):
        return target
    if AsyncSession is not None and isinstance(target, AsyncSession):
        conn = await target.connection()
        raw = (await conn.get_raw_connection()).driver_connection
        if isinstance(raw, psycopg.AsyncConnection):
            return raw
    raise InvalidArgument(
        "enqueue needs a psycopg AsyncConnection or an AsyncSession on the psycopg driver, "
        f"got {type(target).__name__}"
    )


def _is_async(target: object) -> bool:
    return isinstance(target, psycopg.AsyncConnection) or (
        AsyncSession is not None and isinstance(target, AsyncSession)
    )


@overload
def enqueue(
    conn: AsyncTarget,
    *,
    tenant_id: str,
    origin: Origin | str,
    payload: Mapping[str, Any],
    sla_seconds: float | None = None,
    kind: str = DEFAULT_KIND,
    max_attempts: int | None = None,
    run_at: datetime | None = None,
    dedupe_key: str | None = None,
    block_timeout_seconds: float | None = None,
    settings: Settings | None = None,
) -> Awaitable[int | None]: ...
@overload
def enqueue(
    conn: SyncTarget,
    *,
    tenant_id: str,
    origin: Origin | str,
    payload: Mapping[str, Any],
    sla_seconds: float | None = None,
    kind: str = DEFAULT_KIND,
    max_attempts: int | None = None,
    run_at: datetime | None = None,
    dedupe_key: str | None = None,
    block_timeout_seconds: float | None = None,
    settings: Settings | None = None,
) -> int | None: ...
def enqueue(
    conn: SyncTarget | AsyncTarget,
    *,
    tenant_id: str,
    origin: Origin | str,
    payload: Mapping[str, Any],
    sla_seconds: float | None = None,
    kind: str = DEFAULT_KIND,
    max_attempts: int | None = None,
    run_at: datetime | None = None,
    dedupe_key: str | None = None,
    block_timeout_seconds: float | None = None,
    settings: Settings | None = None,
) -> int | Awaitable[int | None] | None:
    """Enqueue one job inside the caller's transaction and return its id.

    Args:
        conn: psycopg ``Connection``/``AsyncConnection`` or SQLAlchemy ``Session``/
            ``AsyncSession``; the job commits or rolls back with the caller's transaction, and
            workers are woken (NOTIFY) only on commit.
        tenant_id: 1 to 128 characters; unknown tenants are registered on first use unless the
            database sets ``pgqueue.require_known_tenant``.
        origin: ``user_action`` | ``scheduled`` | ``batch_job``; with ``sla_seconds`` it picks
            the tier (user_action → critical; no SLA or ≥ 86,400 s → batch; else standard;
            a demoted tenant → batch). Callers never pass a tier.
        payload: Messages API parameters for the default kind (``model``, ``max_tokens`` > 0,
            non-empty ``messages``); any JSON object for other kinds. At most
            ``max_payload_bytes`` (default 1 MiB) as Postgres prints it as jsonb (numbers
            written in full: ``1e16`` counts 17 bytes); keep the GUC
            ``pgqueue.max_payload_bytes`` equal to ``settings.max_payload_bytes``.
        sla_seconds: seconds the caller can wait, ``None`` for no SLA; finite and ≥ 0.
        kind: the handler name (default ``anthropic.messages``).
        max_attempts: failure attempts before the job fails (default 5; 1–1000).
        dedupe_key: optional, 1–256 characters, unique among the tenant's live (queued or
            running) jobs: enqueueing a key that is live returns the existing job's id and
            writes nothing (at-least-once producers made safe). Once that job has finished,
            the key may be used again.
        run_at: earliest start (timezone-aware), default now (database clock).
        block_timeout_seconds: when the job's tier is full and its policy is ``block``, wait
            this long for room (default ``settings.admission_block_timeout_seconds``).

    Returns:
        The job id — or ``None`` when the job's tier is full and its admission policy is
        ``drop`` (nothing stored; the drop is counted) — or an awaitable of it when ``conn``
        is async.

    Raises:
        InvalidTenant, UnknownOrigin, InvalidSla, InvalidPayload, PayloadTooLarge,
        NulCharacter, InvalidKind, InvalidArgument: before any statement is sent, so the
            caller's transaction stays usable and nothing is written.
        UnknownTenant: raised by the database when it requires known tenants; the caller's
            transaction is then aborted (use a savepoint to keep it).
        QueueFull: the tier (or the tenant's share of it) holds its cap of queued jobs and the
            policy is ``reject``, or ``block`` and no room came within the timeout. Nothing was
            written and the caller's transaction is still usable (no savepoint needed).
        CannotBlockInTransaction: a ``QueueFull`` for policy ``block`` when the caller has a
            transaction open: pgqueue does not wait while holding the caller's locks.
        SchemaOutOfDate: the database lacks a function this pgqueue calls (run ``pgqueue
            migrate``); the caller's transaction is aborted.
    """
    cfg = settings or _settings()
    timeout = (
        cfg.admission_block_timeout_seconds
        if block_timeout_seconds is None
        else block_timeout_seconds
    )
    job = check_job(
        tenant_id=tenant_id,
        origin=origin,
        payload=payload,
        sla_seconds=sla_seconds,
        kind=kind,
        max_attempts=max_attempts,
        run_at=run_at,
        dedupe_key=dedupe_key,
        max_payload_bytes=cfg.max_payload_bytes,
    )
    params = _params(job)
    tenants = [job.tenant_id]
    if _is_async(conn):
        return _enqueue_async(conn, params, tenants, timeout)  # type: ignore[arg-type]
    rows = _run_sync(
        conn,  # type: ignore[arg-type]
        "job_try_enqueue",
        params,
        tenants,
        timeout,
        many=False,
    )
    return _id(rows[0])


def _id(row: Mapping[str, Any]) -> int | None:
    return None if row["id"] is None else int(row["id"])


async def _enqueue_async(
    conn: AsyncTarget, params: dict[str, Any], tenants: list[str], block_seconds: float
) -> int | None:
    rows = await _run_async(conn, "job_try_enqueue", params, tenants, block_seconds, many=False)
    return _id(rows[0])


@overload
def enqueue_many(
    conn: AsyncTarget,
    jobs: Sequence[JobSpec | Mapping[str, Any]],
    *,
    block_timeout_seconds: float | None = None,
    settings: Settings | None = None,
) -> Awaitable[list[int | None]]: ...
@overload
def enqueue_many(
    conn: SyncTarget,
    jobs: Sequence[JobSpec | Mapping[str, Any]],
    *,
    block_timeout_seconds: float | None = None,
    settings: Settings | None = None,
) -> list[int | None]: ...
def enqueue_many(
    conn: SyncTarget | AsyncTarget,
    jobs: Sequence[JobSpec | Mapping[str, Any]],
    *,
    block_timeout_seconds: float | None = None,
    settings: Settings | None = None,
) -> list[int | None] | Awaitable[list[int | None]]:
    """Enqueue many jobs in one statement inside the caller's transaction; ids in input order.

    ``jobs`` holds :class:`JobSpec` values or mappings with the same keys. Every job is
    validated first; one bad job raises its typed error (prefixed ``job <index>:``) and
    nothing is written. Admission runs in input order: a job is admitted while its tier and
    its tenant still have room after the jobs admitted before it. A job refused by a full tier
    whose policy is ``reject`` (or ``block``, after the wait) raises :class:`QueueFull` for
    the whole batch — nothing is written; jobs of ``drop`` tiers that find no room are
    dropped, ``None`` at their position. Raises as :func:`enqueue` does.
    """
    cfg = settings or _settings()
    timeout = (
        cfg.admission_block_timeout_seconds
        if block_timeout_seconds is None
        else block_timeout_seconds
    )
    batch = check_batch(jobs, cfg.max_payload_bytes)
    if not batch.tenant_ids:
        return _empty_async() if _is_async(conn) else []
    params = batch.params()
    tenants = batch.tenant_ids
    if _is_async(conn):
        return _enqueue_many_async(conn, params, tenants, timeout)  # type: ignore[arg-type]
    rows = _run_sync(
        conn,  # type: ignore[arg-type]
        "job_try_enqueue_batch",
        params,
        tenants,
        timeout,
        many=True,
    )
    return _batch_ids(rows[0], len(tenants))


async def _empty_async() -> list[int | None]:
    return []


async def _enqueue_many_async(
    conn: AsyncTarget, params: dict[str, Any], tenants: list[str], block_seconds: float
) -> list[int | None]:
    rows = await _run_async(
        conn, "job_try_enqueue_batch", params, tenants, block_seconds, many=True
    )
    return _batch_ids(rows[0], len(tenants))
