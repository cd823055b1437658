"""The closed sets (tiers, origins, job states, outcomes) and the Job record.

Every branch over these enums ends in ``assert_never`` so that adding a member is a type error
wherever it is not handled.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


class Tier(enum.StrEnum):
    """Scheduling tier, stored in ``pgqueue.jobs.priority`` (read it as ``pgqueue.jobs.tier``).
    Declaration order is priority."""

    CRITICAL = "critical"
    STANDARD = "standard"
    BATCH = "batch"


class AdmissionPolicy(enum.StrEnum):
    """What a full tier does with a new job (``pgqueue.admission.policy``)."""

    REJECT = "reject"  # raise QueueFull (SQLSTATE PQ010); nothing written
    BLOCK = "block"  # the Python producer waits for room up to a timeout, then QueueFull
    DROP = "drop"  # not stored; enqueue returns None; the drop is counted (never critical)


class Origin(enum.StrEnum):
    """Why a job exists; callers pass this, never a tier."""

    USER_ACTION = "user_action"
    SCHEDULED = "scheduled"
    BATCH_JOB = "batch_job"


class JobState(enum.StrEnum):
    """Life cycle: queued → running → succeeded | failed | cancelled (or back to queued)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: The SLA at or above which a job is batch work (one day, in seconds), from the design brief.
BATCH_SLA_SECONDS = 86_400.0

#: Default job kind: the built-in Anthropic Messages API handler.
DEFAULT_KIND = "anthropic.messages"


#: One claim of a job: ``(id, lease_token)`` (:attr:`Job.lease`).
Lease = tuple[int, str]


@dataclass(frozen=True, slots=True)
class Job:
    """One claimed job, as the worker sees it.

    ``cost`` is in cost units (max(1, estimated input tokens / 1000)); ``lease_token`` fences
    every write the worker makes about this job.
    """

    id: int
    tenant_id: str
    kind: str
    priority: Tier
    payload: dict[str, Any]
    cost: float
    attempts: int
    max_attempts: int
    throttle_retries: int
    enqueued_at: datetime
    lease_token: str
    model: str | None = None
    est_input_tokens: int = 0

    @property
    def lease(self) -> Lease:
        """``(id, lease_token)``: this claim of the job. A worker keys its bookkeeping by it,
        not by the id: a job rescued while its handler still ran (its lease expired) can be
        claimed again by the same worker, and the two runs must stay apart."""
        return (self.id, self.lease_token)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Job:
        """The job of one row of the named query ``job_claim`` (a dict row)."""
        return cls(
            id=row["id"],
            tenant_id=row["tenant_id"],
            kind=row["kind"],
            priority=_TIERS[row["priority"]],  # a dict lookup; Tier(value) costs more
            payload=row["payload"],
            cost=float(row["cost"]),
            attempts=row["attempts"],
            max_attempts=row["max_attempts"],
            throttle_retries=row["throttle_retries"],
            enqueued_at=row["enqueued_at"],
            lease_token=row["lease_token"],
            model=row["model"],
            est_input_tokens=row["est_input_tokens"],
        )


#: Tier by its stored name.
_TIERS: dict[str, Tier] = {tier.value: tier for tier in Tier}


@dataclass(frozen=True, slots=True)
class Succeeded:
    """The handler returned ``result``; token usage is charged to the tenant."""

    result: dict[str, Any] | None
    input_tokens: int | None = None
    output_tokens: int | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Failed:
    """The attempt failed; retried after ``retry_in_seconds`` unless attempts are exhausted or
    ``permanent`` is set."""

    error: str
    retry_in_seconds: float
    permanent: bool = False


@dataclass(frozen=True, slots=True)
class Throttled:
    """The provider answered 429/529: reschedule after ``wait_seconds`` (already jittered),
    without consuming a failure attempt."""

    error: str
    wait_seconds: float
    status_code: int = 429
    retry_after_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class Interrupted:
    """The worker stopped before the job finished: back to the queue, attempt not counted."""

    reason: str = "worker shutdown"


@dataclass(frozen=True, slots=True)
class Deferred:
    """This worker cannot run the job now (no API key, no handler for its kind): back to the
    queue after ``delay_seconds``, attempt not counted, so a misconfigured worker loses nothing."""

    reason: str
    delay_seconds: float = 60.0


Outcome = Succeeded | Failed | Throttled | Interrupted | Deferred


@dataclass(slots=True)
class HandlerResult:
    """What a handler may return instead of a plain dict: a result plus token usage."""

    result: dict[str, Any] | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
