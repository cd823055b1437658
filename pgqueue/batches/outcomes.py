"""What each Message Batch result does to its job, and what the lane saved. Pure: no I/O.

Policy (docs/batches.md):
- ``succeeded``: the job succeeds with the message as its result and its usage recorded;
- ``errored``: the usual retry policy, as for the Messages API: a retryable error type
  (``api_error``, ``overloaded_error``, ``rate_limit_error``, ``timeout_error``) goes back to
  the queue after a backoff, any other (``invalid_request_error``...) fails the job at once;
- ``expired``: back to the queue for the Messages API lane (setting ``batches_expired`` =
  ``messages``; the job never goes to a batch again), or failed (``failed``);
- ``canceled``: the job is cancelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

#: Error types of an errored batch request that are worth another try.
RETRYABLE_ERRORS = frozenset({"api_error", "overloaded_error", "rate_limit_error", "timeout_error"})


@dataclass(frozen=True)
class Finish:
    """One job's fate from its result line.

    Attributes:
        job_id: the job (the request's ``custom_id``).
        outcome: the result type.
        action: ``succeed``, ``retry`` (back to the queue after a backoff; failed once its
            attempts are spent), ``fail`` (at once), ``requeue`` (due now, for the Messages
            API lane; failed once its attempts are spent) or ``cancel``.
        result: the message JSON (succeed only).
        input_tokens / output_tokens: usage (succeed only).
        error: what ``last_error`` says (every action but succeed).
    """

    job_id: int
    outcome: Literal["succeeded", "errored", "expired", "canceled"]
    action: Literal["succeed", "retry", "fail", "requeue", "cancel"]
    result: dict[str, Any] | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None


def finish(line: dict[str, Any], expired_policy: Literal["messages", "failed"]) -> Finish:
    """The :class:`Finish` of one results line (``MessageBatchIndividualResponse`` as JSON:
    ``{"custom_id": "<job id>", "result": {"type": ..., ...}}``).

    Raises:
        ValueError: a ``custom_id`` that is not a job id, or an unknown result type.
    """
    custom_id = str(line.get("custom_id"))
    if not custom_id.isdigit():
        raise ValueError(f"custom_id {custom_id!r} is not a job id")
    job_id = int(custom_id)
    result = line.get("result") or {}
    kind = result.get("type")
    if kind == "succeeded":
        message = result["message"]
        usage = message.get("usage") or {}
        return Finish(
            job_id,
            "succeeded",
            "succeed",
            result=message,
            input_tokens=int(usage.get("input_tokens") or 0),
            output_tokens=int(usage.get("output_tokens") or 0),
        )
    if kind == "errored":
        error = (result.get("error") or {}).get("error") or {}
        error_type = str(error.get("type", "api_error"))
        text = f"batch request errored: {error_type}: {error.get('message', '')}"[:2000]
        action: Literal["retry", "fail"] = "retry" if error_type in RETRYABLE_ERRORS else "fail"
        return Finish(job_id, "errored", action, error=text)
    if kind == "expired":
        if expired_policy == "messages":
            return Finish(job_id, "expired", "requeue", error="batch request expired; sent alone")
        return Finish(job_id, "expired", "fail", error="batch request expired")
    if kind == "canceled":
        return Finish(job_id, "canceled", "cancel", error="batch canceled")
    raise ValueError(f"unknown batch result type {kind!r}")


@dataclass
class Tally:
    """Counts by result type and the usage of succeeded requests of one batch."""

    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("succeeded", "errored", "expired", "canceled"), 0)
    )
    input_tokens: int = 0
    output_tokens: int = 0

    def add(self, f: Finish) -> None:
        """Count ``f``."""
        self.counts[f.outcome] += 1
        self.input_tokens += f.input_tokens
        self.output_tokens += f.output_tokens


def cost_saved_usd(
    input_tokens: int,
    output_tokens: int,
    *,
    input_usd_per_mtok: float,
    output_usd_per_mtok: float,
    discount: float,
) -> float:
    """Dollars saved by sending these tokens through the Batches API instead of the Messages
    API: ``discount × (input × input price + output × output price) / 1e6`` (prices in USD
    per million tokens; Anthropic's batch discount is 50 %)."""
    full = (input_tokens * input_usd_per_mtok + output_tokens * output_usd_per_mtok) / 1e6
    return discount * full
