"""Per-minute rate-limit accounting for the sandbox server (pure; the clock is injected).

One job: decide whether a Messages request may be admitted now, charge it, and report how
long until it could be. There is no I/O, no sleeping and no wall time in here; the caller
passes a monotonic ``Callable[[], float]`` (seconds) and gets plain numbers back.

The model follows Anthropic's rate-limit documentation: each limit (requests per minute,
input tokens per minute, output tokens per minute) is a token bucket whose capacity is the
per-minute limit and which refills continuously at ``limit / 60`` units per second, rather
than resetting at fixed minute boundaries. Output tokens are charged up front at
``max_tokens`` and the unused part is given back once the real output size is known.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "Admission",
    "BucketSnapshot",
    "LimitsSnapshot",
    "RateLimiter",
    "RateLimits",
    "TokenBucket",
]

#: Seconds in one rate-limit period; every limit here is "per minute".
PERIOD_SECONDS = 60.0

# Float slack so that, e.g., 50/60 units/s * 1.2 s counts as one whole unit.
_EPSILON = 1e-9


@dataclass(frozen=True)
class RateLimits:
    """Per-minute limits of one organisation, as on Anthropic's rate-limit page.

    Attributes:
        requests_per_minute: requests per minute (RPM); also the burst capacity.
        input_tokens_per_minute: input tokens per minute (ITPM); also the burst capacity.
        output_tokens_per_minute: output tokens per minute (OTPM); also the burst capacity.

    Raises:
        ValueError: if any limit is not a positive integer.
    """

    requests_per_minute: int = 50
    input_tokens_per_minute: int = 40_000
    output_tokens_per_minute: int = 8_000

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "input_tokens_per_minute", "output_tokens_per_minute"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")


class TokenBucket:
    """A continuously refilling token bucket (units are whatever the caller counts).

    The level starts full at ``capacity`` and grows by ``refill_per_second`` per second of
    the injected clock, never above ``capacity``. Not thread-safe; callers serialise access.
    """

    def __init__(
        self, capacity: float, refill_per_second: float, now: float, fill: float = 1.0
    ) -> None:
        """Create a bucket at ``fill`` × ``capacity`` (full by default).

        Args:
            capacity: maximum level, in units.
            refill_per_second: refill rate, in units per second.
            now: current clock reading, in seconds.
            fill: the starting level as a fraction of ``capacity``, 0 to 1.

        Raises:
            ValueError: if ``capacity`` or ``refill_per_second`` is not positive, or ``fill``
                is outside 0 to 1.
        """
        if capacity <= 0 or refill_per_second <= 0:
            raise ValueError("capacity and refill_per_second must be positive")
        if not 0.0 <= fill <= 1.0:
            raise ValueError(f"fill must be in [0, 1], got {fill!r}")
        self.capacity = float(capacity)
        self.refill_per_second = float(refill_per_second)
        self._level = float(capacity) * fill
        self._updated = now

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self._updated)  # a clock that steps back refills nothing
        self._level = min(self.capacity, self._level + elapsed * self.refill_per_second)
        self._updated = max(self._updated, now)

    def level(self, now: float) -> float:
        """Units available at ``now`` (seconds), after refill; may be fractional."""
        self._refill(now)
        return self._level

    def has(self, amount: float, now: float) -> bool:
        """Whether ``amount`` units are available at ``now`` (seconds)."""
        return self.level(now) + _EPSILON >= amount

    def seconds_until(self, amount: float, now: float) -> float:
        """Seconds from ``now`` until ``amount`` units are available (0.0 if they are now).

        If ``amount`` exceeds ``capacity`` it can never be available; the time until the
        bucket is full is returned instead, as the soonest moment anything changes.
        """
        level = self.level(now)
        target = min(amount, self.capacity)
        if level + _EPSILON >= target:
            return 0.0 if amount <= self.capacity else self.seconds_until_full(now)
        return (target - level) / self.refill_per_second

    def seconds_until_full(self, now: float) -> float:
        """Seconds from ``now`` until the level is back at ``capacity``."""
        return (self.capacity - self.level(now)) / self.refill_per_second

    def take(self, amount: float, now: float) -> None:
        """Remove ``amount`` units at ``now``; the level may not go below zero.

        Raises:
            ValueError: if fewer than ``amount`` units are available.
        """
        if not self.has(amount, now):
            raise ValueError(f"bucket holds {self._level:.3f}, cannot take {amount}")
        self._level = max(0.0, self._level - amount)

    def give(self, amount: float, now: float) -> None:
        """Return ``amount`` units at ``now`` (a refund), capped at ``capacity``."""
        self._refill(now)
        self._level = min(self.capacity, self._level + max(0.0, amount))


@dataclass(frozen=True)
class BucketSnapshot:
    """State of one bucket, as reported in ``anthropic-ratelimit-*`` headers.

    Attributes:
        limit: the per-minute limit (bucket capacity), in units.
        remaining: whole units available now (floored).
        seconds_to_full: seconds until the bucket is completely refilled.
    """

    limit: int
    remaining: int
    seconds_to_full: float


@dataclass(frozen=True)
class LimitsSnapshot:
    """State of the three buckets at one instant."""

    requests: BucketSnapshot
    input_tokens: BucketSnapshot
    output_tokens: BucketSnapshot


@dataclass(frozen=True)
class Admission:
    """Outcome of :meth:`RateLimiter.try_admit`.

    Attributes:
        admitted: True if the request was charged and may proceed.
        retry_after_seconds: 0.0 when admitted; otherwise seconds until every bucket the
            request was short on holds enough (the largest such wait).
        limiting: names of the buckets that were short (``"requests"``, ``"input_tokens"``,
            ``"output_tokens"``), empty when admitted.
        exceeds_capacity: True if the request needs more than a bucket's capacity, so it
            can never be admitted under these limits.
        snapshot: bucket state after the decision (after charging, if admitted).
    """

    admitted: bool
    retry_after_seconds: float
    limiting: tuple[str, ...]
    exceeds_capacity: bool
    snapshot: LimitsSnapshot


class RateLimiter:
    """Admission control over requests, input tokens and output tokens per minute.

    Token buckets per Anthropic's rate-limit docs: capacity = per-minute limit, continuous
    refill at limit/60 per second. A request is admitted only if at least one request, its
    input tokens and its ``max_tokens`` output tokens are all available; then all three are
    deducted. Not thread-safe: the sandbox calls it from a single event loop.
    """

    def __init__(
        self,
        limits: RateLimits,
        clock: Callable[[], float] = time.monotonic,
        initial_fill: float = 1.0,
    ) -> None:
        """Create a limiter with every bucket at ``initial_fill`` × its capacity.

        Args:
            limits: the per-minute limits.
            clock: monotonic clock returning seconds (``time.monotonic`` by default).
            initial_fill: starting level of each bucket, 0 (spent, as mid-way through a busy
                hour) to 1 (full, as after an idle minute).
        """
        self.limits = limits
        self._clock = clock
        self.initial_fill = initial_fill
        self.reset()

    def reset(self) -> None:
        """Set every bucket back to its starting level, as at construction."""
        now = self._clock()

        def bucket(limit: int) -> TokenBucket:
            return TokenBucket(limit, limit / PERIOD_SECONDS, now, self.initial_fill)

        self._buckets: dict[str, TokenBucket] = {
            "requests": bucket(self.limits.requests_per_minute),
            "input_tokens": bucket(self.limits.input_tokens_per_minute),
            "output_tokens": bucket(self.limits.output_tokens_per_minute),
        }

    def try_admit(self, input_tokens: int, max_output_tokens: int) -> Admission:
        """Admit and charge one request now, or report how long until it could be.

        Args:
            input_tokens: the request's input size, in tokens.
            max_output_tokens: the request's ``max_tokens``; charged in full up front.

        Returns:
            An :class:`Admission`. When not admitted nothing is deducted, and
            ``retry_after_seconds`` is the wait (seconds) until the slowest short bucket
            has room, or until it is full if the request exceeds its capacity.
        """
        now = self._clock()
        needs = {
            "requests": 1.0,
            "input_tokens": float(input_tokens),
            "output_tokens": float(max_output_tokens),
        }
        short = tuple(
            name for name, amount in needs.items() if not self._buckets[name].has(amount, now)
        )
        exceeds = any(amount > self._buckets[name].capacity for name, amount in needs.items())
        if short or exceeds:
            wait = max(
                (self._buckets[name].seconds_until(needs[name], now) for name in needs),
                default=0.0,
            )
            limiting = short or tuple(
                name for name, amount in needs.items() if amount > self._buckets[name].capacity
            )
            return Admission(False, wait, limiting, exceeds, self._snapshot(now))
        for name, amount in needs.items():
            self._buckets[name].take(amount, now)
        return Admission(True, 0.0, (), False, self._snapshot(now))

    def refund_output(self, unused_tokens: int) -> None:
        """Give back output tokens charged at admission but not produced (tokens, >= 0)."""
        self._buckets["output_tokens"].give(float(unused_tokens), self._clock())

    def snapshot(self) -> LimitsSnapshot:
        """The three buckets' state now, for response headers."""
        return self._snapshot(self._clock())

    def _snapshot(self, now: float) -> LimitsSnapshot:
        def one(name: str) -> BucketSnapshot:
            b = self._buckets[name]
            level = b.level(now)
            return BucketSnapshot(
                limit=int(b.capacity),
                remaining=max(0, math.floor(level + _EPSILON)),
                seconds_to_full=b.seconds_until_full(now),
            )

        return LimitsSnapshot(one("requests"), one("input_tokens"), one("output_tokens"))
