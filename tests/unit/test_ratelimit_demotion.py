"""Pure token buckets, rate-limit header parsing and the demotion rule."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgqueue.scheduling.demotion import DemotionRule, demotion_reason
from pgqueue.scheduling.ratelimit import LimitHeader, TokenBucket, parse_ratelimit_headers


def test_a_full_bucket_admits_exactly_its_capacity_in_a_burst():
    bucket = TokenBucket.full(50, now=0.0)
    taken = 0
    for _ in range(100):
        ok, bucket = bucket.try_take(1, now=0.0)
        taken += ok
    assert taken == 50


def test_refill_is_continuous_and_capped():
    bucket = TokenBucket(capacity=60, available=0, at=0.0)
    assert bucket.refilled(1.0).available == pytest.approx(1.0)
    assert bucket.refilled(30.0).available == pytest.approx(30.0)
    assert bucket.refilled(1000.0).available == 60
    assert bucket.refilled(-5.0).available == 0  # a clock going backwards adds nothing


def test_seconds_until():
    bucket = TokenBucket(capacity=8000, available=1000, at=0.0)
    assert bucket.seconds_until(500, 0.0) == 0.0
    assert bucket.seconds_until(2000, 0.0) == pytest.approx(1000 / (8000 / 60))
    assert bucket.seconds_until(9000, 0.0) is None


def test_observed_remaining_only_lowers_the_level():
    bucket = TokenBucket(capacity=100, available=80, at=0.0)
    assert bucket.observed(30, 0.0).available == 30
    assert bucket.observed(95, 0.0).available == 80


@given(
    per_minute=st.integers(1, 10_000),
    takes=st.lists(st.tuples(st.floats(0, 10), st.integers(1, 50)), max_size=60),
)
def test_never_more_than_capacity_plus_refill(per_minute, takes):
    bucket = TokenBucket.full(per_minute, now=0.0)
    now = 0.0
    total = 0
    for step, amount in takes:
        now += step
        ok, bucket = bucket.try_take(amount, now)
        total += amount if ok else 0
    assert total <= per_minute + now * per_minute / 60 + 1e-6


def test_parse_headers():
    headers = {
        "Anthropic-RateLimit-Requests-Limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": "2026-11-29T12:00:01Z",
        "anthropic-ratelimit-input-tokens-limit": "40000",
        "anthropic-ratelimit-input-tokens-remaining": "garbage",
        "anthropic-ratelimit-output-tokens-reset": "not a date",
    }
    got = parse_ratelimit_headers(headers)
    assert got["requests"] == LimitHeader(50, 49, datetime(2026, 11, 29, 12, 0, 1, tzinfo=UTC))
    assert got["input-tokens"] == LimitHeader(40000, None, None)
    assert "output-tokens" not in got
    assert parse_ratelimit_headers({}) == {}


RULE = DemotionRule()


@pytest.mark.parametrize(
    ("throttles", "tokens", "budget", "demoted"),
    [
        (4, 0, None, False),
        (5, 0, None, True),
        (0, 150_000, None, False),
        (0, 150_001, None, True),
        (0, 300_001, 200_000, True),
        (0, 299_999, 200_000, False),
        (0, 1, 0, True),
    ],
)
def test_demotion_rule(throttles, tokens, budget, demoted):
    reason = demotion_reason(
        RULE, throttles_in_window=throttles, input_tokens_today=tokens, daily_budget_tokens=budget
    )
    assert (reason is not None) is demoted


def test_rule_validation():
    with pytest.raises(ValueError):
        DemotionRule(throttle_threshold=0)
    with pytest.raises(ValueError):
        DemotionRule(demotion_seconds=0)


def test_a_take_leaves_the_margin_unless_the_request_is_too_large_for_it():
    bucket = TokenBucket(40_000, 39_000, 0.0)
    assert bucket.try_take(38_500, 0.0, margin=800)[0] is False  # would leave 500 < 800
    assert bucket.try_take(38_200, 0.0, margin=800)[0] is True
    assert bucket.seconds_until(38_500, 0.0, margin=800) == (38_500 + 800 - 39_000) / (40_000 / 60)
    full = TokenBucket.full(40_000, now=0.0)
    assert full.try_take(39_900, 0.0, margin=800)[0] is True  # leaves what it can: 100
    ok, after = full.try_take(1_000, 0.0, margin=800)
    assert ok and after.available == 39_000  # only the amount is taken
