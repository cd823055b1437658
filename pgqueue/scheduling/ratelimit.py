"""Provider rate limits, pure: token buckets and the ``anthropic-ratelimit-*`` headers.

Anthropic meters requests, input tokens and output tokens per minute with token buckets whose
capacity is the per-minute limit and which refill continuously (Anthropic API docs, "Rate
limits"). The shared limiter in Postgres applies the same rule (SQL mirrors
:meth:`TokenBucket.refilled` and :meth:`TokenBucket.try_take`); this module is its reference.
Every time is a float of seconds on one clock, injected by the caller.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

#: The three metered quantities, in the order of the response headers.
KINDS = ("requests", "input-tokens", "output-tokens")

#: The share of the input-token bucket kept free for the error of the estimate (characters / 4)
#: the limiter takes input tokens by (GUC ``pgqueue.ratelimit_input_margin``): without it a
#: worker starting on a full 40k bucket admitted 40.3k tokens in its first second (a 429).
INPUT_MARGIN = 0.02


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """A bucket of ``capacity`` units refilled at ``capacity / 60`` units per second.

    ``available`` is the level at time ``at`` (seconds). Immutable: operations return a new
    bucket. Raises ``ValueError`` for a non-positive or non-finite capacity.
    """

    capacity: float
    available: float
    at: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.capacity) and self.capacity > 0):
            raise ValueError(f"capacity must be finite and > 0, got {self.capacity!r}")

    @classmethod
    def full(cls, per_minute: float, now: float) -> TokenBucket:
        """A full bucket for a limit of ``per_minute`` units."""
        return cls(per_minute, per_minute, now)

    @property
    def rate_per_second(self) -> float:
        """Refill rate in units per second (the per-minute limit / 60)."""
        return self.capacity / 60.0

    def refilled(self, now: float) -> TokenBucket:
        """The bucket at ``now``: ``min(capacity, available + rate × elapsed)``; a clock that
        went backwards adds nothing."""
        elapsed = max(0.0, now - self.at)
        level = min(self.capacity, self.available + elapsed * self.rate_per_second)
        return replace(self, available=level, at=max(now, self.at))

    def kept(self, amount: float, margin: float) -> float:
        """The part of ``margin`` units a take of ``amount`` must leave in the bucket: all of
        it, or what is left of the capacity above a large ``amount`` (so that it still fits a
        full bucket)."""
        return min(margin, max(0.0, self.capacity - amount))

    def try_take(
        self, amount: float, now: float, *, margin: float = 0.0
    ) -> tuple[bool, TokenBucket]:
        """Take ``amount`` units at ``now`` if they are there with ``margin`` units to spare
        (:meth:`kept`); returns (taken, new bucket). Only ``amount`` is taken.

        An amount above the capacity can never be taken; callers must not wait for it.
        """
        current = self.refilled(now)
        if amount + self.kept(amount, margin) <= current.available:
            return True, replace(current, available=current.available - amount)
        return False, current

    def seconds_until(self, amount: float, now: float, *, margin: float = 0.0) -> float | None:
        """Seconds until ``amount`` units (with ``margin`` to spare) are available, or None if
        it exceeds the capacity."""
        if amount > self.capacity:
            return None
        current = self.refilled(now)
        missing = amount + self.kept(amount, margin) - current.available
        return 0.0 if missing <= 0 else missing / self.rate_per_second

    def observed(self, remaining: float, now: float) -> TokenBucket:
        """Correct the level from a provider's ``remaining`` header: keep the lower of the
        two, since requests in flight are not yet counted by the provider."""
        current = self.refilled(now)
        return replace(current, available=max(0.0, min(current.available, remaining)))


@dataclass(frozen=True, slots=True)
class LimitHeader:
    """One metered quantity as a response reported it: limit and remaining (units per
    minute), and when the bucket is full again (``reset``, timezone-aware) if given."""

    limit: int | None
    remaining: int | None
    reset: datetime | None


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        return None
    return number if number >= 0 else None


def _rfc3339(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def parse_ratelimit_headers(headers: Mapping[str, str]) -> dict[str, LimitHeader]:
    """Read ``anthropic-ratelimit-{requests,input-tokens,output-tokens}-{limit,remaining,reset}``.

    Header names are case-insensitive; malformed values are ignored (None). Returns only the
    quantities for which at least one header was usable, keyed by ``requests``,
    ``input-tokens``, ``output-tokens``.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    found: dict[str, LimitHeader] = {}
    for kind in KINDS:
        prefix = f"anthropic-ratelimit-{kind}-"
        parsed = LimitHeader(
            _int(lowered.get(prefix + "limit")),
            _int(lowered.get(prefix + "remaining")),
            _rfc3339(lowered.get(prefix + "reset")),
        )
        if parsed != LimitHeader(None, None, None):
            found[kind] = parsed
    return found
