"""Transactional enqueue: jobs join the caller's transaction, and wake workers only on commit.

One function, :func:`enqueue`, takes a psycopg ``Connection`` or ``AsyncConnection`` or a
SQLAlchemy ``Session`` or ``AsyncSession`` (psycopg driver); with an async connection it
returns an awaitable. :func:`enqueue_many` does the same for many jobs in one round trip. Both
validate everything before the first statement (so a bad job leaves the caller's transaction
usable), then call the SQL functions ``pgqueue.enqueue`` / ``pgqueue.enqueue_many`` — the same
path SQL callers use, so classification lives in one place.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, overload

import psycopg
from psycopg.types.json import Jsonb

from pgqueue.db import queries
from pgqueue.errors import InvalidArgument, UsageError, from_sqlstate
from pgqueue.models import DEFAULT_KIND, Origin
from pgqueue.settings import Settings
from pgqueue.validation import CheckedJob, check_job

try:  # SQLAlchemy is a dependency, but keep the import cost off the hot path of psycopg users
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session
except ImportError:  # pragma: no cover
    Session = AsyncSession = None  # type: ignore[assignment,misc]

SyncTarget = psycopg.Connection[Any] | Session
AsyncTarget = psycopg.AsyncConnection[Any] | AsyncSession

_DEFAULT_SETTINGS: Settings | None = None


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job for :func:`enqueue_many`; the fields mean what :func:`enqueue`'s arguments do."""

    tenant_id: str
    origin: Origin | str
    payload: Mapping[str, Any]
    sla_seconds: float | None = None
    kind: str = DEFAULT_KIND


def _settings() -> Settings:
    global _DEFAULT_SETTINGS
    if _DEFAULT_SETTINGS is None:
        _DEFAULT_SETTINGS = Settings()
    return _DEFAULT_SETTINGS


def _params(job: CheckedJob) -> dict[str, Any]:
    text = job.payload_json
    return {
        "tenant_id": job.tenant_id,
        "origin": job.origin.value,
        "payload": Jsonb(job.payload, dumps=lambda _obj: text),
        "sla_seconds": job.sla_seconds,
        "kind": job.kind,
        "max_attempts": job.max_attempts,
        "run_at": job.run_at,
    }


def _many_params(jobs: Sequence[CheckedJob]) -> dict[str, Any]:
    return {
        "tenant_ids": [j.tenant_id for j in jobs],
        "origins": [j.origin.value for j in jobs],
        "payloads": [j.payload_json for j in jobs],
        "sla_seconds": [j.sla_seconds for j in jobs],
        "kinds": [j.kind for j in jobs],
    }


def _translate(exc: psycopg.Error) -> Exception:
    mapped = from_sqlstate(exc.sqlstate, exc.diag.message_primary or str(exc))
    return mapped if mapped is not None else exc


def _sync_conn(target: SyncTarget) -> psycopg.Connection[Any]:
    if isinstance(target, psycopg.Connection):
        return target
    if Session is not None and isinstance(target, Session):
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
    settings: Settings | None = None,
) -> Awaitable[int]: ...
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
    settings: Settings | None = None,
) -> int: ...
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
    settings: Settings | None = None,
) -> int | Awaitable[int]:
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
            ``max_payload_bytes`` (default 1 MiB) as JSON text.
        sla_seconds: seconds the caller can wait, ``None`` for no SLA; finite and ≥ 0.
        kind: the handler name (default ``anthropic.messages``).
        max_attempts: failure attempts before the job fails (default 5; 1–1000).
        run_at: earliest start (timezone-aware), default now (database clock).

    Returns:
        The job id, or an awaitable of it when ``conn`` is async.

    Raises:
        InvalidTenant, UnknownOrigin, InvalidSla, InvalidPayload, PayloadTooLarge,
        NulCharacter, InvalidKind, InvalidArgument: before any statement is sent, so the
            caller's transaction stays usable and nothing is written.
        UnknownTenant: raised by the database when it requires known tenants; the caller's
            transaction is then aborted (use a savepoint to keep it).
    """
    cfg = settings or _settings()
    job = check_job(
        tenant_id=tenant_id,
        origin=origin,
        payload=payload,
        sla_seconds=sla_seconds,
        kind=kind,
        max_attempts=max_attempts,
        run_at=run_at,
        max_payload_bytes=cfg.max_payload_bytes,
    )
    params = _params(job)
    if _is_async(conn):
        return _enqueue_async(conn, params)  # type: ignore[arg-type]
    try:
        row = queries.run(_sync_conn(conn), "job_enqueue", params)  # type: ignore[arg-type]
    except psycopg.Error as exc:
        raise _translate(exc) from exc
    return int(row["id"])


async def _enqueue_async(conn: AsyncTarget, params: dict[str, Any]) -> int:
    try:
        row = await queries.arun(await _async_conn(conn), "job_enqueue", params)
    except psycopg.Error as exc:
        raise _translate(exc) from exc
    return int(row["id"])


def _check_many(jobs: Sequence[JobSpec | Mapping[str, Any]], cfg: Settings) -> list[CheckedJob]:
    if isinstance(jobs, str | bytes) or not isinstance(jobs, Sequence):
        raise InvalidArgument("enqueue_many takes a sequence of JobSpec or mappings")
    checked: list[CheckedJob] = []
    for index, spec in enumerate(jobs):
        fields: Mapping[str, Any]
        if isinstance(spec, JobSpec):
            fields = {
                "tenant_id": spec.tenant_id,
                "origin": spec.origin,
                "payload": spec.payload,
                "sla_seconds": spec.sla_seconds,
                "kind": spec.kind,
            }
        elif isinstance(spec, Mapping):
            unknown = set(spec) - {"tenant_id", "origin", "payload", "sla_seconds", "kind"}
            if unknown:
                raise InvalidArgument(f"job {index}: unknown fields {sorted(unknown)}")
            fields = spec
        else:
            raise InvalidArgument(f"job {index}: expected a JobSpec or a mapping")
        try:
            checked.append(
                check_job(
                    tenant_id=fields.get("tenant_id"),
                    origin=fields.get("origin"),
                    payload=fields.get("payload"),
                    sla_seconds=fields.get("sla_seconds"),
                    kind=fields.get("kind", DEFAULT_KIND),
                    max_payload_bytes=cfg.max_payload_bytes,
                )
            )
        except UsageError as exc:
            raise type(exc)(f"job {index}: {exc}") from None
    return checked


@overload
def enqueue_many(
    conn: AsyncTarget,
    jobs: Sequence[JobSpec | Mapping[str, Any]],
    *,
    settings: Settings | None = None,
) -> Awaitable[list[int]]: ...
@overload
def enqueue_many(
    conn: SyncTarget,
    jobs: Sequence[JobSpec | Mapping[str, Any]],
    *,
    settings: Settings | None = None,
) -> list[int]: ...
def enqueue_many(
    conn: SyncTarget | AsyncTarget,
    jobs: Sequence[JobSpec | Mapping[str, Any]],
    *,
    settings: Settings | None = None,
) -> list[int] | Awaitable[list[int]]:
    """Enqueue many jobs in one statement inside the caller's transaction; ids in input order.

    ``jobs`` holds :class:`JobSpec` values or mappings with the same keys. Every job is
    validated first; one bad job raises its typed error (prefixed ``job <index>:``) and
    nothing is written. Raises as :func:`enqueue` does.
    """
    cfg = settings or _settings()
    checked = _check_many(jobs, cfg)
    if not checked:
        return _empty_async() if _is_async(conn) else []
    params = _many_params(checked)
    if _is_async(conn):
        return _enqueue_many_async(conn, params)  # type: ignore[arg-type]
    try:
        rows = queries.run(_sync_conn(conn), "job_enqueue_many", params)  # type: ignore[arg-type]
    except psycopg.Error as exc:
        raise _translate(exc) from exc
    return [int(r["id"]) for r in rows]


async def _empty_async() -> list[int]:
    return []


async def _enqueue_many_async(conn: AsyncTarget, params: dict[str, Any]) -> list[int]:
    try:
        rows = await queries.arun(await _async_conn(conn), "job_enqueue_many", params)
    except psycopg.Error as exc:
        raise _translate(exc) from exc
    return [int(r["id"]) for r in rows]
