"""How long to wait before sending again: Retry-After parsing, throttle waits, retry backoff.

Pure functions: no I/O, no clock, no global RNG. The caller passes ``now`` and a
``random.Random``, so every result is reproducible in tests and in the simulator. Workers use the
results to reschedule a job (``run_at``), never to sleep.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from pgqueue.scheduling.ratelimit import parse_ratelimit_headers

__all__ = [
    "DEFAULT_MAX_RETRY_AFTER_SECONDS",
    "backoff_seconds",
    "parse_ratelimit_reset",
    "parse_retry_after",
    "throttle_wait_seconds",
]

#: Longest wait a provider hint may impose, in seconds; larger hints are clamped to it.
DEFAULT_MAX_RETRY_AFTER_SECONDS = 3600.0

# Unsigned decimal: RFC 9110 delta-seconds is 1*DIGIT; a fractional part is accepted because the
# Anthropic API and its SDK use it. No sign, no exponent, no "nan"/"inf" (which float() accepts).
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")


def _parse_decimal(text: str) -> float | None:
    """A non-negative finite decimal, or None when ``text`` is anything else."""
    text = text.strip()
    if not _DECIMAL.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None  # "9" * 400 overflows to inf


def _as_utc(moment: datetime) -> datetime:
    """HTTP dates are GMT; a naive datetime (``-0000``, asctime form, naive ``now``) is UTC."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def parse_retry_after(
    headers: Mapping[str, str],
    now: datetime,
    *,
    max_seconds: float = DEFAULT_MAX_RETRY_AFTER_SECONDS,
) -> float | None:
    """Seconds the provider asks us to wait, from a 429/529 response's headers.

    Header names are matched case-insensitively (the first spelling found wins).

    1. ``retry-after-ms`` (Anthropic's millisecond hint, float) wins when present and valid.
    2. Else ``retry-after``: delta-seconds (RFC 9110 §10.2.3 says an integer; fractional values
       such as ``"0.5"`` are accepted, as the Anthropic Python SDK does), or an HTTP-date in any
       form :func:`email.utils.parsedate_to_datetime` reads (IMF-fixdate, RFC 850, asctime).
       A date becomes seconds from ``now``; a date in the past means "now" → ``0.0``.
       Naive datetimes (``now`` included) are taken as UTC.

    Malformed values — garbage, signs (so negative numbers), exponents, NaN, infinity — are not a
    hint at all and give ``None``, as does the absence of both headers. Results are clamped to
    ``[0.0, max_seconds]``.

    Raises ``ValueError`` if ``max_seconds`` is negative or not finite.
    """
    if not (math.isfinite(max_seconds) and max_seconds >= 0):
        raise ValueError(f"max_seconds must be finite and >= 0, got {max_seconds!r}")
    lowered: dict[str, str] = {}
    for name, value in headers.items():
        lowered.setdefault(name.lower(), value)

    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        millis = _parse_decimal(raw_ms)
        if millis is not None:
            return min(millis / 1000.0, max_seconds)

    raw = lowered.get("retry-after")
    if raw is None:
        return None
    seconds = _parse_decimal(raw)
    if seconds is not None:
        return min(seconds, max_seconds)
    try:
        when = parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    delta = (_as_utc(when) - _as_utc(now)).total_seconds()
    return min(max(delta, 0.0), max_seconds)


def throttle_wait_seconds(
    retry_after: float | None,
    rng: random.Random,
    *,
    multiplier: float = 1.2,
    jitter: float = 0.2,
    default_seconds: float = 1.0,
) -> float:
    """Seconds to postpone a throttled (429/529) job: ``v × U(low, high)``, never less than ``v``.

    ``v`` is ``retry_after`` (seconds, from :func:`parse_retry_after` or
    :func:`parse_ratelimit_reset`), or ``default_seconds`` when the provider gave no usable
    hint — ``None`` *or* ``0.0``: a "retry now" answer to a 429 still waits the default, so that
    workers do not come back in lockstep (a zero wait would also cancel the jitter).
    ``high = multiplier × (1 + jitter)`` and ``low = max(1, multiplier × (1 − jitter))``: the
    article's ×1.2 ± 20 % (seed 000), with the jitter kept only above the hint, because the
    provider refuses a request sent before its ``retry-after`` (found by a fault run: the plain
    ±20 % went down to 0.96 × and 3 of 10 retries came 2.3 s early). With the defaults the
    result lies in ``[v, 1.44 v]``; jitter spreads the retries of many workers so they do not
    return in the same millisecond.

    Raises ``ValueError`` for a negative or non-finite ``retry_after``, a non-positive
    ``multiplier`` or ``default_seconds``, or ``jitter`` outside ``[0, 1)``.
    """
    if retry_after is not None and not (math.isfinite(retry_after) and retry_after >= 0):
        raise ValueError(f"retry_after must be finite and >= 0, got {retry_after!r}")
    if not (math.isfinite(multiplier) and multiplier > 0):
        raise ValueError(f"multiplier must be finite and > 0, got {multiplier!r}")
    if not (0 <= jitter < 1):
        raise ValueError(f"jitter must be in [0, 1), got {jitter!r}")
    if not (math.isfinite(default_seconds) and default_seconds > 0):
        raise ValueError(f"default_seconds must be finite and > 0, got {default_seconds!r}")
    base = retry_after if retry_after else default_seconds
    high = multiplier * (1.0 + jitter)
    low = min(max(1.0, multiplier * (1.0 - jitter)), high)
    return max(base, base * rng.uniform(low, max(low, high)))


def parse_ratelimit_reset(
    headers: Mapping[str, str],
    now: datetime,
    *,
    max_seconds: float = DEFAULT_MAX_RETRY_AFTER_SECONDS,
) -> float | None:
    """Seconds until the provider's spent bucket is full again, from the
    ``anthropic-ratelimit-{requests,input-tokens,output-tokens}-reset`` headers (RFC 3339
    times): for a 429 that names no ``retry-after`` (found by a fault run: a reset 30 s away
    gave a retry after 3.7 s, the default).

    The buckets whose ``-remaining`` is 0 are the spent ones, and the latest of their resets is
    the answer; when no bucket says it is spent, the latest reset of any. None when no reset
    header is usable. A reset in the past gives ``0.0``; results are clamped to
    ``[0.0, max_seconds]``. Naive ``now`` is taken as UTC.
    """
    seen = parse_ratelimit_headers(headers)
    resets = [h.reset for h in seen.values() if h.reset is not None and h.remaining == 0]
    if not resets:
        resets = [h.reset for h in seen.values() if h.reset is not None]
    if not resets:
        return None
    delta = (max(_as_utc(r) for r in resets) - _as_utc(now)).total_seconds()
    return min(max(delta, 0.0), max_seconds)


def backoff_seconds(
    attempt: int,
    rng: random.Random,
    *,
    base_seconds: float = 1.0,
    cap_seconds: float = 300.0,
) -> float:
    """Seconds to wait before retry number ``attempt`` (1 = first retry) after a failed call.

    Capped exponential backoff with "equal jitter" (Marc Brooker, "Exponential Backoff And
    Jitter", AWS Architecture Blog, 2015): with ``ceiling = min(cap, base · 2^(attempt−1))``, the
    wait is ``ceiling/2 + U(0, ceiling/2)``. Equal jitter rather than "full jitter" because full
    jitter can draw 0 (an immediate retry); this one keeps half of the envelope as a floor, so the
    result is in ``[ceiling/2, ceiling]``: always > 0, never above ``cap_seconds``, and both bounds
    are non-decreasing in ``attempt``.

    Raises ``ValueError`` if ``attempt < 1`` or a duration is not finite and positive.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt!r}")
    if not (math.isfinite(base_seconds) and base_seconds > 0):
        raise ValueError(f"base_seconds must be finite and > 0, got {base_seconds!r}")
    if not (math.isfinite(cap_seconds) and cap_seconds > 0):
        raise ValueError(f"cap_seconds must be finite and > 0, got {cap_seconds!r}")
    # Compare exponents rather than computing 2**(attempt-1), which overflows for large attempts.
    if attempt - 1 >= math.log2(cap_seconds / base_seconds):
        ceiling = cap_seconds
    else:
        ceiling = min(cap_seconds, base_seconds * 2.0 ** (attempt - 1))
    half = ceiling / 2.0
    return min(half + rng.uniform(0.0, half), cap_seconds)
