"""Finding jobs and looking at one: what ``pgqueue jobs list|show`` and the dashboard's jobs
pages show. Read-only; each function runs named statements (``sql/queries/dashboard.sql``)
on the caller's connection and returns plain dicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from pgqueue.db import queries
from pgqueue.errors import InvalidArgument
from pgqueue.models import JobState
from pgqueue.validation import _check_text, _shown, check_tenant_id, check_tier

#: ``limit`` of :func:`list_jobs` at most.
MAX_LIST_LIMIT = 1000
_BIGINT_MAX = 2**63 - 1
_MAX_KIND_CHARS = 200


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs to list; ``None`` matches any. Build it with :meth:`checked`."""

    state: str | None = None
    tenant_id: str | None = None
    tier: str | None = None
    kind: str | None = None

    @classmethod
    def checked(
        cls,
        *,
        state: str | None = None,
        tenant_id: str | None = None,
        tier: str | None = None,
        kind: str | None = None,
    ) -> JobFilter:
        """A filter from user input; empty or blank strings mean "any" (an empty form field,
        or one holding spaces: a tenant id is never blank). ``state`` and ``tier`` in any case.

        Raises:
            InvalidArgument: an unknown state or tier, a kind over 200 characters.
            InvalidTenant, NulCharacter: a tenant id that no tenant can have.
        """
        state = state.strip().lower() if state and state.strip() else None
        if state is not None and state not in {s.value for s in JobState}:
            raise InvalidArgument(
                f"unknown state {_shown(state)}; expected one of "
                + ", ".join(s.value for s in JobState)
            )
        return cls(
            state=state,
            tenant_id=check_tenant_id(tenant_id) if tenant_id and not tenant_id.isspace() else None,
            tier=check_tier(tier) if tier and tier.strip() else None,
            kind=_check_text(kind, "kind", _MAX_KIND_CHARS, InvalidArgument) if kind else None,
        )


def list_jobs(
    conn: psycopg.Connection[Any],
    where: JobFilter,
    *,
    limit: int = 50,
    before_id: int | None = None,
) -> list[dict[str, Any]]:
    """Jobs matching ``where``, newest (highest id) first: at most ``limit`` (1 to 1,000),
    with ids below ``before_id`` when given (the next page: the last id shown).

    Each row: id, tenant_id, kind, lane, tier, state, attempts, max_attempts, cost,
    enqueued_at, run_at, started_at, finished_at (datetimes or None), last_error (its first
    200 characters).

    Raises:
        InvalidArgument: ``limit`` or ``before_id`` out of range.
    """
    if isinstance(limit, bool) or not 1 <= limit <= MAX_LIST_LIMIT:
        raise InvalidArgument(f"limit must be from 1 to {MAX_LIST_LIMIT}, got {limit!r}")
    if before_id is not None and not 1 <= before_id <= _BIGINT_MAX:
        raise InvalidArgument(f"before_id must be from 1 to 2^63-1, got {before_id!r}")
    params = {
        "state": where.state,
        "tenant_id": where.tenant_id,
        "tier": where.tier,
        "kind": where.kind,
        "before_id": before_id,
        "limit": limit,
    }
    rows: list[dict[str, Any]] = queries.run(conn, "job_list", params)
    return rows


def job_detail(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any] | None:
    """One job with its ``throttles`` (429/529 events, oldest first) and its ``timeline``: a
    list of ``{"at": datetime, "event": str, "detail": str}``, oldest first, from what the
    row keeps (enqueued; each throttle; the last start; the finish, or when it is due next).
    pgqueue keeps the last attempt's start and error, not every attempt's: ``attempts``
    counts them. None when there is no such job.

    Raises:
        InvalidArgument: ``job_id`` out of 1 to 2^63-1.
    """
    if isinstance(job_id, bool) or not 1 <= job_id <= _BIGINT_MAX:
        raise InvalidArgument(f"job id must be from 1 to 2^63-1, got {job_id!r}")
    job: dict[str, Any] | None = queries.run(conn, "job_get", {"job_id": job_id})
    if job is None:
        return None
    throttles: list[dict[str, Any]] = queries.run(
        conn,
        "job_throttles",
        {"tenant_id": job["tenant_id"], "since": job["enqueued_at"], "job_id": job_id},
    )
    job["throttles"] = throttles
    job["timeline"] = _timeline(job, throttles)
    return job


def _timeline(job: dict[str, Any], throttles: list[dict[str, Any]]) -> list[dict[str, Any]]:
    events: list[tuple[datetime, str, str]] = [
        (job["enqueued_at"], "enqueued", f"tier {job['tier']}, origin {job['origin']}")
    ]
    for t in throttles:
        after = t["retry_after_seconds"]
        events.append(
            (
                t["occurred_at"],
                f"throttled ({t['status_code']})",
                "" if after is None else f"retry-after {after:g} s",
            )
        )
    if job["started_at"] is not None:
        events.append(
            (job["started_at"], "started", f"attempt {job['attempts']} of {job['max_attempts']}")
        )
    if job["finished_at"] is not None:
        events.append((job["finished_at"], job["state"], job["last_error"] or ""))
    elif job["state"] == JobState.QUEUED and job["run_at"] > job["enqueued_at"]:
        events.append((job["run_at"], "due", "queued until then"))
    events.sort(key=lambda e: e[0])
    return [{"at": at, "event": event, "detail": detail} for at, event, detail in events]
