"""The exception hierarchy: one root, three branches (usage, infrastructure, handler control).

Every error pgqueue raises on purpose derives from :class:`PgqueueError`, so callers can catch
the whole family in one clause. Usage errors (bad input at the boundary) also derive from
``ValueError``; infrastructure errors describe the database or the provider; handler-control
exceptions are raised *by handlers* to tell the executor what outcome they want.

The SQL function ``pgqueue.enqueue`` raises the same usage errors with dedicated SQLSTATEs
(class ``PQ``); :func:`from_sqlstate` maps them back, so both entry points give one family.
"""

from __future__ import annotations


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


# --------------------------------------------------------------------- infrastructure errors
class InfrastructureError(PgqueueError):
    """The database or the environment is not in the state pgqueue needs."""


class SchemaOutOfDate(InfrastructureError):
    """The database schema is behind this version of pgqueue; run ``pgqueue migrate``."""


class EmbeddedPostgresError(InfrastructureError):
    """The embedded Postgres server could not be initialised or started."""


# ---------------------------------------------------------------- handler-control exceptions
class HandlerControl(PgqueueError):
    """Raised by a handler to choose the job's outcome explicitly."""


class RetryLater(HandlerControl):
    """Retry the job after ``delay_seconds`` (counts as a failed attempt)."""

    def __init__(self, reason: str, delay_seconds: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay_seconds = delay_seconds


class RateLimited(HandlerControl):
    """The provider throttled the request (429/529); reschedule after ``retry_after_seconds``.

    Does not consume a failure attempt. ``retry_after_seconds`` is the provider's own hint
    (``retry-after`` header, RFC 9110 §10.2.3), before pgqueue's ×1.2 ± 20 % margin.
    """

    def __init__(
        self, reason: str, retry_after_seconds: float | None, status_code: int = 429
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_seconds = retry_after_seconds
        self.status_code = status_code


class Defer(HandlerControl):
    """This worker cannot run the job now (e.g. no API key): return it to the queue after
    ``delay_seconds`` without using an attempt."""

    def __init__(self, reason: str, delay_seconds: float = 60.0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay_seconds = delay_seconds


class Discard(HandlerControl):
    """Fail the job now, without further retries (a permanent error such as a 400)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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
)

_BY_SQLSTATE: dict[str, type[UsageError]] = {cls.sqlstate: cls for cls in USAGE_ERRORS}


def from_sqlstate(sqlstate: str | None, message: str) -> UsageError | None:
    """Map a ``PQxxx`` SQLSTATE raised by ``pgqueue.enqueue`` to its Python error, else None."""
    if sqlstate is None:
        return None
    if sqlstate == "22P05":  # untranslatable_character: \u0000 in jsonb or text
        return NulCharacter(message)
    cls = _BY_SQLSTATE.get(sqlstate)
    return cls(message) if cls is not None else None
