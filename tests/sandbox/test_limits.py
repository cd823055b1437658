"""pgqueue.sandbox.limits, driven purely by a fake clock (no sleeping, no I/O)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgqueue.sandbox.limits import RateLimiter, RateLimits, TokenBucket

from .conftest import FakeClock


def limiter(rpm: int = 50, itpm: int = 40_000, otpm: int = 8_000) -> tuple[RateLimiter, FakeClock]:
    clock = FakeClock(start=100.0)
    return RateLimiter(RateLimits(rpm, itpm, otpm), clock), clock


def test_burst_admits_exactly_the_request_limit() -> None:
    lim, _ = limiter(rpm=50)
    results = [lim.try_admit(1, 1).admitted for _ in range(60)]
    assert results == [True] * 50 + [False] * 10


def test_refill_is_continuous_at_limit_per_60_seconds() -> None:
    lim, clock = limiter(rpm=60)  # one request per second
    for _ in range(60):
        assert lim.try_admit(1, 1).admitted
    refused = lim.try_admit(1, 1)
    assert not refused.admitted
    assert refused.limiting == ("requests",)
    assert refused.retry_after_seconds == pytest.approx(1.0)

    clock.advance(0.5)  # half a request refilled: still no room
    assert not lim.try_admit(1, 1).admitted
    clock.advance(0.5)  # now exactly one
    assert lim.try_admit(1, 1).admitted
    assert not lim.try_admit(1, 1).admitted

    clock.advance(10.0)  # ten more, no fixed-window reset to the full 60
    admitted = sum(lim.try_admit(1, 1).admitted for _ in range(20))
    assert admitted == 10


def test_refusal_deducts_nothing_and_reports_the_limiting_bucket() -> None:
    lim, _ = limiter(itpm=1_000)
    assert lim.try_admit(900, 1).admitted
    before = lim.snapshot()
    refused = lim.try_admit(200, 1)
    assert not refused.admitted
    assert refused.limiting == ("input_tokens",)
    assert not refused.exceeds_capacity
    # 100 short at 1000/60 tokens per second
    assert refused.retry_after_seconds == pytest.approx(100 / (1_000 / 60))
    after = lim.snapshot()
    assert after.requests.remaining == before.requests.remaining
    assert after.input_tokens.remaining == before.input_tokens.remaining == 100


def test_wait_is_the_largest_of_the_short_buckets() -> None:
    lim, _ = limiter(rpm=60, itpm=600)
    assert lim.try_admit(600, 1).admitted  # input bucket empty, requests at 59
    for _ in range(59):
        assert lim.try_admit(0, 1).admitted
    refused = lim.try_admit(300, 1)  # requests: 1 s; input: 300 / 10 per s = 30 s
    assert set(refused.limiting) == {"requests", "input_tokens"}
    assert refused.retry_after_seconds == pytest.approx(30.0)


def test_output_charged_at_max_tokens_then_unused_part_refunded() -> None:
    lim, _ = limiter(otpm=1_000)
    assert lim.try_admit(1, 800).admitted
    assert lim.snapshot().output_tokens.remaining == 200
    assert not lim.try_admit(1, 300).admitted
    lim.refund_output(600)  # the answer used only 200 of 800
    assert lim.snapshot().output_tokens.remaining == 800
    assert lim.try_admit(1, 300).admitted


def test_refund_never_exceeds_capacity() -> None:
    lim, _ = limiter(otpm=1_000)
    lim.refund_output(5_000)
    snap = lim.snapshot().output_tokens
    assert snap.remaining == 1_000
    assert snap.seconds_to_full == 0.0


def test_request_larger_than_capacity_is_never_admitted() -> None:
    lim, clock = limiter(otpm=1_000)
    refused = lim.try_admit(1, 1_001)
    assert not refused.admitted
    assert refused.exceeds_capacity
    assert refused.limiting == ("output_tokens",)
    clock.advance(3_600)
    assert not lim.try_admit(1, 1_001).admitted
    assert lim.try_admit(1, 1_000).admitted


def test_snapshot_seconds_to_full_and_reset() -> None:
    lim, clock = limiter(rpm=60, itpm=6_000, otpm=600)
    assert lim.try_admit(3_000, 60).admitted
    snap = lim.snapshot()
    assert (snap.requests.limit, snap.requests.remaining) == (60, 59)
    assert snap.requests.seconds_to_full == pytest.approx(1.0)
    assert snap.input_tokens.seconds_to_full == pytest.approx(30.0)
    assert snap.output_tokens.seconds_to_full == pytest.approx(6.0)
    clock.advance(6.0)
    assert lim.snapshot().output_tokens.seconds_to_full == 0.0
    lim.reset()
    snap = lim.snapshot()
    assert snap.input_tokens.remaining == 6_000
    assert snap.requests.remaining == 60


def test_clock_stepping_back_refills_nothing() -> None:
    clock = FakeClock(start=50.0)
    bucket = TokenBucket(10, 1.0, clock())
    bucket.take(10, clock())
    clock.advance(-5.0)
    assert bucket.level(clock()) == 0.0
    clock.advance(7.0)  # 2 s past the last update
    assert bucket.level(clock()) == pytest.approx(2.0)


def test_bucket_take_beyond_level_raises() -> None:
    bucket = TokenBucket(5, 1.0, 0.0)
    with pytest.raises(ValueError):
        bucket.take(6, 0.0)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_limits_must_be_positive_ints(bad: object) -> None:
    with pytest.raises(ValueError):
        RateLimits(requests_per_minute=bad)  # type: ignore[arg-type]


@given(
    rpm=st.integers(min_value=1, max_value=120),
    gaps=st.lists(st.floats(min_value=0.0, max_value=5.0), min_size=1, max_size=300),
)
def test_admissions_never_exceed_burst_plus_refill(rpm: int, gaps: list[float]) -> None:
    """Over any window from the start, admitted <= limit + elapsed * limit / 60."""
    lim, clock = limiter(rpm=rpm)
    start = clock()
    admitted = 0
    for gap in gaps:
        clock.advance(gap)
        admitted += lim.try_admit(0, 0).admitted
        elapsed = clock() - start
        assert admitted <= math.floor(rpm + elapsed * rpm / 60 + 1e-6)
