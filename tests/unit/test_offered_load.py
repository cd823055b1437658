"""What a replay's tiers asked of the provider's limits (pgqueue.demo.offered_load): a fresh
tester read `replay --against-sandbox`'s critical p99 of 23 s against its 2 s SLO as the
scheduler's miss, but critical alone asked for more output tokens than the limit gives."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from pgqueue.demo import offered_load
from pgqueue.observability.report import _render_offered
from pgqueue.trace import load_trace, plan_replay

TIER_1 = (50, 40_000, 8_000)


def test_critical_alone_asks_more_than_the_output_limit_in_the_default_replay():
    plan = plan_replay(load_trace(limit=150), tenants=8, seed=0)
    offered = offered_load(plan, TIER_1)
    assert list(offered) == ["critical", "standard", "batch"]  # tier order
    assert offered["critical"]["output_tokens"] > 1.0
    total = sum(row["requests"] for row in offered.values())
    span_minutes = plan[-1].at_seconds / 60
    assert total == pytest.approx(len(plan) / span_minutes / TIER_1[0])
    out = io.StringIO()
    _render_offered(offered, Console(file=out, width=200))
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert any("critical" in ln and "whatever the schedule" in ln for ln in lines)


def test_an_empty_plan_offers_nothing():
    assert offered_load([], TIER_1) == {}
