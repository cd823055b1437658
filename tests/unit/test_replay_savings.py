"""What the batches lane would save on the real trace (pgqueue.replay.batch_lane_savings)."""

from __future__ import annotations

import pytest

from pgqueue.models import Origin
from pgqueue.replay import batch_lane_savings
from pgqueue.settings import Settings
from pgqueue.trace import load_trace, plan_replay


def test_savings_count_the_batch_tier_of_the_trace_only() -> None:
    plan = plan_replay(load_trace(None, limit=300), tenants=4, seed=1)
    lane = batch_lane_savings(plan, Settings())
    batch = [j for j in plan if j.sla_seconds is None and j.origin is not Origin.USER_ACTION]
    assert 0 < lane["jobs"] == len(batch) < len(plan)
    assert lane["input_tokens"] == sum(j.input_tokens for j in batch)
    assert lane["output_tokens"] == sum(j.output_tokens for j in batch)
    full = (lane["input_tokens"] * 3.0 + lane["output_tokens"] * 15.0) / 1e6
    assert lane["cost_saved_usd"] == pytest.approx(0.5 * full)


def test_savings_follow_the_price_settings() -> None:
    plan = plan_replay(load_trace(None, limit=100), tenants=2, seed=2)
    free = Settings(price_input_usd_per_mtok=0, price_output_usd_per_mtok=0)
    assert batch_lane_savings(plan, free)["cost_saved_usd"] == 0
    assert batch_lane_savings([], Settings()) == {
        "jobs": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "cost_saved_usd": 0.0,
    }
