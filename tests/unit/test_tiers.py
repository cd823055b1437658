"""Tier classification and the tier-pick policies (pgqueue.scheduling.tiers)."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgqueue.models import BATCH_SLA_SECONDS, Origin, Tier
from pgqueue.scheduling.tiers import (
    ProbabilisticPolicy,
    StrictPolicy,
    TierPolicy,
    WeightedPolicy,
    classify,
    policy_from_name,
)

PROPS = settings(derandomize=True, database=None, deadline=None, max_examples=200)
ALL = frozenset(Tier)
C, S, B = Tier.CRITICAL, Tier.STANDARD, Tier.BATCH

eligible_sets = st.frozensets(st.sampled_from(list(Tier)))


# --- classify ----------------------------------------------------------------------------------

U, SCH, BJ = Origin.USER_ACTION, Origin.SCHEDULED, Origin.BATCH_JOB


@pytest.mark.parametrize(
    ("origin", "sla", "demoted", "tier"),
    [
        (U, None, False, C),
        (U, 0.0, False, C),
        (U, 1e9, False, C),  # origin wins over a long SLA
        (SCH, None, False, B),
        (SCH, BATCH_SLA_SECONDS, False, B),
        (SCH, math.inf, False, B),
        (SCH, BATCH_SLA_SECONDS - 0.001, False, S),
        (SCH, 3600.0, False, S),
        (SCH, 0.0, False, S),
        (BJ, None, False, B),
        (BJ, 86_400.0, False, B),
        (BJ, 600.0, False, S),  # the SLA decides, not the origin's name
        (U, None, True, B),  # demotion wins over everything
        (U, 1.0, True, B),
        (SCH, 60.0, True, B),
        (BJ, None, True, B),
    ],
)
def test_classify_table(origin: Origin, sla: float | None, demoted: bool, tier: Tier) -> None:
    assert classify(origin, sla, demoted=demoted) is tier


@pytest.mark.parametrize("sla", [-1.0, -0.0001, math.nan])
def test_classify_rejects_negative_and_nan_sla(sla: float) -> None:
    with pytest.raises(ValueError, match="sla_seconds"):
        classify(Origin.SCHEDULED, sla, demoted=False)


@PROPS
@given(
    st.sampled_from(list(Origin)),
    st.one_of(st.none(), st.floats(min_value=0.0, allow_nan=False)),
    st.booleans(),
)
def test_classify_matches_the_rule(origin: Origin, sla: float | None, demoted: bool) -> None:
    if demoted:
        expected = B
    elif origin is Origin.USER_ACTION:
        expected = C
    elif sla is None or sla >= 86_400:
        expected = B
    else:
        expected = S
    assert classify(origin, sla, demoted=demoted) is expected


# --- work conservation, all policies ------------------------------------------------------------


def all_policies(seed: int) -> list[TierPolicy]:
    return [WeightedPolicy(), ProbabilisticPolicy(random.Random(seed)), StrictPolicy()]


@PROPS
@given(st.lists(eligible_sets, max_size=300), st.integers(min_value=0, max_value=1000))
def test_every_policy_is_work_conserving(sets: list[frozenset[Tier]], seed: int) -> None:
    for policy in all_policies(seed):
        assert isinstance(policy, TierPolicy)
        for eligible in sets:
            picked = policy.pick(eligible)
            if eligible:
                assert picked in eligible
            else:
                assert picked is None


# --- weighted (SWRR) ---------------------------------------------------------------------------


def test_swrr_shares_over_2000_picks_and_every_prefix() -> None:
    policy = WeightedPolicy()
    counts: Counter[Tier] = Counter()
    target = {C: 0.70, S: 0.25, B: 0.05}
    for n in range(1, 2001):
        picked = policy.pick(ALL)
        assert picked is not None
        counts[picked] += 1
        for tier, share in target.items():
            assert abs(counts[tier] - n * share) < 1.0  # never a whole pick away from its share
            if n >= 100:
                assert abs(counts[tier] / n - share) <= 0.01
    assert counts == {C: 1400, S: 500, B: 100}


def test_swrr_is_smooth_not_bursty() -> None:
    policy = WeightedPolicy()
    picks = [policy.pick(ALL) for _ in range(100)]
    batch_positions = [i for i, tier in enumerate(picks) if tier is B]
    assert len(batch_positions) == 5
    assert all(b - a == 20 for a, b in itertools.pairwise(batch_positions))
    longest_critical_run = max(
        len(run) for run in "".join("c" if t is C else "." for t in picks).split(".")
    )
    assert longest_critical_run <= 3


def test_swrr_empty_critical_shares_25_to_5() -> None:
    policy = WeightedPolicy()
    eligible = frozenset({S, B})
    counts = Counter(policy.pick(eligible) for _ in range(2000))
    assert set(counts) == {S, B}
    assert abs(counts[S] / 2000 - 25 / 30) <= 0.01
    assert abs(counts[B] / 2000 - 5 / 30) <= 0.01


def test_swrr_share_returns_when_a_tier_comes_back() -> None:
    policy = WeightedPolicy()
    for _ in range(500):  # critical alone for a while
        assert policy.pick(frozenset({C})) is C
    counts = Counter(policy.pick(ALL) for _ in range(1000))
    assert counts == {C: 700, S: 250, B: 50}


def test_swrr_ties_go_to_the_higher_priority_tier() -> None:
    policy = WeightedPolicy({C: 1.0, S: 1.0, B: 1.0})
    assert [policy.pick(ALL) for _ in range(6)] == [C, S, B, C, S, B]


@PROPS
@given(st.lists(eligible_sets, max_size=500))
def test_swrr_state_stays_bounded(sets: list[frozenset[Tier]]) -> None:
    policy = WeightedPolicy()
    total = sum(policy.weights.values())
    for eligible in sets:
        policy.pick(eligible)
        state = policy.state()
        assert all(abs(value) <= total for value in state.values())
        assert abs(math.fsum(state.values())) < 1e-9  # SWRR conserves the sum of currents


@PROPS
@given(st.lists(eligible_sets, max_size=100), st.lists(eligible_sets, max_size=100))
def test_swrr_state_round_trips_through_a_plain_dict(
    before: list[frozenset[Tier]], after: list[frozenset[Tier]]
) -> None:
    original = WeightedPolicy()
    for eligible in before:
        original.pick(eligible)
    restored = WeightedPolicy()
    restored.load_state(dict(original.state()))
    assert [original.pick(e) for e in after] == [restored.pick(e) for e in after]


def test_swrr_state_format_and_validation() -> None:
    policy = WeightedPolicy()
    assert policy.state() == {"critical": 0.0, "standard": 0.0, "batch": 0.0}
    policy.load_state({"batch": 3.0})
    assert policy.state() == {"critical": 0.0, "standard": 0.0, "batch": 3.0}
    with pytest.raises(ValueError, match="unknown tier"):
        policy.load_state({"urgent": 1.0})
    with pytest.raises(ValueError, match="finite"):
        policy.load_state({"critical": math.nan})


@pytest.mark.parametrize(
    "weights",
    [
        {C: 70.0, S: 25.0},  # missing
        {C: 70.0, S: 25.0, B: 0.0},  # zero would starve batch
        {C: 70.0, S: -1.0, B: 5.0},
        {C: math.inf, S: 25.0, B: 5.0},
    ],
)
def test_swrr_rejects_bad_weights(weights: dict[Tier, float]) -> None:
    with pytest.raises(ValueError):
        WeightedPolicy(weights)


# --- probabilistic -----------------------------------------------------------------------------


def test_probabilistic_shares_and_batch_never_starved() -> None:
    policy = ProbabilisticPolicy(random.Random(42))
    picks = [policy.pick(ALL) for _ in range(40_000)]
    counts = Counter(picks)
    assert abs(counts[C] / 40_000 - 0.9) <= 0.01
    assert abs(counts[S] / 40_000 - 0.1 * 25 / 30) <= 0.005
    assert abs(counts[B] / 40_000 - 0.1 * 5 / 30) <= 0.003
    for start in range(0, 40_000, 2000):  # batch is served in every window, never starved
        assert B in picks[start : start + 2000]


def test_probabilistic_without_critical_draws_25_to_5() -> None:
    policy = ProbabilisticPolicy(random.Random(5))
    counts = Counter(policy.pick(frozenset({S, B})) for _ in range(20_000))
    assert abs(counts[S] / 20_000 - 25 / 30) <= 0.01
    assert counts[B] > 0


def test_probabilistic_falls_back_instead_of_returning_nothing() -> None:
    never_critical = ProbabilisticPolicy(random.Random(0), p_critical=0.0)
    assert all(never_critical.pick(frozenset({C})) is C for _ in range(100))
    always_critical = ProbabilisticPolicy(random.Random(0), p_critical=1.0)
    assert all(always_critical.pick(frozenset({B})) is B for _ in range(100))
    assert always_critical.pick(frozenset()) is None


def test_probabilistic_is_stateless_and_validates() -> None:
    policy = ProbabilisticPolicy(random.Random(0))
    assert policy.state() == {}
    policy.load_state({"critical": 12.0})  # another policy's state: ignored
    with pytest.raises(ValueError, match="p_critical"):
        ProbabilisticPolicy(random.Random(0), p_critical=1.5)
    with pytest.raises(ValueError, match="unexpected tiers"):
        ProbabilisticPolicy(random.Random(0), weights_rest={C: 1.0, S: 1.0, B: 1.0})


# --- strict and by name ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("eligible", "expected"),
    [
        (ALL, C),
        (frozenset({S, B}), S),
        (frozenset({C, B}), C),
        (frozenset({B}), B),
        (frozenset(), None),
    ],
)
def test_strict_takes_the_first_eligible_tier(
    eligible: frozenset[Tier], expected: Tier | None
) -> None:
    policy = StrictPolicy()
    assert policy.pick(eligible) is expected
    assert policy.state() == {}


def test_policy_from_name() -> None:
    assert isinstance(policy_from_name("weighted"), WeightedPolicy)
    assert isinstance(policy_from_name(" Strict "), StrictPolicy)
    probabilistic = policy_from_name("probabilistic", random.Random(3))
    assert isinstance(probabilistic, ProbabilisticPolicy)
    assert isinstance(policy_from_name("probabilistic"), ProbabilisticPolicy)
    assert [policy_from_name(n).name for n in ("weighted", "probabilistic", "strict")] == [
        "weighted",
        "probabilistic",
        "strict",
    ]
    with pytest.raises(ValueError, match="unknown tier policy"):
        policy_from_name("fifo")
