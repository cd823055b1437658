"""pgqueue: a Postgres-native job queue for rate-limited LLM APIs.

Priority tiers (critical / standard / batch), per-tenant Deficit Round Robin, Retry-After
backpressure, all in Postgres. Enqueue joins the caller's transaction::

    import pgqueue
    job_id = pgqueue.enqueue(conn, tenant_id="acme", origin="user_action",
                             payload={"model": "...", "max_tokens": 256, "messages": [...]})
"""

from pgqueue.admission import admission_status, set_admission, set_tenant_max_queued
from pgqueue.batch import JobSpec
from pgqueue.cancel import cancel, cancel_queued
from pgqueue.enqueue import enqueue, enqueue_many
from pgqueue.errors import (
    AdmissionError,
    CannotBlockInTransaction,
    DedupeKeyHeld,
    InvalidArgument,
    InvalidKind,
    InvalidPayload,
    InvalidSetting,
    InvalidSla,
    InvalidTenant,
    NulCharacter,
    PayloadTooLarge,
    PgqueueError,
    QueueFull,
    SchemaOutOfDate,
    UnknownJob,
    UnknownOrigin,
    UnknownTenant,
    UsageError,
)
from pgqueue.handlers.registry import Registry
from pgqueue.models import AdmissionPolicy, JobState, Origin, Tier

__all__ = [
    "AdmissionError",
    "AdmissionPolicy",
    "CannotBlockInTransaction",
    "DedupeKeyHeld",
    "InvalidArgument",
    "InvalidKind",
    "InvalidPayload",
    "InvalidSetting",
    "InvalidSla",
    "InvalidTenant",
    "JobSpec",
    "JobState",
    "NulCharacter",
    "Origin",
    "PayloadTooLarge",
    "PgqueueError",
    "QueueFull",
    "Registry",
    "SchemaOutOfDate",
    "Tier",
    "UnknownJob",
    "UnknownOrigin",
    "UnknownTenant",
    "UsageError",
    "admission_status",
    "cancel",
    "cancel_queued",
    "enqueue",
    "enqueue_many",
    "set_admission",
    "set_tenant_max_queued",
]
__version__ = "0.1.0"
