"""Per-tenant Deficit Round Robin and its helpers (pgqueue.scheduling.drr)."""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter, defaultdict, deque
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgqueue.scheduling.drr import (
    DrrScheduler,
    estimate_input_tokens,
    jain_index,
    job_cost,
    quantum_for_plan,
    stable_offset,
)

PROPS = settings(derandomize=True, database=None, deadline=None, max_examples=150)


def flat(quantum: float) -> Callable[[str], float]:
    return lambda _tenant: quantum


def next_tenants(drr: DrrScheduler, count: int) -> list[str]:
    """The tenants of the next ``count`` dispatches."""
    out = []
    for _ in range(count):
        item = drr.next()
        assert item is not None
        out.append(item[0])
    return out


class Ids:
    """Unique job ids for a test."""

    def __init__(self) -> None:
        self.last = 0

    def __call__(self) -> int:
        self.last += 1
        return self.last


# --- (a) a small tenant behind a big one ---------------------------------------------------------


@pytest.mark.parametrize("quantum", [1.0, 5.0])
@pytest.mark.parametrize("served_before", [0, 1, 2, 3, 4, 5, 6, 37, 98])
def test_newcomer_waits_at_most_one_quantum_of_the_big_tenant(
    quantum: float, served_before: int
) -> None:
    drr = DrrScheduler(flat(quantum))
    for job in range(100):
        drr.enqueue("A", job, 1.0)
    for _ in range(served_before):
        assert drr.next() is not None
    drr.enqueue("B", 1000, 1.0)
    a_jobs_before_b = 0
    while (item := drr.next()) is not None and item[0] != "B":
        a_jobs_before_b += 1
    assert item == ("B", 1000, 1.0)
    assert a_jobs_before_b <= quantum


def test_newcomer_behind_10000_jobs_is_served_within_one_round() -> None:
    drr = DrrScheduler(flat(5.0))
    for job in range(10_000):
        drr.enqueue("big", job, 1.0)
    drr.next()
    drr.enqueue("small", -1, 1.0)
    ahead = 0
    while drr.next() != ("small", -1, 1.0):
        ahead += 1
    assert ahead <= 5


# --- (b) equal backlogged tenants share equally at every prefix -----------------------------------


def test_eight_equal_tenants_random_costs_every_prefix() -> None:
    rng = random.Random(1995)
    quantum, max_cost = 5.0, 8.0
    tenants = [f"tenant-{i}" for i in range(8)]
    drr = DrrScheduler(flat(quantum))
    job = Ids()
    for tenant in tenants:
        for _ in range(600):  # stays backlogged for all 2,000 dispatches
            drr.enqueue(tenant, job(), float(rng.randint(1, 8)))
    served = dict.fromkeys(tenants, 0.0)
    for _ in range(2000):
        item = drr.next()
        assert item is not None
        served[item[0]] += item[2]
        assert max(served.values()) - min(served.values()) <= quantum + max_cost
    assert all(drr.deficit(t) < max_cost + quantum for t in tenants)
    assert jain_index(list(served.values())) >= 0.99


@PROPS
@given(
    st.integers(min_value=2, max_value=6),
    st.integers(min_value=1, max_value=10),
    st.integers(min_value=1, max_value=30),
    st.integers(min_value=0, max_value=2**32),
)
def test_equal_share_bound_holds_for_any_quantum_and_costs(
    n_tenants: int, quantum: int, max_cost: int, seed: int
) -> None:
    rng = random.Random(seed)
    drr = DrrScheduler(flat(float(quantum)))
    job = Ids()
    tenants = [f"t{i}" for i in range(n_tenants)]
    dispatches = 300
    for tenant in tenants:
        for _ in range(dispatches):
            drr.enqueue(tenant, job(), float(rng.randint(1, max_cost)))
    served = dict.fromkeys(tenants, 0.0)
    for _ in range(dispatches):
        item = drr.next()
        assert item is not None
        served[item[0]] += item[2]
        assert max(served.values()) - min(served.values()) <= quantum + max_cost


# --- (c) weights scale the shares ----------------------------------------------------------------


def test_pro_tenant_gets_three_times_a_free_tenant() -> None:
    plans = {"pro": "pro", "free-1": "free", "free-2": "free", "free-3": "free"}
    drr = DrrScheduler(lambda tenant: quantum_for_plan(plans[tenant]))
    rng = random.Random(3)
    job = Ids()
    for tenant in plans:
        for _ in range(3000):
            drr.enqueue(tenant, job(), float(rng.randint(1, 8)))
    served: dict[str, float] = defaultdict(float)
    for _ in range(4000):
        item = drr.next()
        assert item is not None
        served[item[0]] += item[2]
    for free in ("free-1", "free-2", "free-3"):
        assert 2.7 <= served["pro"] / served[free] <= 3.3


# --- (d) a job costlier than the quantum ---------------------------------------------------------


def test_cost_40_job_with_quantum_5_is_served_on_its_eighth_turn() -> None:
    turns: Counter[str] = Counter()

    def quantum_of(tenant: str) -> float:
        turns[tenant] += 1  # called once per turn, when the tenant reaches the head of the round
        return 5.0

    drr = DrrScheduler(quantum_of)
    job = Ids()
    for tenant in ("x", "y", "z"):
        for _ in range(200):
            drr.enqueue(tenant, job(), 1.0)
    drr.enqueue("heavy", 0, 40.0)
    while (item := drr.next()) is not None and item[0] != "heavy":
        pass
    assert item == ("heavy", 0, 40.0)
    assert turns["heavy"] == 8 == math.ceil(40 / 5)
    assert drr.deficit("heavy") == 0.0


@PROPS
@given(st.integers(min_value=1, max_value=500), st.integers(min_value=1, max_value=20))
def test_expensive_job_needs_exactly_ceil_cost_over_quantum_turns(cost: int, quantum: int) -> None:
    turns: Counter[str] = Counter()

    def quantum_of(tenant: str) -> float:
        turns[tenant] += 1
        return float(quantum)

    drr = DrrScheduler(quantum_of)
    for job in range(1000):
        drr.enqueue("busy", job, 1.0)
    drr.enqueue("heavy", -1, float(cost))
    while drr.next() != ("heavy", -1, float(cost)):
        pass
    assert turns["heavy"] == math.ceil(cost / quantum)


def test_lone_expensive_job_is_never_stuck() -> None:
    drr = DrrScheduler(flat(1.0))
    drr.enqueue("t", 7, 250.0)
    assert drr.next() == ("t", 7, 250.0)
    assert drr.next() is None


# --- (e) idle tenants bank no credit -------------------------------------------------------------


def test_deficit_resets_when_the_queue_empties() -> None:
    drr = DrrScheduler(flat(5.0), offset_of={"T": 0, "U": 1}.__getitem__)
    drr.enqueue("T", 1, 2.0)
    drr.enqueue("T", 2, 4.0)
    drr.enqueue("U", 3, 1.0)
    assert drr.next() == ("T", 1, 2.0)
    assert drr.deficit("T") == 3.0
    assert drr.next() == ("U", 3, 1.0)  # T's head (4) > 3: its turn ends, 3 carries over
    assert drr.deficit("T") == 3.0
    assert drr.deficit("U") == 0.0  # U emptied with 4 left: reset, not banked
    assert drr.active_tenants() == ["T"]
    assert drr.next() == ("T", 2, 4.0)  # 3 + 5 = 8 ≥ 4
    assert drr.deficit("T") == 0.0  # 4 left over is dropped as T goes idle
    assert drr.active_tenants() == []
    assert drr.next() is None
    drr.enqueue("T", 4, 5.0)  # back with no credit: one fresh quantum covers exactly 5
    assert drr.deficit("T") == 0.0
    assert drr.next() == ("T", 4, 5.0)


# --- round order and staggered refill order ------------------------------------------------------


def test_tenants_that_become_active_together_are_ordered_by_offset() -> None:
    offsets = {"a": 30, "b": 10, "c": 20, "d": 10}
    drr = DrrScheduler(flat(1.0), offset_of=offsets.__getitem__)
    for tenant in ("a", "b", "c", "d"):
        drr.enqueue(tenant, ord(tenant), 1.0)
        drr.enqueue(tenant, ord(tenant) + 100, 1.0)
    assert drr.active_tenants() == ["b", "d", "c", "a"]  # offset, then id on ties
    assert next_tenants(drr, 4) == ["b", "d", "c", "a"]


def test_newcomers_join_the_tail_of_the_round() -> None:
    drr = DrrScheduler(flat(1.0), offset_of={"z": 0, "y": 1, "new": -5}.__getitem__)
    for tenant in ("z", "y"):
        for job in range(3):
            drr.enqueue(tenant, job, 1.0)
    assert drr.next() == ("z", 0, 1.0)
    drr.enqueue("new", 99, 1.0)  # lowest offset, but joins behind everyone already active
    assert drr.active_tenants() == ["z", "y", "new"]
    assert next_tenants(drr, 3) == ["y", "new", "z"]


def test_observing_does_not_change_the_order() -> None:
    def run(observe: bool) -> list[str]:
        drr = DrrScheduler(flat(1.0), offset_of={"p": 2, "q": 1}.__getitem__)
        drr.enqueue("p", 1, 1.0)
        if observe:
            drr.active_tenants()
            drr.snapshot()
            drr.preview(5)
        drr.enqueue("q", 2, 1.0)
        return [item[0] for item in drr.drain()]

    assert run(observe=False) == run(observe=True) == ["q", "p"]


def test_stable_offset_is_pinned() -> None:
    # The SQL side computes the same number; changing the hash is a contract change.
    assert stable_offset("acme") == int.from_bytes(hashlib.sha256(b"acme").digest()[:4], "big")
    assert stable_offset("acme") == 0x822B33AD
    assert stable_offset("tenant-0") == 0x0E74F59A
    assert stable_offset("café") == 0x850F7DC4  # UTF-8 bytes
    assert all(0 <= stable_offset(f"t{i}") < 2**32 for i in range(100))


def test_snapshot_and_preview() -> None:
    drr = DrrScheduler(flat(2.0), offset_of={"a": 0, "b": 1}.__getitem__)
    drr.enqueue("a", 1, 1.0)
    drr.enqueue("a", 2, 3.0)
    drr.enqueue("b", 3, 2.0)
    preview = drr.preview(10)
    before = drr.snapshot()
    assert before.round_order == ("a", "b")
    assert before.current is None
    assert before.backlog == {"a": (1, 2), "b": (3,)}
    assert before.queued_cost == {"a": 4.0, "b": 2.0}
    assert drr.preview(2) == preview[:2]
    assert list(drr.drain()) == preview == [("a", 1, 1.0), ("b", 3, 2.0), ("a", 2, 3.0)]
    assert len(drr) == 0
    with pytest.raises(ValueError):
        drr.preview(-1)


def test_scheduler_validates_costs_and_quanta() -> None:
    drr = DrrScheduler(flat(0.0))
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="cost"):
            drr.enqueue("t", 1, bad)
    drr.enqueue("t", 1, 1.0)
    with pytest.raises(ValueError, match="quantum"):
        drr.next()


# --- (f) no job lost or duplicated, FIFO per tenant, work-conserving ------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("enqueue"),
            st.sampled_from(["a", "b", "c", "d", "e"]),
            st.integers(min_value=1, max_value=12),
        ),
        st.tuples(st.just("next"), st.just(""), st.just(0)),
    ),
    max_size=200,
)


@PROPS
@given(operations, st.integers(min_value=1, max_value=6), st.booleans())
def test_random_interleavings_lose_and_duplicate_nothing(
    ops: list[tuple[str, str, int]], quantum: int, pro_a: bool
) -> None:
    def quantum_of(tenant: str) -> float:
        return quantum_for_plan("pro" if pro_a and tenant == "a" else "free", base=quantum)

    drr = DrrScheduler(quantum_of)
    model: dict[str, deque[tuple[int, float]]] = defaultdict(deque)  # expected FIFO per tenant
    enqueued: set[int] = set()
    served: list[int] = []
    job = Ids()

    def dispatch() -> tuple[str, int, float] | None:
        item = drr.next()
        if item is None:
            assert not any(model.values())  # work-conserving: None only when nothing is queued
            return None
        tenant, job_id, cost = item
        assert model[tenant].popleft() == (job_id, cost)  # FIFO within the tenant
        served.append(job_id)
        # DRR invariant: a tenant waiting for its turn holds less credit than its head costs.
        snap = drr.snapshot()
        for other in snap.round_order:
            if other != snap.current and model[other]:
                assert 0 <= drr.deficit(other) < model[other][0][1]
        return item

    for op, tenant, cost in ops:
        if op == "enqueue":
            job_id = job()
            drr.enqueue(tenant, job_id, float(cost))
            model[tenant].append((job_id, float(cost)))
            enqueued.add(job_id)
        else:
            dispatch()
        assert len(drr) == sum(len(q) for q in model.values())
        assert set(drr.active_tenants()) == {t for t, q in model.items() if q}
    while dispatch() is not None:
        pass
    assert len(served) == len(set(served))
    assert set(served) == enqueued
    assert drr.active_tenants() == []
    assert all(drr.deficit(t) == 0.0 for t in "abcde")


# --- quantum, cost, token estimate, Jain ---------------------------------------------------------


def test_quantum_for_plan() -> None:
    assert quantum_for_plan("free") == 5.0
    assert quantum_for_plan("pro") == 15.0
    assert quantum_for_plan("Pro") == 15.0
    assert quantum_for_plan("enterprise") == 5.0
    assert quantum_for_plan("pro", base=2.0) == 6.0
    assert quantum_for_plan("pro", override=7.5) == 7.5
    for bad in ({"base": 0.0}, {"override": -1.0}, {"override": math.nan}):
        with pytest.raises(ValueError):
            quantum_for_plan("free", **bad)


@pytest.mark.parametrize(
    ("tokens", "cost"),
    [(0, 1.0), (1, 1.0), (999, 1.0), (1000, 1.0), (1500, 1.5), (20_000, 20.0), (200_000, 200.0)],
)
def test_job_cost(tokens: int, cost: float) -> None:
    assert job_cost(tokens) == cost


def test_job_cost_rejects_negative_tokens() -> None:
    with pytest.raises(ValueError):
        job_cost(-1)


def test_estimate_input_tokens() -> None:
    assert estimate_input_tokens({}) == 0
    assert estimate_input_tokens({"messages": [{"role": "user", "content": "abcd"}]}) == 1
    assert estimate_input_tokens({"messages": [{"role": "user", "content": "abcde"}]}) == 2
    payload = {
        "model": "claude-x",
        "max_tokens": 100,
        "system": [{"type": "text", "text": "s" * 40}, {"type": "text", "text": "t" * 8}],
        "messages": [
            {"role": "user", "content": "u" * 100},
            {"role": "assistant", "content": [{"type": "text", "text": "a" * 20}]},
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "data": "x" * 9999}},
                    {"type": "tool_result", "tool_use_id": "t1", "content": "r" * 12},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": [{"type": "text", "text": "q" * 4}],
                    },
                ],
            },
        ],
    }
    assert estimate_input_tokens(payload) == math.ceil((48 + 100 + 20 + 12 + 4) / 4)
    assert estimate_input_tokens({"system": "é" * 8}) == 2  # code points, not bytes


json_like = st.recursive(
    st.none() | st.integers() | st.text(max_size=5) | st.sampled_from(["tool_result", "text"]),
    lambda children: (
        st.lists(children)
        | st.dictionaries(
            st.sampled_from(["system", "messages", "content", "text", "type", "role"]), children
        )
    ),
    max_leaves=30,
)


@PROPS
@given(json_like)
def test_estimate_never_raises_on_odd_payloads(payload: object) -> None:
    result = estimate_input_tokens(payload if isinstance(payload, dict) else {"messages": payload})
    assert result >= 0


def test_jain_index() -> None:
    assert jain_index([]) == 1.0
    assert jain_index([0.0, 0.0]) == 1.0
    assert jain_index([3.0, 3.0, 3.0]) == 1.0
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain_index([1.0, 2.0]) == pytest.approx(9 / 10)
    for bad in ([-1.0], [math.nan], [math.inf]):
        with pytest.raises(ValueError):
            jain_index(bad)


@PROPS
@given(st.lists(st.floats(min_value=0, max_value=1e9), min_size=1, max_size=50))
def test_jain_index_is_between_one_over_n_and_one(xs: list[float]) -> None:
    value = jain_index(xs)
    assert 1 / len(xs) - 1e-9 <= value <= 1.0
