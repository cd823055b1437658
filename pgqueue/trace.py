"""Real request traces and the replay planner: turn recorded LLM requests into pgqueue jobs.

This module's one job is pure planning: it maps every request of a trace (read by
:mod:`pgqueue.trace_file`, which also names the bundled Azure LLM inference trace 2023, CC-BY
4.0, and how to cite it), deterministically, onto a synthetic tenant, origin and SLA with a
filler prompt of the recorded size. It touches no database and no network; the caller enqueues
the :class:`PlannedJob` list at each job's ``at_seconds``. ``load_trace`` and ``TraceRequest``
are re-exported from there.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pgqueue.errors import InvalidArgument
from pgqueue.models import Origin
from pgqueue.trace_file import BUNDLED_TRACE, MAX_TRACE_TOKENS, TraceRequest, is_real, load_trace

__all__ = [
    "BUNDLED_TRACE",
    "CHARS_PER_TOKEN",
    "MAX_TRACE_TOKENS",
    "PlannedJob",
    "TraceRequest",
    "load_trace",
    "plan_replay",
    "summarize_plan",
]

#: Characters of filler prompt per recorded input token (the usual English rule of thumb).
CHARS_PER_TOKEN = 4
#: The SLAs (seconds) a ``scheduled`` job draws from, uniformly.
SCHEDULED_SLAS_SECONDS: tuple[float, ...] = (60.0, 300.0, 3600.0)

#: Origin mix (user_action, scheduled, batch_job) of an ordinary tenant.
ORIGIN_MIX: tuple[float, float, float] = (0.20, 0.50, 0.30)

#: Origin mix of the runaway tenant ``t00``: mostly background work.
RUNAWAY_ORIGIN_MIX: tuple[float, float, float] = (0.05, 0.35, 0.60)

#: Zipf exponent for the non-runaway tenants: tenant ``t0k`` has weight ``1 / k**s``.
ZIPF_EXPONENT = 1.0

_ORIGINS = (Origin.USER_ACTION, Origin.SCHEDULED, Origin.BATCH_JOB)

_FILLER_WORDS = (
    "queue", "tenant", "request", "token", "worker", "lease", "retry", "batch", "priority",
    "deadline", "fair", "share", "round", "robin", "deficit", "quantum", "backlog", "latency",
    "throughput", "budget", "model", "prompt", "answer", "summary", "report", "invoice", "order",
    "customer", "ticket", "review", "draft", "letter", "table", "column", "index", "vacuum",
    "commit", "replica", "shard", "window", "minute", "second", "hour", "daily", "weekly",
    "status", "update", "result", "context", "message", "the", "a", "of", "and", "to", "in",
    "for", "with", "on", "at", "by", "from", "is", "was",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class PlannedJob:
    """One job of a replay plan, ready for ``enqueue``.

    ``at_seconds`` is when to enqueue it, in seconds after the replay starts (already divided
    by the speed-up). ``sla_seconds`` is ``None`` for ``user_action`` and ``batch_job`` origins.
    ``payload`` holds valid Messages API parameters (``model``, ``max_tokens`` ≥ 1, one user
    message). ``input_tokens`` is the prompt size actually sent (the recorded size, capped by
    ``max_input_tokens``); ``output_tokens`` equals ``payload["max_tokens"]``.
    """

    at_seconds: float
    tenant_id: str
    origin: Origin
    sla_seconds: float | None
    payload: dict[str, Any]
    input_tokens: int
    output_tokens: int


# -------------------------------------------------------------------------------- planning
def plan_replay(
    trace: Sequence[TraceRequest],
    *,
    tenants: int = 8,
    runaway_share: float = 0.4,
    speedup: float = 1.0,
    seed: int = 0,
    model: str = "claude-haiku-4-5",
    max_input_tokens: int | None = None,
) -> list[PlannedJob]:
    """Map each trace request onto a tenant, origin and SLA; one :class:`PlannedJob` each.

    The mapping is a pure function of the arguments (a ``random.Random(seed)``, drawn in trace
    order). Tenants are ``t00`` … ``tNN`` (zero-padded to at least two digits). ``t00`` is the
    runaway: each request goes to it with probability ``runaway_share``; the rest are spread
    over ``t01`` … with Zipf weights ``1/k`` (``t01`` busiest). With ``tenants=1`` every request
    goes to ``t00``. Origins: an ordinary tenant sends 20 % ``user_action`` (critical),
    50 % ``scheduled`` with an SLA drawn from 60, 300 and 3600 seconds (standard) and 30 %
    ``batch_job`` with no SLA (batch); the runaway sends 5 % / 35 % / 60 %.

    ``at_seconds = offset_seconds / speedup``. The prompt is deterministic filler text of
    ``4 × input_tokens`` characters (at least 4), where ``input_tokens`` is the recorded count
    capped by ``max_input_tokens`` tokens; ``max_tokens`` is the recorded output tokens (at
    least 1). Order follows ``trace``.

    Raises :class:`~pgqueue.errors.InvalidArgument` when ``tenants < 1``, ``runaway_share`` is
    outside [0, 1), ``speedup <= 0`` (or not finite), ``max_input_tokens < 1``, ``model`` is
    empty, or a trace request has a negative or non-finite offset or negative token counts.
    """
    if isinstance(tenants, bool) or not isinstance(tenants, int) or tenants < 1:
        raise InvalidArgument(f"tenants must be an integer >= 1, got {tenants!r}")
    if not is_real(runaway_share) or not 0.0 <= runaway_share < 1.0:
        raise InvalidArgument(f"runaway_share must be in [0, 1), got {runaway_share!r}")
    if not is_real(speedup) or not (math.isfinite(speedup) and speedup > 0):
        raise InvalidArgument(f"speedup must be a finite number > 0, got {speedup!r}")
    if max_input_tokens is not None and (
        isinstance(max_input_tokens, bool)
        or not isinstance(max_input_tokens, int)
        or max_input_tokens < 1
    ):
        raise InvalidArgument(
            f"max_input_tokens must be an integer >= 1 or None, got {max_input_tokens!r}"
        )
    if not isinstance(model, str) or not model.strip():
        raise InvalidArgument(f"model must be a non-empty string, got {model!r}")
    for index, request in enumerate(trace):
        if not (math.isfinite(request.offset_seconds) and request.offset_seconds >= 0):
            raise InvalidArgument(
                f"trace[{index}].offset_seconds must be finite and >= 0, "
                f"got {request.offset_seconds!r}"
            )
        if request.input_tokens < 0 or request.output_tokens < 0:
            raise InvalidArgument(f"trace[{index}] has negative token counts: {request!r}")

    rng = random.Random(seed)
    width = max(2, len(str(tenants - 1)))
    names = [f"t{k:0{width}d}" for k in range(tenants)]
    others = names[1:]
    zipf_cum = _cumulative([1.0 / k**ZIPF_EXPONENT for k in range(1, len(others) + 1)])

    def prompt_tokens(request: TraceRequest) -> int:
        tokens = max(1, request.input_tokens)
        return tokens if max_input_tokens is None else min(tokens, max_input_tokens)

    filler = _filler(CHARS_PER_TOKEN * max((prompt_tokens(r) for r in trace), default=1), seed)
    runaway_mix = _cumulative(RUNAWAY_ORIGIN_MIX)
    normal_mix = _cumulative(ORIGIN_MIX)

    plan: list[PlannedJob] = []
    for request in trace:
        # Always draw the same number of values per request so one choice never shifts others.
        u_tenant, u_other, u_origin, u_sla = (rng.random() for _ in range(4))
        if not others or u_tenant < runaway_share:
            tenant, mix = names[0], runaway_mix
        else:
            tenant, mix = others[_pick(zipf_cum, u_other)], normal_mix
        origin = _ORIGINS[_pick(mix, u_origin)]
        sla: float | None = None
        if origin is Origin.SCHEDULED:
            sla = SCHEDULED_SLAS_SECONDS[_pick_uniform(len(SCHEDULED_SLAS_SECONDS), u_sla)]

        input_tokens = prompt_tokens(request)
        output_tokens = max(1, request.output_tokens)
        chars = CHARS_PER_TOKEN * input_tokens
        text = filler[: chars - 1] + "."  # never ends in whitespace
        plan.append(
            PlannedJob(
                at_seconds=request.offset_seconds / speedup,
                tenant_id=tenant,
                origin=origin,
                sla_seconds=sla,
                payload={
                    "model": model,
                    "max_tokens": output_tokens,
                    "messages": [{"role": "user", "content": text}],
                },
                input_tokens=input_tokens,
                output_tokens=output_tokens,
            )
        )
    return plan


def _cumulative(weights: Sequence[float]) -> list[float]:
    total = sum(weights)
    cum: list[float] = []
    running = 0.0
    for weight in weights:
        running += weight
        cum.append(running / total)
    if cum:
        cum[-1] = 1.0
    return cum


def _pick(cumulative: Sequence[float], u: float) -> int:
    """Index of the first cumulative weight above ``u`` (``u`` in [0, 1))."""
    for index, bound in enumerate(cumulative):
        if u < bound:
            return index
    return len(cumulative) - 1


def _pick_uniform(n: int, u: float) -> int:
    return min(int(u * n), n - 1)


def _filler(chars: int, seed: int) -> str:
    """Deterministic filler words, at least ``chars`` characters long."""
    rng = random.Random(f"pgqueue.trace.filler:{seed}")
    words: list[str] = []
    length = 0
    while length < chars:
        word = rng.choice(_FILLER_WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


# ------------------------------------------------------------------------------- summaries
def summarize_plan(plan: Sequence[PlannedJob]) -> dict[str, Any]:
    """Counts and token totals of a plan, for demos and reports.

    Returns ``{"jobs", "duration_seconds", "input_tokens", "output_tokens", "tenants",
    "origins"}``: ``duration_seconds`` is the last ``at_seconds`` (0.0 for an empty plan);
    ``tenants`` maps each tenant id (sorted) to ``{"jobs", "share", "input_tokens",
    "output_tokens", "origins"}`` (``share`` is the fraction of jobs, 0..1); ``origins`` maps
    every origin value to its job count (zero included). Tokens are planned prompt and
    ``max_tokens`` counts. Raises nothing.
    """
    total = len(plan)
    origins = {origin.value: 0 for origin in Origin}
    per_tenant: dict[str, dict[str, Any]] = {}
    for job in plan:
        origins[job.origin.value] += 1
        entry = per_tenant.setdefault(
            job.tenant_id,
            {
                "jobs": 0,
                "share": 0.0,
                "input_tokens": 0,
                "output_tokens": 0,
                "origins": {origin.value: 0 for origin in Origin},
            },
        )
        entry["jobs"] += 1
        entry["input_tokens"] += job.input_tokens
        entry["output_tokens"] += job.output_tokens
        entry["origins"][job.origin.value] += 1
    for entry in per_tenant.values():
        entry["share"] = entry["jobs"] / total
    return {
        "jobs": total,
        "duration_seconds": max((job.at_seconds for job in plan), default=0.0),
        "input_tokens": sum(job.input_tokens for job in plan),
        "output_tokens": sum(job.output_tokens for job in plan),
        "tenants": dict(sorted(per_tenant.items())),
        "origins": origins,
    }
