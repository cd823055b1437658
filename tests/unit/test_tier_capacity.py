"""The tiers' capacity rule (TierShares, pgqueue/scheduling/capacity.py) at the provider's
Tier-1 limits, all three buckets: 50 requests, 40,000 input and 8,000 output tokens a minute.

One lane, as ``pgqueue.ratelimit_pick_tier`` sees it: the highest tier whose head job is
admissible under the rule in both token buckets (input and output, ``pick_across``) and also
finds a request. Every STEP seconds
of simulated time the lane sends whatever it can; output tokens are reserved at max_tokens and
never refunded (the worst case: the worker refunds what an answer did not use). Standard and
batch stay backlogged; critical arrives as a Poisson stream.

Two kinds of sizes: fixed-size critical jobs (the issue's measured case: 500 tokens) with
standard and batch jobs of 2,000-8,000 tokens, and sizes drawn from the bundled Azure LLM
trace as bench/tier_capacity.py (issue-28-bench) draws them: critical up to 4,000 input tokens
(mean 878), 30 % of standard jobs long documents of 5,000-8,000, output capped at 400; and
the same with the trace's output sizes uncapped, critical's demand set against the output
limit, which then binds (as in ``pgqueue replay --against-sandbox``).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import pytest

from pgqueue.models import Tier
from pgqueue.scheduling.capacity import TierShares, pick_across
from pgqueue.scheduling.ratelimit import TokenBucket
from pgqueue.trace import load_trace

C, S, B = Tier.CRITICAL, Tier.STANDARD, Tier.BATCH
STEP = 0.05
RPM, ITPM, OTPM = 50.0, 40_000.0, 8_000.0
Size = tuple[int, int]  # input tokens, max_tokens
Draw = Callable[[random.Random, Tier], Size]


@dataclass
class Served:
    waits: dict[Tier, list[float]]
    tokens: dict[Tier, float]

    def p99(self, tier: Tier) -> float:
        xs = sorted(self.waits[tier])
        return xs[min(len(xs) - 1, int(0.99 * len(xs)))]

    def share(self, tier: Tier) -> float:
        return self.tokens[tier] / sum(self.tokens.values())


def fixed(critical_tokens: int) -> Draw:
    """Critical jobs of ``critical_tokens`` (100 max_tokens); standard and batch of
    2,000-8,000 input tokens and 200-1,500 max_tokens."""

    def draw(rng: random.Random, tier: Tier) -> Size:
        if tier is C:
            return critical_tokens, 100
        return rng.randint(2000, 8000), rng.randint(200, 1500)

    return draw


@cache
def _trace(cap: int = 400) -> tuple[list[Size], list[Size]]:
    sizes = [(max(16, r.input_tokens), max(1, min(cap, r.output_tokens))) for r in load_trace()]
    return sizes, [s for s in sizes if s[0] <= 4000]


def _traced(rng: random.Random, tier: Tier, cap: int) -> Size:
    every, small = _trace(cap)
    if tier is C:
        return rng.choice(small)
    size = rng.choice(every)
    if tier is S and rng.random() < 0.30:
        return rng.randint(5000, 8000), size[1]
    return size


def traced(rng: random.Random, tier: Tier) -> Size:
    return _traced(rng, tier, 400)


def traced_output(rng: random.Random, tier: Tier) -> Size:
    """The trace's sizes with their output uncapped (up to the output limit): output binds."""
    return _traced(rng, tier, int(OTPM) - 1)


def critical_mean(draw: Draw, index: int = 0) -> float:
    """The mean size of critical jobs (``index`` 0: input tokens, 1: output)."""
    if draw in (traced, traced_output):
        small = _trace(400 if draw is traced else int(OTPM) - 1)[1]
        return sum(s[index] for s in small) / len(small)
    return draw(random.Random(0), C)[index]


def simulate(seed: int, demand: float, draw: Draw, seconds: float = 300, limit: int = 0) -> Served:
    """Critical's tokens arrive at ``demand`` of a limit (``limit`` 0: input, 1: output), over
    ``seconds``; ``Served.tokens`` counts the tokens of that bucket."""
    rng = random.Random(seed)
    shares, out_shares = TierShares.full(ITPM, 0.0), TierShares.full(OTPM, 0.0)
    requests = TokenBucket.full(RPM, 0.0)
    queues: dict[Tier, deque[tuple[Size, float]]] = {t: deque() for t in Tier}
    served = Served({t: [] for t in Tier}, dict.fromkeys(Tier, 0.0))
    per_second = demand * (ITPM, OTPM)[limit] / 60 / critical_mean(draw, limit)
    now = 0.0
    while now < seconds:
        for tier in (S, B):
            while len(queues[tier]) < 3:
                queues[tier].append((draw(rng, tier), now))
        for _ in range(20):  # Poisson arrivals, approximated in 20 slots per step
            if rng.random() < per_second * STEP / 20:
                queues[C].append((draw(rng, C), now))
        while heads := {t: float(q[0][0][0]) for t, q in queues.items() if q}:
            outs = {t: float(q[0][0][1]) for t, q in queues.items() if q}
            shares.advance(now, heads)
            out_shares.advance(now, outs)
            requests = requests.refilled(now)
            left = requests.available
            picked = pick_across(
                [(shares, heads), (out_shares, outs)], lambda _t, left=left: left >= 1
            )
            if picked is None:
                break
            (tokens, out), arrived = queues[picked].popleft()
            shares.take(picked, tokens)
            out_shares.take(picked, out)
            _, requests = requests.try_take(1, now)
            served.waits[picked].append(now - arrived)
            served.tokens[picked] += (tokens, out)[limit]
        now += STEP
    return served


@pytest.mark.parametrize("seed", range(1, 7))
@pytest.mark.parametrize(
    ("demand", "draw"),
    [
        (0.42, fixed(500)),  # the measured case
        (0.60, fixed(500)),
        (0.60, fixed(1500)),
        (0.42, traced),
        (0.50, traced),  # bench/tier_capacity.py's default
        (0.60, traced),
    ],
    ids=["500@42%", "500@60%", "1500@60%", "trace@42%", "trace@50%", "trace@60%"],
)
def test_critical_p99_within_its_slo_and_batch_keeps_its_share(seed, demand, draw):
    """Done-when 3 on the reference, at Tier-1 limits over 5 simulated minutes: with standard
    and batch backlogged and critical's demand at most 60 % of the binding limit, critical's
    p99 wait is within its 2 s SLO and batch still gets at least 4 % of the input tokens."""
    served = simulate(seed, demand, draw)
    assert len(served.waits[C]) > 0.7 * demand * ITPM / 60 * 300 / critical_mean(draw)
    assert served.p99(C) <= 2.0
    assert served.share(B) >= 0.04
    assert served.tokens[S] > served.tokens[B] > 0


@pytest.mark.parametrize("seed", range(1, 4))
@pytest.mark.parametrize("demand", [0.30, 0.42, 0.60])
def test_output_bound_critical_p99_within_its_slo(seed, demand):
    """The same with the output tokens binding (the trace's output sizes uncapped, critical's
    demand against the output limit): with the rule on the input bucket only, lower tiers'
    smaller requests took the output tokens as they came and critical's p99 was 4.8-107 s in 5
    of these 9 runs; with the rule on both buckets it is within its SLO, and batch keeps at
    least 4 % of the output tokens."""
    served = simulate(seed, demand, traced_output, limit=1)
    assert served.p99(C) <= 2.0
    assert served.share(B) >= 0.04
