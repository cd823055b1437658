"""When a runaway tenant is demoted to batch, pure.

The rule of the design brief (and the article's production setting): at least
``throttle_threshold`` throttle events (429/529) attributed to the tenant in the last
``throttle_window_seconds``, or today's input tokens above ``budget_ratio`` × its daily budget,
demote the tenant for ``demotion_seconds``; the demotion expires by itself. The SQL function
that records demotions applies the same rule; tests compare them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DemotionRule:
    """Thresholds, every one a setting: events (count), window and duration (seconds),
    budget ratio (dimensionless), default daily budget (input tokens)."""

    throttle_threshold: int = 5
    throttle_window_seconds: float = 60.0
    budget_ratio: float = 1.5
    default_daily_budget_tokens: int = 100_000
    demotion_seconds: float = 300.0

    def __post_init__(self) -> None:
        if self.throttle_threshold < 1:
            raise ValueError("throttle_threshold must be >= 1")
        if self.throttle_window_seconds <= 0 or self.demotion_seconds <= 0:
            raise ValueError("windows and durations must be > 0 seconds")
        if self.budget_ratio <= 0 or self.default_daily_budget_tokens < 0:
            raise ValueError("budget_ratio must be > 0 and the default budget >= 0")


def demotion_reason(
    rule: DemotionRule,
    *,
    throttles_in_window: int,
    input_tokens_today: int,
    daily_budget_tokens: int | None,
) -> str | None:
    """Why the tenant must be demoted now, or None.

    Args:
        throttles_in_window: throttle events of the tenant in the last window.
        input_tokens_today: input tokens charged to the tenant since the start of the day.
        daily_budget_tokens: the tenant's budget, None for the rule's default.
    """
    if throttles_in_window >= rule.throttle_threshold:
        return (
            f"{throttles_in_window} throttle events in {rule.throttle_window_seconds:g} s "
            f"(threshold {rule.throttle_threshold})"
        )
    budget = (
        rule.default_daily_budget_tokens if daily_budget_tokens is None else daily_budget_tokens
    )
    if input_tokens_today > rule.budget_ratio * budget:
        return (
            f"{input_tokens_today} input tokens today, over {rule.budget_ratio:g} × the daily "
            f"budget of {budget}"
        )
    return None
