"""The sandbox's Message Batches API through the real SDK's ``client.messages.batches``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import pytest
from anthropic.types.messages import (
    MessageBatchErroredResult,
    MessageBatchExpiredResult,
    MessageBatchSucceededResult,
)

from pgqueue.sandbox import SandboxConfig

from .conftest import Harness

MakeHarness = Callable[..., Harness]


def requests(n: int, start: int = 0, max_tokens: int = 8) -> list[Any]:
    return [
        {
            "custom_id": str(i),
            "params": {
                "model": "claude-sandbox",
                "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": "x" * 40}],  # 10 input tokens
            },
        }
        for i in range(start, start + n)
    ]


def test_a_batch_is_in_progress_then_ends_with_results(make_harness: MakeHarness) -> None:
    h = make_harness(SandboxConfig(batch_processing_seconds=60))
    batch = h.sdk.messages.batches.create(requests=requests(3))
    assert batch.id.startswith("msgbatch_")
    assert batch.processing_status == "in_progress"
    assert batch.request_counts.processing == 3
    assert batch.results_url is None and batch.ended_at is None
    assert (batch.expires_at - batch.created_at).total_seconds() == 24 * 3600

    h.clock.advance(59)
    assert h.sdk.messages.batches.retrieve(batch.id).processing_status == "in_progress"
    h.clock.advance(1)
    ended = h.sdk.messages.batches.retrieve(batch.id)
    assert ended.processing_status == "ended"
    assert ended.ended_at is not None and ended.results_url is not None
    counts = ended.request_counts
    assert (counts.processing, counts.succeeded, counts.errored) == (0, 3, 0)

    lines = list(h.sdk.messages.batches.results(batch.id))
    assert sorted(line.custom_id for line in lines) == ["0", "1", "2"]
    for line in lines:
        assert isinstance(line.result, MessageBatchSucceededResult)
        usage = line.result.message.usage
        assert (usage.input_tokens, usage.output_tokens) == (10, 8)


def test_batches_do_not_use_the_messages_rate_limits(make_harness: MakeHarness) -> None:
    h = make_harness(SandboxConfig(requests_per_minute=1))
    batch = h.sdk.messages.batches.create(requests=requests(50))
    assert h.sdk.messages.batches.retrieve(batch.id).request_counts.succeeded == 50
    assert h.create().usage.input_tokens == 2  # the one request a minute is still there


def test_fault_mode_errors_then_expires_the_next_requests(make_harness: MakeHarness) -> None:
    h = make_harness()
    assert h.http.post("/_sandbox/batches/faults", json={"errored": 2, "expired": 1}).json() == {
        "pending": 3
    }
    batch = h.sdk.messages.batches.create(requests=requests(5))
    counts = h.sdk.messages.batches.retrieve(batch.id).request_counts
    assert (counts.succeeded, counts.errored, counts.expired) == (2, 2, 1)
    by_id = {line.custom_id: line.result for line in h.sdk.messages.batches.results(batch.id)}
    assert isinstance(by_id["0"], MessageBatchErroredResult)
    assert by_id["0"].error.error.type == "api_error"
    assert isinstance(by_id["1"], MessageBatchErroredResult)
    assert isinstance(by_id["2"], MessageBatchExpiredResult)
    assert isinstance(by_id["3"], MessageBatchSucceededResult)


def test_invalid_params_end_errored_not_the_whole_batch(make_harness: MakeHarness) -> None:
    h = make_harness()
    bad: list[Any] = [{"custom_id": "bad", "params": {"model": "m", "messages": []}}]
    batch = h.sdk.messages.batches.create(requests=requests(1) + bad)
    by_id = {line.custom_id: line.result for line in h.sdk.messages.batches.results(batch.id)}
    assert isinstance(by_id["bad"], MessageBatchErroredResult)
    assert by_id["bad"].error.error.type == "invalid_request_error"
    assert isinstance(by_id["0"], MessageBatchSucceededResult)


def test_cancel_ends_every_request_canceled(make_harness: MakeHarness) -> None:
    h = make_harness(SandboxConfig(batch_processing_seconds=60))
    batch = h.sdk.messages.batches.create(requests=requests(4))
    canceling = h.sdk.messages.batches.cancel(batch.id)
    assert canceling.processing_status == "canceling"
    assert canceling.cancel_initiated_at is not None
    ended = h.sdk.messages.batches.retrieve(batch.id)
    assert ended.processing_status == "ended"
    assert ended.request_counts.canceled == 4
    kinds = {line.result.type for line in h.sdk.messages.batches.results(batch.id)}
    assert kinds == {"canceled"}


def test_cancel_after_the_end_changes_nothing(make_harness: MakeHarness) -> None:
    h = make_harness()
    batch = h.sdk.messages.batches.create(requests=requests(2))
    after = h.sdk.messages.batches.cancel(batch.id)
    assert after.processing_status == "ended"
    assert after.cancel_initiated_at is None
    assert after.request_counts.succeeded == 2


def test_list_pages_newest_first(make_harness: MakeHarness) -> None:
    h = make_harness()
    made = [h.sdk.messages.batches.create(requests=requests(1, i)).id for i in range(5)]
    page = h.sdk.messages.batches.list(limit=2)
    assert [b.id for b in page.data] == [made[4], made[3]]
    assert page.has_more
    every = [b.id for b in h.sdk.messages.batches.list(limit=2)]  # auto-pagination
    assert every == list(reversed(made))


def test_submissions_are_counted_per_custom_id(make_harness: MakeHarness) -> None:
    h = make_harness()
    h.sdk.messages.batches.create(requests=requests(3))
    h.sdk.messages.batches.create(requests=requests(2, start=2))
    stats = h.http.get("/_sandbox/batches/stats").json()
    assert stats["batches"] == 2
    assert stats["requests"] == 5
    assert stats["max_submissions_per_custom_id"] == 2
    assert stats["duplicates"] == ["2"]
    h.http.post("/_sandbox/reset")
    assert h.http.get("/_sandbox/batches/stats").json()["requests"] == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"requests": []}, "requests: must hold 1 to 100000"),
        ({"requests": [{"custom_id": "a b", "params": {}}]}, "custom_id"),
        ({"requests": requests(1) + requests(1)}, "not unique"),
    ],
)
def test_a_bad_create_is_a_400(make_harness: MakeHarness, body: Any, message: str) -> None:
    h = make_harness()
    with pytest.raises(anthropic.BadRequestError, match=message):
        h.sdk.messages.batches.create(**body)
    assert h.http.get("/_sandbox/batches/stats").json()["requests"] == 0


def test_unknown_batch_is_a_404_and_results_wait_for_the_end(make_harness: MakeHarness) -> None:
    h = make_harness(SandboxConfig(batch_processing_seconds=5))
    with pytest.raises(anthropic.NotFoundError):
        h.sdk.messages.batches.retrieve("msgbatch_nope")
    batch = h.sdk.messages.batches.create(requests=requests(1))
    with pytest.raises(anthropic.AnthropicError, match="finished processing"):
        h.sdk.messages.batches.results(batch.id)
    assert (
        h.http.get(
            f"/v1/messages/batches/{batch.id}/results", headers={"x-api-key": "k"}
        ).status_code
        == 400
    )


def test_batches_need_auth_and_a_request_list(make_harness: MakeHarness) -> None:
    h = make_harness()
    made = h.http.post("/v1/messages/batches", json={}, headers={"x-api-key": "k"})
    assert made.status_code == 400
    assert "requests: field required" in made.text
    assert h.http.get("/v1/messages/batches").status_code == 401
    assert h.http.post("/v1/messages/batches", json={"requests": requests(1)}).status_code == 401


def test_fault_mode_refuses_the_next_create(make_harness: MakeHarness) -> None:
    h = make_harness()
    assert h.http.post("/_sandbox/batches/faults", json={"refused": 1}).json() == {"pending": 1}
    with pytest.raises(anthropic.BadRequestError, match="refusal"):
        h.sdk.messages.batches.create(requests=requests(2))
    assert h.sdk.messages.batches.create(requests=requests(2)).request_counts.succeeded == 2
    assert h.http.get("/_sandbox/batches/stats").json()["requests"] == 2
    bad = h.http.post("/_sandbox/batches/faults", json={"refused": -1})
    assert bad.status_code == 400
