"""The pure composition of tier pick and per-tier DRR (pgqueue.scheduling.dispatch)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from pgqueue.models import Tier
from pgqueue.scheduling.dispatch import TieredDrr
from pgqueue.scheduling.drr import DrrScheduler
from pgqueue.scheduling.tiers import StrictPolicy, WeightedPolicy

PROPS = settings(derandomize=True, database=None, deadline=None, max_examples=100)


def five(_tenant: str) -> float:
    return 5.0


@PROPS
@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(Tier)), st.sampled_from("abc"), st.integers(1, 9).map(float)
        ),
        max_size=60,
    )
)
def test_work_conserving_and_per_tier_drr(jobs):
    tiered = TieredDrr(WeightedPolicy(), five)
    per_tier = {tier: DrrScheduler(five) for tier in Tier}
    for job_id, (tier, tenant, cost) in enumerate(jobs):
        tiered.enqueue(tier, tenant, job_id, cost)
        per_tier[tier].enqueue(tenant, job_id, cost)
    out = []
    while (d := tiered.next()) is not None:
        out.append(d)
    assert len(out) == len(jobs)  # never None while work is queued
    for tier in Tier:  # within a tier, the order is that tier's DRR order
        assert [(d.tenant_id, d.job_id, d.cost) for d in out if d.tier is tier] == list(
            per_tier[tier].drain()
        )


def test_weighted_shares_and_strict_starvation():
    for policy, expect_batch in ((WeightedPolicy(), 100), (StrictPolicy(), 0)):
        tiered = TieredDrr(policy, five)
        for i in range(3000):
            for tier in Tier:
                tiered.enqueue(tier, "t", i * 3 + list(Tier).index(tier), 1.0)
        shares = Counter(tiered.next().tier for _ in range(2000))  # type: ignore[union-attr]
        assert shares[Tier.BATCH] == expect_batch
