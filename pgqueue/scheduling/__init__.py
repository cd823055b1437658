"""The pure scheduling policy: tier classification and pick, per-tenant DRR, backpressure waits.

No database, no asyncio, no I/O; clocks and random generators are passed in. The SQL scheduler
mirrors these functions and is tested against them.
"""

from pgqueue.scheduling.backpressure import (
    backoff_seconds,
    parse_retry_after,
    throttle_wait_seconds,
)
from pgqueue.scheduling.drr import (
    DrrScheduler,
    DrrSnapshot,
    estimate_input_tokens,
    jain_index,
    job_cost,
    quantum_for_plan,
    stable_offset,
)
from pgqueue.scheduling.tiers import (
    ProbabilisticPolicy,
    StrictPolicy,
    TierPolicy,
    WeightedPolicy,
    classify,
    policy_from_name,
)

__all__ = [
    "DrrScheduler",
    "DrrSnapshot",
    "ProbabilisticPolicy",
    "StrictPolicy",
    "TierPolicy",
    "WeightedPolicy",
    "backoff_seconds",
    "classify",
    "estimate_input_tokens",
    "jain_index",
    "job_cost",
    "parse_retry_after",
    "policy_from_name",
    "quantum_for_plan",
    "stable_offset",
    "throttle_wait_seconds",
]
