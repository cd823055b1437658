"""The tiers' shares of a model's input-token bucket in SQL (ratelimit_pick_tier and
ratelimit_try_take with a tier, 060_rate_limiter.sql) against TierShares, its pure reference
(pgqueue/scheduling/capacity.py).

Time stands still in one transaction (the ``conn`` fixture): a step of ``dt`` seconds moves
the row's refreshed_at and guarantees_at back by ``dt``, so the levels compare exactly.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgqueue.models import Tier
from pgqueue.scheduling.capacity import TierShares

Conn = psycopg.Connection[Any]
C, S, B = Tier.CRITICAL, Tier.STANDARD, Tier.BATCH
LIMIT = 40_000.0
#: The mean request size the tests start from: 20 of them are 40,000 tokens, so the share caps
#: the reserve, as before the reserve was counted in requests.
MEAN = 2_000.0
Heads = dict[Tier, float]


def limiter(
    conn: Conn,
    level: float = LIMIT,
    margin: float = 0.0,
    reserve: float | None = None,
    mean: float = MEAN,
) -> None:
    """A fresh row for model 'm': LIMIT input tokens a minute at ``level``; requests and output
    tokens never bind. ``margin`` and ``reserve``: the GUCs, shares of the limit (``reserve``
    None: the default, 1/4). ``mean``: the mean request size (tokens) the reserve counts in."""
    conn.execute("DELETE FROM pgqueue.rate_limits")
    conn.execute("SELECT set_config('pgqueue.ratelimit_input_margin', %s, true)", (str(margin),))
    conn.execute(
        "SELECT set_config('pgqueue.ratelimit_trunk_reserve', %s, true)",
        ("" if reserve is None else str(reserve),),
    )
    conn.execute(
        "INSERT INTO pgqueue.rate_limits (model, requests_per_minute, input_tokens_per_minute,"
        " output_tokens_per_minute, requests_available, input_tokens_available,"
        " output_tokens_available, mean_input_tokens) VALUES ('m', 1e9, %s, 1e9, 1e9, %s, 1e9, %s)",
        (LIMIT, level, mean),
    )


def elapse(conn: Conn, seconds: float) -> None:
    conn.execute(
        "UPDATE pgqueue.rate_limits SET refreshed_at = refreshed_at - make_interval(secs => %s),"
        " guarantees_at = guarantees_at - make_interval(secs => %s) WHERE model = 'm'",
        (seconds, seconds),
    )


def needs(heads: Heads) -> list[float | None]:
    return [heads.get(t) for t in Tier]


def pick(conn: Conn, heads: Heads) -> Tier | None:
    found = conn.execute(
        "SELECT pgqueue.ratelimit_pick_tier('m', %s::double precision[])", (needs(heads),)
    ).fetchone()[0]
    return None if found is None else Tier(found)


def take(conn: Conn, tokens: float, tier: Tier | None) -> float:
    return conn.execute(
        "SELECT pgqueue.ratelimit_try_take('m', %s, 0, %s::pgqueue.tier)",
        (tokens, None if tier is None else tier.value),
    ).fetchone()[0]


def row(conn: Conn) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM pgqueue.rate_limits WHERE model = 'm'")
    names = [c.name for c in cur.description]
    return dict(zip(names, cur.fetchone(), strict=True))


def guarantees(conn: Conn) -> list[float]:
    r = row(conn)
    return [r[f"guarantee_{t.value}"] for t in Tier]


def backlogged(conn: Conn) -> list[str]:
    return conn.execute(
        "SELECT tiers_backlogged::text[] FROM pgqueue.rate_limits WHERE model = 'm'"
    ).fetchone()[0]


def admissible_in_sql(conn: Conn, tier: Tier, need: float) -> bool:
    """What ratelimit_try_take would decide now, without taking (the row is refilled to now:
    every call of the same transaction saved it at now())."""
    wait = conn.execute(
        "SELECT pgqueue.ratelimit_wait(l, %s::pgqueue.tier, %s, 0) FROM pgqueue.rate_limits l"
        " WHERE l.model = 'm'",
        (tier.value, need),
    ).fetchone()[0]
    return wait == 0


def slack(ref: TierShares, tier: Tier, need: float, heads: Heads) -> float:
    """How far the reference's admission of ``tier`` is from its boundary, in tokens: a
    decision closer than float rounding is not compared."""
    over_level = ref.level - need
    held = ref.guarantee[tier] - need
    reserve = ref._reserve_for(tier, need, heads)
    rest = ref.guarantee[tier] + ref.free - need - reserve
    return min(abs(over_level), abs(held), abs(rest))


FUZZ = 1e-6

head = st.one_of(st.none(), st.integers(1, 40_000).map(float))
steps = st.lists(
    st.tuples(st.integers(0, 15_000).map(lambda ms: ms / 1000), head, head, head),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    level=st.integers(0, 40_000).map(float),
    reserve=st.sampled_from([None, 0.0, 0.125]),
    weights=st.sampled_from([(70.0, 25.0, 5.0), (1.0, 1.0, 1.0), (10.0, 30.0, 60.0)]),
    steps=steps,
)
def test_picks_and_levels_match_the_reference(conn, level, reserve, weights, steps):
    """Random sequences of heads and elapsed times: the same tier is picked and taken, and the
    level and each tier's guarantee agree within float tolerance; every backlogged tier's head
    is admissible in SQL exactly when it is in the reference."""
    limiter(conn, level=level, reserve=reserve)
    for tier, weight in zip(Tier, weights, strict=True):
        conn.execute(
            "SELECT set_config(%s, %s, true)", (f"pgqueue.tier_weight_{tier.value}", str(weight))
        )
    tokens = None if reserve is None else reserve * LIMIT
    ref = TierShares(
        LIMIT, level, 0.0, tokens, weights=dict(zip(Tier, weights, strict=True)), mean_need=MEAN
    )
    now = 0.0
    for dt, *tier_needs in steps:
        heads = {t: n for t, n in zip(Tier, tier_needs, strict=True) if n is not None}
        now += dt
        elapse(conn, dt)
        ref.advance(now, heads)
        want = ref.pick(heads)
        got = pick(conn, heads)
        if got != want and any(slack(ref, t, n, heads) < FUZZ for t, n in heads.items()):
            return  # a tie within float rounding: the two may go different ways from here
        assert got == want
        for tier, need in heads.items():
            if slack(ref, tier, need, heads) >= FUZZ:
                assert admissible_in_sql(conn, tier, need) == ref.admissible(tier, need, heads)
        if want is not None:
            assert take(conn, heads[want], want) == 0
            ref.take(want, heads[want])
        assert row(conn)["input_tokens_available"] == pytest.approx(ref.level, abs=1e-6)
        assert guarantees(conn) == pytest.approx([ref.guarantee[t] for t in Tier], abs=1e-6)
        assert backlogged(conn) == [t.value for t in Tier if t in heads]


def test_a_lower_tier_leaves_the_reserve_while_critical_is_idle(conn):
    """8,000 tokens in the bucket, reserve 5,000: a 4,000-token batch job would leave 4,000,
    so it waits while critical and standard are idle (an untiered take, as before tiers, would
    take it). With critical and standard backlogged, each holding its own guarantee, the same
    job goes, and the guarantees stay in the bucket for their tiers. With standard idle it
    waits again: the reserve is kept below any idle higher tier (TierShares._reserve_for)."""
    limiter(conn, level=8000, reserve=0.125)
    assert pick(conn, {B: 4000}) is None
    wait = take(conn, 4000, B)
    assert wait == pytest.approx(1000 / (LIMIT / 60))  # 1,000 tokens short of the reserve
    assert row(conn)["input_tokens_available"] == 8000
    assert take(conn, 4000, None) == 0  # no tier: the bucket alone decides, as before

    limiter(conn, level=6000, reserve=0.125)
    elapse(conn, 3)  # 2,000 tokens refilled: 1,400 guaranteed to critical, 500 to standard
    heads = {C: 9000.0, S: 9000.0, B: 4000.0}  # critical's and standard's heads do not fit yet
    assert pick(conn, heads) is B
    assert guarantees(conn) == pytest.approx([1400, 500, 100])
    assert take(conn, 4000, B) == 0
    assert row(conn)["input_tokens_available"] == pytest.approx(4000)
    assert guarantees(conn) == pytest.approx([1400, 500, 0])
    assert take(conn, 4000, B) > 0  # the next would eat into critical's and standard's

    limiter(conn, level=6000, reserve=0.125)  # the same with standard idle: batch is below it
    elapse(conn, 3)
    assert pick(conn, {C: 9000.0, B: 4000.0}) is None
    assert guarantees(conn) == pytest.approx([2000 * 70 / 75, 0, 2000 * 5 / 75])


def test_guarantees_never_hold_more_than_the_bucket(conn):
    """A take without a tier (or a provider's header) may lower the level under the sum of
    the guarantees: the lowest tiers give theirs back first. rate_limit_state shows them."""
    limiter(conn, level=6000, reserve=0.125)
    elapse(conn, 3)
    assert pick(conn, {C: 9000.0, S: 9000.0, B: 4000.0}) is B
    assert guarantees(conn) == pytest.approx([1400, 500, 100])
    assert take(conn, 7000, None) == 0
    assert guarantees(conn) == pytest.approx([1000, 0, 0])
    shown = conn.execute(
        "SELECT guarantee_critical, guarantee_standard, guarantee_batch,"
        " tiers_backlogged::text[] FROM pgqueue.rate_limit_state WHERE model = 'm'"
    ).fetchone()
    assert shown == (pytest.approx(1000), 0, 0, ["critical", "standard", "batch"])


def test_the_reserve_is_twenty_requests_of_the_mean_size(conn):
    """The reserve is room for 20 requests of the running mean size, at most 1/4 of the limit
    (TierShares._reserve_for): with 300-token requests, 6,000 tokens. Each take moves the mean
    1/16 of the way to its size; before the first take there is no mean and no reserve. With
    the share alone the lower tiers stood still for 15 s of refill after every drain."""
    limiter(conn, level=8_500, mean=300)
    assert pick(conn, {B: 2_600}) is None  # would leave 5,900
    assert pick(conn, {B: 2_000}) == B  # leaves 6,500
    assert take(conn, 1_000, C) == 0
    assert row(conn)["mean_input_tokens"] == pytest.approx(300 + (1_000 - 300) / 16)
    limiter(conn, level=2_500, mean=0)
    assert pick(conn, {B: 2_500}) == B
    assert take(conn, 2_500, B) == 0
    assert row(conn)["mean_input_tokens"] == 2_500


def test_the_default_reserve_is_a_quarter_of_the_limit(conn):
    """As TierShares' DEFAULT_RESERVE_FRACTION: 10,000 of 40,000 tokens."""
    limiter(conn, level=12_000)
    assert pick(conn, {B: 2001}) is None
    assert pick(conn, {B: 2000}) is B


def test_the_margin_still_guards_critical(conn):
    """Critical keeps no reserve, but every take leaves the input margin (2 % of the limit):
    the estimate's error. The reserve counts the margin in, rather than adding to it."""
    limiter(conn, level=1000, margin=0.02)
    assert pick(conn, {C: 500}) is None  # 500 + 800 > 1,000
    assert take(conn, 500, C) == pytest.approx(300 / (LIMIT / 60))
    limiter(conn, level=10_000, margin=0.02, reserve=0.125)
    assert pick(conn, {B: 5000}) is B
    assert take(conn, 5000, B) == 0  # leaves the 5,000 reserve exactly, the margin within
    assert take(conn, 1, B) > 0


def test_the_ratio_applies_to_the_heads_as_to_the_take(conn):
    """p_needs are estimates, as ratelimit_try_take's input tokens: both scale them by the
    model's observed ratio."""
    limiter(conn, level=10_000)
    conn.execute("UPDATE pgqueue.rate_limits SET input_estimate_ratio = 2")
    assert pick(conn, {C: 6000}) is None  # 12,000 tokens
    assert pick(conn, {C: 4000}) is C
    assert take(conn, 4000, C) == 0
    assert row(conn)["input_tokens_available"] == pytest.approx(2000)


def test_the_pick_sees_the_cooldown_the_requests_and_the_output_tokens(conn):
    """As ratelimit_try_take decides: nothing during a cooldown or without a request. The
    output bucket is shared by the same rule as the input (tier_grow, tier_short): a lower
    tier's head takes free output tokens, not those critical's guarantee holds, and critical's
    guarantee grows until its head goes. Before, the lower tiers' smaller requests took the
    output tokens as they came, and an output-bound replay at Tier-1 limits had critical p99
    at 23 s."""
    limiter(conn)
    conn.execute(
        "UPDATE pgqueue.rate_limits SET output_tokens_per_minute = 8000,"
        " output_tokens_available = 1000"
    )
    both = "SELECT pgqueue.ratelimit_pick_tier('m', '{500,500,NULL}', %s::double precision[])"
    assert conn.execute(both, ([2000, 800, None],)).fetchone()[0] == "standard"  # free tokens
    conn.execute("UPDATE pgqueue.rate_limits SET output_guarantee_critical = 1000")
    assert conn.execute(both, ([2000, 800, None],)).fetchone()[0] is None  # critical's tokens
    elapse(conn, 30)
    assert conn.execute(both, ([2000, 800, None],)).fetchone()[0] == "critical"
    assert row(conn)["output_guarantee_critical"] >= 2000
    conn.execute(
        "UPDATE pgqueue.rate_limits SET output_tokens_available = 1000,"
        " output_guarantee_critical = 0, output_guarantee_standard = 0"
    )
    assert conn.execute(both, ([800, 800, None],)).fetchone()[0] == "critical"
    assert conn.execute(both, ([2000, 2000, None],)).fetchone()[0] is None
    assert pick(conn, {C: 500}) is C  # no output needs given: not checked here
    conn.execute("UPDATE pgqueue.rate_limits SET requests_available = 0.5")
    assert pick(conn, {C: 500}) is None
    conn.execute(
        "UPDATE pgqueue.rate_limits SET requests_available = 50,"
        " cooldown_until = now() + interval '30 seconds'"
    )
    assert pick(conn, {C: 500}) is None
    assert take(conn, 500, C) == pytest.approx(30)


def test_a_job_larger_than_the_bucket_is_let_through(conn):
    """A head larger than the bucket's limit can never be sent whole: the pick names its tier
    (as claim_admitted lets such a job through, for the provider to refuse), so it does not
    block its tier for ever."""
    limiter(conn, level=LIMIT)
    assert pick(conn, {B: 50_000}) is B
    assert take(conn, 50_000, B) == float("inf")


@pytest.mark.parametrize(
    ("heads", "share"),
    [({C: 500.0, S: 36_000.0}, 25 / 95), ({C: 500.0, S: 500.0, B: 36_000.0}, 5 / 100)],
)
def test_a_large_lower_tier_job_is_admitted_eventually(conn, heads, share):
    """The tiers above keep the bucket busy with 500-token jobs while the lowest backlogged
    tier's head needs 36,000 tokens (90 % of the limit, far more than the bucket holds while
    they run): its guarantee grows for it alone, at its share of the refill, and it is sent."""
    limiter(conn, level=0)
    low = list(heads)[-1]  # the lowest tier given
    bound = heads[low] / (share * LIMIT / 60)  # seconds for its share to reach the need
    sent_at, small = None, 0
    for second in range(1, int(1.5 * bound)):
        elapse(conn, 1)
        while sent_at is None and (tier := pick(conn, heads)) is not None:
            assert take(conn, heads[tier], tier) == 0
            if tier is low:
                sent_at = second
            else:
                small += 1
        if sent_at is not None:
            break
    assert sent_at is not None, "starved"
    assert small >= 0.9 * (1 - share) * sent_at * (LIMIT / 60) / 500
