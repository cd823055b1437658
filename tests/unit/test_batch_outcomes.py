"""What each Message Batch result does to its job (pgqueue.batches.outcomes), pure."""

from __future__ import annotations

from typing import Any

import pytest

from pgqueue.batches.outcomes import Tally, cost_saved_usd, finish


def line(result: dict[str, Any], custom_id: str = "42") -> dict[str, Any]:
    return {"custom_id": custom_id, "result": result}


def errored(error_type: str) -> dict[str, Any]:
    return {
        "type": "errored",
        "error": {"type": "error", "error": {"type": error_type, "message": "m"}},
    }


def test_succeeded_carries_the_message_and_its_usage() -> None:
    message = {"id": "msg_1", "usage": {"input_tokens": 12, "output_tokens": 8}}
    f = finish(line({"type": "succeeded", "message": message}), "messages")
    assert (f.job_id, f.outcome, f.action) == (42, "succeeded", "succeed")
    assert (f.result, f.input_tokens, f.output_tokens) == (message, 12, 8)


@pytest.mark.parametrize(
    ("error_type", "action"),
    [
        ("api_error", "retry"),
        ("overloaded_error", "retry"),
        ("rate_limit_error", "retry"),
        ("invalid_request_error", "fail"),
        ("permission_error", "fail"),
    ],
)
def test_errored_retries_only_what_is_worth_another_try(error_type: str, action: str) -> None:
    f = finish(line(errored(error_type)), "messages")
    assert (f.outcome, f.action) == ("errored", action)
    assert f.error is not None and error_type in f.error


def test_expired_follows_the_setting_and_canceled_cancels() -> None:
    assert finish(line({"type": "expired"}), "messages").action == "requeue"
    failed = finish(line({"type": "expired"}), "failed")
    assert (failed.action, failed.error) == ("fail", "batch request expired")
    assert finish(line({"type": "canceled"}), "failed").action == "cancel"


@pytest.mark.parametrize(
    "bad", [line({"type": "expired"}, custom_id="job-1"), line({"type": "weird"})]
)
def test_a_foreign_custom_id_or_result_type_is_a_clear_error(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"custom_id|result type"):
        finish(bad, "messages")


def test_tally_counts_types_and_tokens_of_successes() -> None:
    tally = Tally()
    ok = {"type": "succeeded", "message": {"usage": {"input_tokens": 3, "output_tokens": 2}}}
    for result in (ok, ok, {"type": "expired"}, errored("api_error")):
        tally.add(finish(line(result), "messages"))
    assert tally.counts == {"succeeded": 2, "errored": 1, "expired": 1, "canceled": 0}
    assert (tally.input_tokens, tally.output_tokens) == (6, 4)


def test_cost_saved_is_the_discount_of_the_messages_price() -> None:
    # 1M input tokens at $3 and 200k output tokens at $15 cost $6; half of it is saved
    saved = cost_saved_usd(
        1_000_000, 200_000, input_usd_per_mtok=3.0, output_usd_per_mtok=15.0, discount=0.5
    )
    assert saved == pytest.approx(3.0)
    assert cost_saved_usd(0, 0, input_usd_per_mtok=3, output_usd_per_mtok=15, discount=0.5) == 0
