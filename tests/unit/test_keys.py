"""DRR's order as keys (pgqueue.scheduling.keys) against the classic reference (drr.py)."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgqueue.scheduling.drr import DrrScheduler
from pgqueue.scheduling.keys import DrrKey, KeyedDrr, to_units

PROPS = settings(derandomize=True, database=None, deadline=None, max_examples=300)

TENANTS = ["a", "b", "c", "d", "e"]

# One phase: jobs (tenant, cost in whole cost units) enqueued, then that many dispatches.
phases = st.lists(
    st.tuples(
        st.lists(st.tuples(st.sampled_from(TENANTS), st.integers(1, 12)), max_size=15),
        st.integers(0, 20),
    ),
    min_size=1,
    max_size=6,
)
quanta = st.fixed_dictionaries({t: st.integers(1, 8) for t in TENANTS})


def _run_both(
    phases_: list[tuple[list[tuple[str, int]], int]],
    quanta_: dict[str, int],
    horizon: int | None,
) -> tuple[list[tuple[str, int]], list[tuple[str, int]], list[DrrKey]]:
    classic = DrrScheduler(lambda t: float(quanta_[t]))
    keyed = KeyedDrr(lambda t: to_units(quanta_[t]), horizon_rounds=horizon)
    want: list[tuple[str, int]] = []
    got: list[tuple[str, int]] = []
    keys: list[DrrKey] = []
    job = 0
    for jobs, dispatches in [*phases_, ([], 10_000)]:
        for tenant, cost in jobs:
            job += 1
            classic.enqueue(tenant, job, float(cost))
            keyed.enqueue(tenant, job, to_units(cost))
        for _ in range(dispatches):
            a, b = classic.next(), keyed.next()
            assert (a is None) == (b is None)
            if a is None or b is None:
                break
            want.append((a[0], a[1]))
            got.append((b.tenant_id, b.job_id))
            keys.append(b.key)
    return want, got, keys


@PROPS
@given(phases=phases, quanta_=quanta, horizon=st.sampled_from([None, 0, 1, 3]))
def test_keyed_order_is_the_classic_drr_order(phases, quanta_, horizon):
    want, got, _ = _run_both(phases, quanta_, horizon)
    assert got == want


@PROPS
@given(phases=phases, quanta_=quanta, horizon=st.sampled_from([None, 0, 2]))
def test_dispatched_keys_strictly_increase(phases, quanta_, horizon):
    """A joiner's key is past the cursor (next round), a backlogged tenant's new jobs come
    after its stamped ones: the cursor only moves forward, so a claim never looks back."""
    _, _, keys = _run_both(phases, quanta_, horizon)
    assert all(before < after for before, after in itertools.pairwise(keys))


def test_a_joiner_takes_its_place_just_before_the_cursor():
    """A, B, C backlogged (quantum 1, cost 1): B is served; D joins. D's first turn comes after
    C's and A's turns, and just before B's next: the tail of the active list."""
    keyed = KeyedDrr(lambda _t: 1, offset_of="ABCD".index)
    for t in "ABC":
        for i in range(3):
            keyed.enqueue(t, ord(t) * 10 + i, 1)
    served = [keyed.next() for _ in range(2)]
    assert [s.tenant_id for s in served if s] == ["A", "B"]
    keyed.enqueue("D", 1, 1)
    order = [s.tenant_id for s in iter(keyed.next, None)]
    assert order == ["C", "A", "D", "B", "C", "A", "B", "C"]


def test_a_costly_job_waits_ceil_cost_over_quantum_rounds():
    keyed = KeyedDrr(lambda _t: 5)
    keyed.enqueue("big", 1, 40)
    for i in range(60):
        keyed.enqueue("small", 100 + i, 1)
    first = keyed.head()
    assert first is not None
    stamped = {s.job_id: s.key for s in keyed.stamped()}
    assert stamped[1].round == 8  # joined in round 1, turns 1..8 give 40 units


def test_the_horizon_bounds_one_fold_and_keeps_the_order():
    """1M jobs of one tenant: a fold stamps only the rounds within the horizon."""
    keyed = KeyedDrr(lambda _t: 5, horizon_rounds=2)
    for i in range(1_000_000):
        keyed.enqueue("big", i, 1)
    keyed.enqueue("small", -1, 1)
    keyed.fold()
    assert len(keyed.stamped()) == 2 * 5 + 1  # rounds 1 and 2 of "big", and "small"
    assert [s.tenant_id for s in iter(keyed.next, None)][:7].index("small") <= 5


def test_places_are_exact_rationals_and_rounds_integers():
    keyed = KeyedDrr(lambda _t: 3)
    for i, t in enumerate("xyz"):
        keyed.enqueue(t, i, 2)
    s = keyed.next()
    assert s is not None
    assert isinstance(s.key.round, int) and isinstance(s.key.place, Fraction)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_costs_and_quanta_must_be_positive_ints(bad):
    keyed = KeyedDrr(lambda _t: bad)
    with pytest.raises(ValueError, match="cost"):
        keyed.enqueue("a", 1, bad)
    keyed.enqueue("a", 1, 1)
    with pytest.raises(ValueError, match="quantum"):
        keyed.next()


def test_to_units():
    assert to_units(1.0) == 1000
    assert to_units(2.5) == 2500
    assert to_units(0.0001) == 1
    with pytest.raises(ValueError):
        to_units(float("nan"))
