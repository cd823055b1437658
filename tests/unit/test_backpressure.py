"""Retry-After parsing, throttle waits and retry backoff (pgqueue.scheduling.backpressure)."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgqueue.scheduling.backpressure import (
    backoff_seconds,
    parse_ratelimit_reset,
    parse_retry_after,
    throttle_wait_seconds,
)

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
PROPS = settings(derandomize=True, database=None, deadline=None, max_examples=200)


def http_date(moment: datetime) -> str:
    """IMF-fixdate, as a server writes it."""
    return moment.strftime("%a, %d %b %Y %H:%M:%S GMT")


# --- parse_retry_after -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", 0.0),
        ("1", 1.0),
        ("30", 30.0),
        (" 7 ", 7.0),
        ("0.5", 0.5),
        ("1.25", 1.25),
        (".5", 0.5),
        ("2.", 2.0),
    ],
)
def test_delta_seconds_integer_and_fractional(value: str, expected: float) -> None:
    assert parse_retry_after({"retry-after": value}, NOW) == expected


def test_http_date_in_the_future_is_seconds_from_now() -> None:
    headers = {"Retry-After": http_date(NOW + timedelta(seconds=42))}
    assert parse_retry_after(headers, NOW) == pytest.approx(42.0)


def test_http_date_in_the_past_is_zero() -> None:
    headers = {"retry-after": http_date(NOW - timedelta(minutes=5))}
    assert parse_retry_after(headers, NOW) == 0.0


@pytest.mark.parametrize(
    "value",
    [
        "Saturday, 01-Mar-25 12:00:10 GMT",  # RFC 850 (obsolete)
        "Sat Mar  1 12:00:10 2025",  # asctime (obsolete, no zone → GMT)
        "Sat, 01 Mar 2025 12:00:10 -0000",  # naive result → UTC
        "Sat, 01 Mar 2025 13:00:10 +0100",  # an explicit offset is honoured
    ],
)
def test_obsolete_and_zoned_http_dates(value: str) -> None:
    assert parse_retry_after({"retry-after": value}, NOW) == pytest.approx(10.0)


def test_naive_now_is_taken_as_utc() -> None:
    headers = {"retry-after": http_date(NOW + timedelta(seconds=3))}
    assert parse_retry_after(headers, NOW.replace(tzinfo=None)) == pytest.approx(3.0)


def test_retry_after_ms_wins_over_retry_after() -> None:
    headers = {"retry-after": "30", "retry-after-ms": "1500"}
    assert parse_retry_after(headers, NOW) == 1.5
    assert parse_retry_after({"retry-after-ms": "250.5"}, NOW) == pytest.approx(0.2505)


def test_invalid_retry_after_ms_falls_back_to_retry_after() -> None:
    assert parse_retry_after({"retry-after-ms": "soon", "retry-after": "4"}, NOW) == 4.0
    assert parse_retry_after({"retry-after-ms": "-5", "retry-after": "4"}, NOW) == 4.0
    assert parse_retry_after({"retry-after-ms": "nan"}, NOW) is None


@pytest.mark.parametrize(
    "headers",
    [
        {"RETRY-AFTER": "5"},
        {"Retry-After": "5"},
        {"rEtRy-AfTeR": "5"},
        {"Retry-After-Ms": "5000"},
        {"RETRY-AFTER-MS": "5000", "retry-after": "99"},
    ],
)
def test_header_names_are_case_insensitive(headers: dict[str, str]) -> None:
    assert parse_retry_after(headers, NOW) == 5.0


@pytest.mark.parametrize(
    "value",
    ["", "   ", "soon", "-1", "-0.5", "+5", "1e3", "nan", "NaN", "inf", "-inf", "0x10", "5s",
     "1,5", "Sat, 99 Foo 2025 12:00:10 GMT"],
)  # fmt: skip
def test_garbage_is_none(value: str) -> None:
    assert parse_retry_after({"retry-after": value}, NOW) is None


def test_no_header_is_none() -> None:
    assert parse_retry_after({}, NOW) is None
    assert parse_retry_after({"content-type": "application/json"}, NOW) is None


def test_huge_values_are_clamped() -> None:
    assert parse_retry_after({"retry-after": "999999999"}, NOW) == 3600.0
    assert parse_retry_after({"retry-after": "9" * 400}, NOW) is None  # overflows to inf
    assert parse_retry_after({"retry-after-ms": "1e12"}, NOW) is None  # exponent: not a decimal
    assert parse_retry_after({"retry-after-ms": "99999999999"}, NOW) == 3600.0
    far = {"retry-after": http_date(NOW + timedelta(days=30))}
    assert parse_retry_after(far, NOW) == 3600.0
    assert parse_retry_after(far, NOW, max_seconds=60.0) == 60.0
    with pytest.raises(ValueError, match="max_seconds"):
        parse_retry_after({}, NOW, max_seconds=-1.0)


@PROPS
@given(st.text(max_size=40), st.text(max_size=40))
def test_any_header_value_gives_none_or_a_bounded_number(retry_after: str, millis: str) -> None:
    for headers in ({"retry-after": retry_after}, {"retry-after-ms": millis}):
        result = parse_retry_after(headers, NOW)
        assert result is None or (math.isfinite(result) and 0.0 <= result <= 3600.0)


@PROPS
@given(st.integers(min_value=0, max_value=3600))
def test_integer_delta_round_trips(seconds: int) -> None:
    assert parse_retry_after({"retry-after": str(seconds)}, NOW) == float(seconds)
    date = {"retry-after": http_date(NOW + timedelta(seconds=seconds))}
    assert parse_retry_after(date, NOW) == pytest.approx(float(seconds))


# --- throttle_wait_seconds ---------------------------------------------------------------------


@pytest.mark.parametrize("retry_after", [0.5, 1.0, 7.0, 60.0])
def test_throttle_wait_stays_within_bounds_and_reaches_them(retry_after: float) -> None:
    rng = random.Random(1234)
    low, high = retry_after, retry_after * 1.2 * 1.2
    waits = [throttle_wait_seconds(retry_after, rng) for _ in range(5000)]
    assert all(low <= w <= high for w in waits)
    spread = high - low
    assert min(waits) < low + 0.01 * spread  # the draw covers the whole interval
    assert max(waits) > high - 0.01 * spread


@PROPS
@given(
    retry_after=st.floats(min_value=0.001, max_value=3600.0),
    multiplier=st.floats(min_value=0.1, max_value=5.0),
    jitter=st.floats(min_value=0.0, max_value=0.99),
    seed=st.integers(0, 2**32),
)
def test_a_throttle_wait_is_never_shorter_than_the_retry_after(
    retry_after: float, multiplier: float, jitter: float, seed: int
) -> None:
    """Issue 32, defect 9: ×1.2 ± 20 % went down to 0.96 × the provider's retry-after."""
    wait = throttle_wait_seconds(
        retry_after, random.Random(seed), multiplier=multiplier, jitter=jitter
    )
    assert wait >= retry_after
    assert wait <= retry_after * max(1.0, multiplier * (1 + jitter)) * (1 + 1e-12)


def test_sixty_seconds_of_retry_after_is_never_retried_early() -> None:
    rng = random.Random(10)
    waits = [throttle_wait_seconds(60.0, rng) for _ in range(10_000)]
    assert min(waits) >= 60.0
    assert max(waits) > 80.0  # the jitter is kept, above the hint


def test_throttle_wait_uses_the_default_without_a_usable_hint() -> None:
    for hint in (None, 0.0):
        waits = [throttle_wait_seconds(hint, random.Random(seed)) for seed in range(500)]
        assert all(1.0 <= w <= 1.44 for w in waits)
    waits = [throttle_wait_seconds(None, random.Random(s), default_seconds=10.0) for s in range(50)]
    assert all(10.0 <= w <= 14.4 for w in waits)


def test_throttle_wait_parameters() -> None:
    rng = random.Random(7)
    assert throttle_wait_seconds(10.0, rng, multiplier=1.0, jitter=0.0) == 10.0
    assert 7.2 <= throttle_wait_seconds(4.0, rng, multiplier=2.0, jitter=0.1) <= 8.8
    assert 4.0 <= throttle_wait_seconds(4.0, rng, multiplier=0.5, jitter=0.1) <= 4.0
    for bad in ({"jitter": 1.0}, {"jitter": -0.1}, {"multiplier": 0.0}, {"default_seconds": 0.0}):
        with pytest.raises(ValueError):
            throttle_wait_seconds(1.0, rng, **bad)
    for bad_hint in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            throttle_wait_seconds(bad_hint, rng)


# --- parse_ratelimit_reset -----------------------------------------------------------------


def _reset(seconds: float) -> str:
    return (NOW + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def test_a_429_without_retry_after_waits_for_the_spent_buckets_reset() -> None:
    """Issue 32, defect 9: a reset 30 s away gave a retry after 3.7 s."""
    headers = {
        "anthropic-ratelimit-requests-remaining": "12",
        "anthropic-ratelimit-requests-reset": _reset(2),
        "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-input-tokens-reset": _reset(30),
        "anthropic-ratelimit-output-tokens-remaining": "100",
        "anthropic-ratelimit-output-tokens-reset": _reset(45),
    }
    assert parse_retry_after(headers, NOW) is None
    assert parse_ratelimit_reset(headers, NOW) == pytest.approx(30.0)
    waits = [throttle_wait_seconds(30.0, random.Random(s)) for s in range(200)]
    assert min(waits) >= 30.0


def test_reset_headers_without_a_spent_bucket_give_the_latest_reset() -> None:
    headers = {
        "Anthropic-RateLimit-Requests-Reset": _reset(5),
        "anthropic-ratelimit-output-tokens-reset": _reset(12),
    }
    assert parse_ratelimit_reset(headers, NOW) == pytest.approx(12.0)


def test_unusable_or_past_resets() -> None:
    assert parse_ratelimit_reset({}, NOW) is None
    assert parse_ratelimit_reset({"anthropic-ratelimit-requests-reset": "soon"}, NOW) is None
    assert parse_ratelimit_reset({"anthropic-ratelimit-requests-reset": _reset(-9)}, NOW) == 0.0
    far = {"anthropic-ratelimit-requests-reset": _reset(10**6)}
    assert parse_ratelimit_reset(far, NOW) == 3600.0
    assert parse_ratelimit_reset(far, NOW.replace(tzinfo=None), max_seconds=60.0) == 60.0


def test_throttle_wait_is_reproducible_with_a_seed() -> None:
    first = [throttle_wait_seconds(2.0, random.Random(99)) for _ in range(3)]
    assert first == [throttle_wait_seconds(2.0, random.Random(99)) for _ in range(3)]


# --- backoff_seconds ---------------------------------------------------------------------------


def test_backoff_envelope_is_monotone_and_capped() -> None:
    rng = random.Random(2015)
    previous_ceiling = 0.0
    for attempt in range(1, 40):
        # Equal jitter: every draw lies in [ceiling/2, ceiling], ceiling = min(cap, 2^(attempt-1)).
        ceiling = min(300.0, 2.0 ** (attempt - 1))
        assert ceiling >= previous_ceiling
        waits = [backoff_seconds(attempt, rng) for _ in range(300)]
        assert all(0 < ceiling / 2 <= w <= ceiling <= 300.0 for w in waits)
        spread = ceiling / 2
        assert min(waits) < ceiling / 2 + 0.05 * spread  # the draws fill the envelope
        assert max(waits) > ceiling - 0.05 * spread
        previous_ceiling = ceiling
    assert backoff_seconds(10**9, rng) <= 300.0  # no overflow for absurd attempt numbers


@PROPS
@given(
    st.integers(min_value=1, max_value=100_000),
    st.floats(min_value=1e-3, max_value=100.0),
    st.floats(min_value=1e-3, max_value=10_000.0),
    st.integers(min_value=0, max_value=2**32),
)
def test_backoff_is_positive_and_never_above_cap(
    attempt: int, base: float, cap: float, seed: int
) -> None:
    wait = backoff_seconds(attempt, random.Random(seed), base_seconds=base, cap_seconds=cap)
    assert 0 < wait <= cap
    assert wait <= base * 2.0 ** min(attempt - 1, 64)


def test_backoff_rejects_bad_arguments() -> None:
    rng = random.Random(0)
    with pytest.raises(ValueError, match="attempt"):
        backoff_seconds(0, rng)
    with pytest.raises(ValueError, match="base_seconds"):
        backoff_seconds(1, rng, base_seconds=0.0)
    with pytest.raises(ValueError, match="cap_seconds"):
        backoff_seconds(1, rng, cap_seconds=math.inf)
