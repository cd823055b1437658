"""The exception hierarchy: one root, four branches (usage, admission, infrastructure, handler
control).

Every error pgqueue raises on purpose derives from :class:`PgqueueError`, so callers can catch
the whole family in one clause. Usage errors (bad input at the boundary) also derive from
``ValueError``; admission errors say the queue refused a well-formed job *for now* (a full tier,
or a live job holding the dedupe key of a job to retry: retry later, nothing was written);
infrastructure errors describe the database or the provider; handler-control exceptions are
raised *by handlers* to tell the executor what outcome they want.

The SQL function ``pgqueue.enqueue`` raises the same usage errors with dedicated SQLSTATEs
(class ``PQ``); :func:`from_sqlstate` maps them back, so both entry points give one family.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any


class PgqueueError(Exception):
    """Root of every error pgqueue raises on purpose."""


# --------------------------------------------------------------------------- usage errors
class UsageError(PgqueueError, ValueError):
    """Bad input at a public boundary; nothing was written."""

    sqlstate: str = "PQ000"


class InvalidPayload(UsageError):
    """The payload is not valid Messages API parameters (model, max_tokens > 0, messages)."""

    sqlstate = "PQ001"


class PayloadTooLarge(UsageError):
    """The JSON-encoded payload exceeds ``max_payload_bytes`` (default 1 MiB)."""

    sqlstate = "PQ002"


class NulCharacter(UsageError):
    """A string in the payload, tenant id or kind holds U+0000, which Postgres cannot store."""

    sqlstate = "PQ003"


class UnknownOrigin(UsageError):
    """``origin`` is not one of ``user_action``, ``scheduled``, ``batch_job``."""

    sqlstate = "PQ004"


class InvalidSla(UsageError):
    """``sla_seconds`` is negative, NaN or infinite."""

    sqlstate = "PQ005"


class InvalidTenant(UsageError):
    """The tenant id is empty, longer than 128 characters, or not a string."""

    sqlstate = "PQ006"


class UnknownTenant(UsageError):
    """The tenant is not registered and the database requires known tenants."""

    sqlstate = "PQ007"


class InvalidKind(UsageError):
    """The job kind is empty or too long, or no handler is registered for it."""

    sqlstate = "PQ008"


class InvalidArgument(UsageError):
    """Another argument (max_attempts, run_at, batch shape) is out of range."""

    sqlstate = "PQ009"


class UnknownJob(UsageError):
    """No such job, or not one of the given tenant (or of the session's tenant scope)."""

    sqlstate = "PQ011"


# ------------------------------------------------------------------------- admission errors
class AdmissionError(PgqueueError):
    """Admission control refused a valid job for now; nothing was written, and the caller's
    transaction is still usable. Retrying later can succeed."""


class QueueFull(AdmissionError):
    """The job's tier, or its tenant within the tier, holds its cap of queued jobs.

    Raised for tiers whose policy is ``reject``, and for ``block`` once the wait timed out.
    Attributes: ``tier``, ``tenant_id``, ``depth`` (queued jobs counted; None for a full tier
    when the session may not see every tenant's jobs, e.g. a tenant's producer role), ``cap``,
    ``scope`` (``"tier"`` or ``"tenant"``: which cap is reached) and ``policy``. The SQL function
    ``pgqueue.enqueue`` raises SQLSTATE ``PQ010`` for the same verdict.
    """

    sqlstate = "PQ010"

    def __init__(
        self,
        message: str,
        *,
        tier: str | None = None,
        tenant_id: str | None = None,
        depth: int | None = None,
        cap: int | None = None,
        scope: str | None = None,
        policy: str | None = None,
    ) -> None:
        super().__init__(message)
        self.tier = tier
        self.tenant_id = tenant_id
        self.depth = depth
        self.cap = cap
        self.scope = scope
        self.policy = policy


class DedupeKeyHeld(AdmissionError):
    """A failed or cancelled job was not retried: a live (queued or running) job of its tenant
    holds its dedupe key, and only one live job may hold a key. Retry it once that job has
    finished (or cancel that job first). The SQL function ``pgqueue.retry`` raises SQLSTATE
    ``PQ013`` (revision 0070; before, a raw unique violation of ``jobs_dedupe_live_idx``), the
    fields as JSON in DETAIL. Attributes: ``job_id``, ``tenant_id``, ``dedupe_key``,
    ``held_by`` (the live job's id; None when it committed after the snapshot of a
    ``REPEATABLE READ`` transaction). Raised from SQL, it aborts the caller's transaction. A
    bulk retry (``pgqueue.retry_failed``, ``pgqueue.retry_failed_outcomes``) never raises it:
    it skips such jobs, and ``retry_failed_outcomes`` reports them."""

    sqlstate = "PQ013"

    def __init__(
        self,
        message: str,
        *,
        job_id: int | None = None,
        tenant_id: str | None = None,
        dedupe_key: str | None = None,
        held_by: int | None = None,
    ) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.tenant_id = tenant_id
        self.dedupe_key = dedupe_key
        self.held_by = held_by


class CannotBlockInTransaction(QueueFull):
    """The tier is full and its policy is ``block``, but the caller has a transaction open:
    waiting would hold the caller's locks (and its snapshot) for the whole wait, so pgqueue
    refuses to wait. Enqueue outside a transaction (autocommit, or before ``BEGIN``) to wait
    for room, or treat this like ``reject``."""


# --------------------------------------------------------------------- infrastructure errors
class InfrastructureError(PgqueueError):
    """The database or the environment is not in the state pgqueue needs."""


class SchemaOutOfDate(InfrastructureError):
    """The database schema is behind this version of pgqueue; run ``pgqueue migrate``."""


class NotUtf8Database(InfrastructureError):
    """The database's encoding is not UTF8: pgqueue stores JSON and tenant names as text, which
    needs it (``pgqueue migrate`` refuses such a database before it changes anything)."""


class InvalidSetting(InfrastructureError):
    """A ``pgqueue.*`` setting (GUC) of the database, role or session holds a value out of its
    range, or not a number (``pgqueue.setting_value``); the message names the setting, its
    range and the value. The SQL raises SQLSTATE ``PQ012``. Fix it, or ``RESET`` it for the
    default: connections read ``ALTER DATABASE`` / ``ALTER ROLE`` settings when they open."""

    sqlstate = "PQ012"


class EmbeddedPostgresError(InfrastructureError):
    """The embedded Postgres server could not be initialised or started."""


# ---------------------------------------------------------------- handler-control exceptions
class HandlerControl(PgqueueError):
    """Raised by a handler to choose the job's outcome explicitly.

    Their arguments are checked when they are made: the reason becomes text (``str()`` of
    anything), and a delay that is not a number of seconds, is negative or NaN raises
    :class:`InvalidArgument` there, in the handler (which then fails the job, naming it).
    Found by a tester: ``RetryLater(123)`` crashed the executor, and the job stayed ``running``
    until its lease expired.
    """


def _reason_text(reason: object) -> str:
    """``reason`` as text: itself if a string, else its ``str()``, else its type's name."""
    if isinstance(reason, str):
        return reason
    try:
        return str(reason)
    except Exception:
        return f"<{type(reason).__name__} whose str() failed>"


def _seconds(name: str, value: object, *, optional: bool) -> float | None:
    """``value`` as seconds (a float >= 0; +infinity is kept, the executor bounds it), None
    when ``optional`` and not given; else :class:`InvalidArgument`."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        expected = "a number of seconds" + (" or None" if optional else "")
        raise InvalidArgument(f"{name} must be {expected}, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond float's range
        seconds = math.inf
    if math.isnan(seconds) or seconds < 0:
        raise InvalidArgument(f"{name} must be >= 0 seconds, got {value!r}")
    return seconds


class RetryLater(HandlerControl):
    """Retry the job after ``delay_seconds`` (counts as a failed attempt); without a delay,
    after the usual backoff."""

    def __init__(self, reason: object, delay_seconds: float | None = None) -> None:
        self.reason = _reason_text(reason)
        self.delay_seconds = _seconds("delay_seconds", delay_seconds, optional=True)
        super().__init__(self.reason)


class RateLimited(HandlerControl):
    """The provider throttled the request (429/529); reschedule after ``retry_after_seconds``.

    Does not consume a failure attempt. ``retry_after_seconds`` is the provider's own hint
    (``retry-after`` header, RFC 9110 §10.2.3), before pgqueue's margin (×1.2 ± 20 %, never
    below the hint).
    """

    def __init__(
        self, reason: object, retry_after_seconds: float | None, status_code: int = 429
    ) -> None:
        if isinstance(status_code, bool) or not isinstance(status_code, int):
            raise InvalidArgument(f"status_code must be an int, got {status_code!r}")
        self.reason = _reason_text(reason)
        self.retry_after_seconds = _seconds(
            "retry_after_seconds", retry_after_seconds, optional=True
        )
        self.status_code = status_code
        super().__init__(self.reason)


class Defer(HandlerControl):
    """This worker cannot run the job now (e.g. no API key): return it to the queue after
    ``delay_seconds`` without using an attempt."""

    def __init__(self, reason: object, delay_seconds: float = 60.0) -> None:
        self.reason = _reason_text(reason)
        delay = _seconds("delay_seconds", delay_seconds, optional=False)
        assert delay is not None  # not optional
        self.delay_seconds = delay
        super().__init__(self.reason)


class Discard(HandlerControl):
    """Fail the job now, without further retries (a permanent error such as a 400)."""

    def __init__(self, reason: object) -> None:
        self.reason = _reason_text(reason)
        super().__init__(self.reason)


USAGE_ERRORS: tuple[type[UsageError], ...] = (
    InvalidPayload,
    PayloadTooLarge,
    NulCharacter,
    UnknownOrigin,
    InvalidSla,
    InvalidTenant,
    UnknownTenant,
    InvalidKind,
    InvalidArgument,
    UnknownJob,
)

_BY_SQLSTATE: dict[str, type[UsageError]] = {cls.sqlstate: cls for cls in USAGE_ERRORS}


#: The server's words for a call that matches no function: "function pgqueue.f(unknown,
#: numeric) does not exist", with the types of the arguments as sent.
_NO_SUCH_FUNCTION = re.compile(r"function (?P<name>[\w.]+)\((?P<args>[^()]*)\) does not exist")


def numeric_argument(message: str) -> bool:
    """Whether a 42883 (undefined_function) ``message`` names a call with a ``numeric``
    argument: psycopg sends a Python int beyond 64 bits as numeric, which no pgqueue function
    takes, so the call matched none. That is a number out of range, not a missing schema
    (found by a tester: `admission set --max-queued 99999999999999999999` said
    "SchemaOutOfDate ... run `pgqueue migrate`"); pgqueue itself never sends numeric."""
    match = _NO_SUCH_FUNCTION.search(message)
    return match is not None and "numeric" in (t.strip() for t in match["args"].split(","))


def _detail_fields(detail: str | None, known: tuple[str, ...]) -> dict[str, Any]:
    """The ``known`` fields of the JSON object in an error's DETAIL (None for those missing,
    all None when it is not a JSON object)."""
    try:
        fields = json.loads(detail) if detail else {}
    except ValueError:
        fields = {}
    if not isinstance(fields, dict):
        fields = {}
    return {k: fields.get(k) for k in known}


def from_sqlstate(
    sqlstate: str | None, message: str, detail: str | None = None
) -> UsageError | AdmissionError | SchemaOutOfDate | InvalidSetting | None:
    """Map a ``PQxxx`` SQLSTATE raised by pgqueue's SQL functions to its Python error, else
    None.

    For ``PQ010`` (:class:`QueueFull`) ``detail`` is the JSON verdict the database sends in
    the error's DETAIL field; for ``PQ013`` (:class:`DedupeKeyHeld`) the job, the key and the
    live job holding it. ``42883`` (undefined_function) naming a ``pgqueue.`` function
    means the schema is older than this pgqueue: :class:`SchemaOutOfDate`; unless an argument
    was sent as ``numeric`` (:func:`numeric_argument`): :class:`InvalidArgument`. ``PQ012``
    (a malformed ``pgqueue.*`` setting) is :class:`InvalidSetting`.
    """
    if sqlstate is None:
        return None
    if sqlstate == "42883" and numeric_argument(message):
        return InvalidArgument(f"a number is out of range (beyond 64-bit integers): {message}")
    if sqlstate == "42883" and "pgqueue." in message:
        return SchemaOutOfDate(
            f"the pgqueue schema in this database is older than this pgqueue ({message}); "
            "run `pgqueue migrate`"
        )
    if sqlstate == InvalidSetting.sqlstate:
        return InvalidSetting(message)
    if sqlstate == "22P05":  # untranslatable_character: \u0000 in jsonb or text
        return NulCharacter(message)
    if sqlstate == QueueFull.sqlstate:
        verdict = ("tier", "tenant_id", "depth", "cap", "scope", "policy")
        return QueueFull(message, **_detail_fields(detail, verdict))
    if sqlstate == DedupeKeyHeld.sqlstate:
        held = ("job_id", "tenant_id", "dedupe_key", "held_by")
        return DedupeKeyHeld(message, **_detail_fields(detail, held))
    cls = _BY_SQLSTATE.get(sqlstate)
    return cls(message) if cls is not None else None
