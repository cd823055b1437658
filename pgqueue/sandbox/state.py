"""The sandbox's configuration and its mutable state (limiter, fault script, statistics).

Split out of :mod:`pgqueue.sandbox.app`, which serves HTTP on top of them.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pgqueue.sandbox.limits import BucketSnapshot, LimitsSnapshot, RateLimiter, RateLimits

#: How far back ``GET /_sandbox/stats`` lists admission timestamps, in seconds.
STATS_WINDOW_SECONDS = 600.0


def _check_status(status: int, what: str) -> None:
    if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
        raise ValueError(f"{what} must be an HTTP error status in 400..599, got {status!r}")


@dataclass(frozen=True)
class SandboxConfig:
    """Everything that shapes the sandbox's behaviour. Defaults mimic Anthropic's tier 1.

    Attributes:
        requests_per_minute: request limit per minute (bucket capacity; refill limit/60 per s).
        input_tokens_per_minute: input-token limit per minute (same bucket model).
        output_tokens_per_minute: output-token limit per minute; charged ``max_tokens`` at
            admission, unused part refunded after the answer.
        output_ratio: fraction in (0, 1] of ``max_tokens`` each answer uses:
            ``output_tokens = max(1, ceil(max_tokens * output_ratio))``. 1.0 = always
            ``max_tokens`` (``stop_reason`` "max_tokens"), below that "end_turn".
        overload_rate: probability in [0, 1] that a request is answered 529 overloaded
            (drawn before rate limiting, so it costs no budget).
        seed: seed of the ``random.Random`` used for ``overload_rate`` draws.
        fail_first_n: the first N valid, authenticated requests get ``fail_status``.
        fail_status: HTTP status (400..599; usually 429, 529 or 500) for those N answers.
        fail_retry_after: raw ``retry-after`` header value for those N answers (e.g. "1",
            "0.5" or an HTTP date), or None for no header.
        seconds_per_output_token: latency per output token, in seconds (0.0 = instant).
        base_latency_seconds: fixed latency added to every successful answer, in seconds.
        initial_fill: the rate-limit buckets' starting level, 0 (spent) to 1 (full).
        batch_processing_seconds: how long a Message Batch stays ``in_progress`` after it
            is created, in seconds of the wall clock (0.0 = it has ended at the next look).

    Raises:
        ValueError: if a field is out of range.
    """

    requests_per_minute: int = 50
    input_tokens_per_minute: int = 40_000
    output_tokens_per_minute: int = 8_000
    output_ratio: float = 1.0
    overload_rate: float = 0.0
    seed: int = 0
    fail_first_n: int = 0
    fail_status: int = 429
    fail_retry_after: str | None = None
    seconds_per_output_token: float = 0.0
    base_latency_seconds: float = 0.0
    initial_fill: float = 1.0
    batch_processing_seconds: float = 0.0

    def __post_init__(self) -> None:
        self.rate_limits()  # validates the three limits
        if not 0.0 < self.output_ratio <= 1.0:
            raise ValueError(f"output_ratio must be in (0, 1], got {self.output_ratio!r}")
        if not 0.0 <= self.overload_rate <= 1.0:
            raise ValueError(f"overload_rate must be in [0, 1], got {self.overload_rate!r}")
        if self.fail_first_n < 0:
            raise ValueError(f"fail_first_n must be >= 0, got {self.fail_first_n!r}")
        _check_status(self.fail_status, "fail_status")
        if min(self.seconds_per_output_token, self.base_latency_seconds) < 0:
            raise ValueError("latencies must be >= 0 seconds")
        if self.batch_processing_seconds < 0:
            raise ValueError("batch_processing_seconds must be >= 0 seconds")
        if not 0.0 <= self.initial_fill <= 1.0:
            raise ValueError(f"initial_fill must be in [0, 1], got {self.initial_fill!r}")

    def rate_limits(self) -> RateLimits:
        """The per-minute limits as a :class:`~pgqueue.sandbox.limits.RateLimits`.

        Raises:
            ValueError: if a limit is not a positive int.
        """
        return RateLimits(
            requests_per_minute=self.requests_per_minute,
            input_tokens_per_minute=self.input_tokens_per_minute,
            output_tokens_per_minute=self.output_tokens_per_minute,
        )


@dataclass(frozen=True)
class ScriptedFault:
    """One scripted error answer.

    Attributes:
        status: HTTP status, 400..599.
        retry_after: raw ``retry-after`` header value, or None to omit it.
        retry_after_ms: raw ``retry-after-ms`` header value (milliseconds), or None.

    Raises:
        ValueError: if ``status`` is not in 400..599.
    """

    status: int
    retry_after: str | None = None
    retry_after_ms: str | None = None

    def __post_init__(self) -> None:
        _check_status(self.status, "status")


def rfc3339(epoch_seconds: float) -> str:
    """RFC 3339 UTC timestamp, rounded up to the whole second, e.g. ``2025-01-01T00:01:00Z``."""
    return datetime.fromtimestamp(math.ceil(epoch_seconds), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SandboxState:
    """Mutable server state: limiter, fault script, overload RNG and statistics.

    Lives on ``app.state.sandbox``. Used only from the server's event loop, so it needs
    no locks.
    """

    def __init__(
        self,
        config: SandboxConfig,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """Create fresh state.

        Args:
            config: the sandbox configuration.
            clock: monotonic clock in seconds, for rate limiting.
            wall_clock: epoch seconds, for ``*-reset`` headers and stats timestamps.
        """
        self.config = config
        self.wall_clock = wall_clock
        self.limiter = RateLimiter(config.rate_limits(), clock, config.initial_fill)
        self.reset()

    def reset(self) -> None:
        """Back to the start: full buckets, zero stats, re-seeded RNG, config faults re-armed."""
        cfg = self.config
        self.limiter.reset()
        self.rng = random.Random(cfg.seed)
        self.script: deque[ScriptedFault] = deque(
            ScriptedFault(cfg.fail_status, cfg.fail_retry_after) for _ in range(cfg.fail_first_n)
        )
        self.counts: dict[str, int] = dict.fromkeys(
            ("requests", "ok", "4xx", "429", "529", "5xx", "input_tokens", "output_tokens"), 0
        )
        self.admitted_at: deque[float] = deque()

    def queue_faults(self, fault: ScriptedFault, count: int) -> int:
        """Answer the next ``count`` requests with ``fault``; returns faults now pending."""
        self.script.extend([fault] * count)
        return len(self.script)

    def record_status(self, status: int) -> None:
        """Count one ``/v1/messages`` answer with ``status`` in the stats."""
        if status == 200:
            self.counts["ok"] += 1
        elif status in (429, 529):
            self.counts[str(status)] += 1
        elif status >= 500:
            self.counts["5xx"] += 1
        else:
            self.counts["4xx"] += 1

    def record_admission(self, input_tokens: int, output_tokens: int) -> None:
        """Count one admitted request's usage (tokens) and its wall-clock time."""
        self.counts["input_tokens"] += input_tokens
        self.counts["output_tokens"] += output_tokens
        self.admitted_at.append(self.wall_clock())
        self._prune()

    def _prune(self) -> None:
        horizon = self.wall_clock() - STATS_WINDOW_SECONDS
        while self.admitted_at and self.admitted_at[0] < horizon:
            self.admitted_at.popleft()

    def stats(self) -> dict[str, Any]:
        """Counters since start/reset, as served by ``GET /_sandbox/stats``.

        Keys: ``requests`` (every ``POST /v1/messages``), ``ok`` (200), ``4xx`` (400/401 and
        scripted 4xx other than 429), ``429``, ``529``, ``5xx`` (other 5xx),
        ``input_tokens`` / ``output_tokens`` (usage of 200 answers), ``pending_faults`` and
        ``admitted_at`` (epoch seconds of admissions in the last 600 s, oldest first).
        """
        self._prune()
        return {
            **self.counts,
            "pending_faults": len(self.script),
            "admitted_at": list(self.admitted_at),
        }

    def ratelimit_headers(self, snapshot: LimitsSnapshot | None = None) -> dict[str, str]:
        """``anthropic-ratelimit-*`` headers for ``snapshot`` (default: now).

        Per Anthropic's docs: ``*-limit`` is the per-minute limit, ``*-remaining`` what is
        left now (the real API rounds token counts to the nearest thousand; the sandbox
        reports exact whole tokens), ``*-reset`` the RFC 3339 time the bucket is full
        again. ``tokens-*`` repeats whichever of input/output is closer to its limit.
        """
        snap = snapshot if snapshot is not None else self.limiter.snapshot()
        now = self.wall_clock()
        headers: dict[str, str] = {}

        def put(prefix: str, b: BucketSnapshot) -> None:
            headers[f"anthropic-ratelimit-{prefix}-limit"] = str(b.limit)
            headers[f"anthropic-ratelimit-{prefix}-remaining"] = str(b.remaining)
            headers[f"anthropic-ratelimit-{prefix}-reset"] = rfc3339(now + b.seconds_to_full)

        put("requests", snap.requests)
        put("input-tokens", snap.input_tokens)
        put("output-tokens", snap.output_tokens)
        tightest = min((snap.input_tokens, snap.output_tokens), key=lambda b: b.remaining / b.limit)
        put("tokens", tightest)
        return headers
