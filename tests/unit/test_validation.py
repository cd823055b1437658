"""Empty text content at the enqueue boundary (found by a tester: ``content: ""`` was queued
from Python and SQL, the CLI refused it, and the provider answered 400)."""

from __future__ import annotations

from typing import Any

import pytest

from pgqueue.errors import InvalidPayload
from pgqueue.sandbox.messages import validation_error
from pgqueue.validation import check_job, messages_payload_ok

HI = {"role": "user", "content": "hi"}

REFUSED: list[tuple[list[Any], int]] = [
    ([{"role": "user", "content": ""}], 0),
    ([{"role": "user", "content": " \t\n\u3000"}], 0),
    ([{"role": "user", "content": []}], 0),
    (
        [
            HI,
            {
                "role": "user",
                "content": [{"type": "text", "text": "ok"}, {"type": "text", "text": ""}],
            },
        ],
        1,
    ),
    ([HI, {"role": "user", "content": [{"type": "text", "text": "\u2028 "}]}], 1),
    ([{"role": "assistant", "content": ""}, HI], 0),  # an empty assistant message, not final
    ([HI, {"role": "assistant", "content": " "}], 1),  # a blank final one is no prefill
    ([HI, {"role": "assistant", "content": [{"type": "text", "text": ""}]}], 1),
]


def _payload(messages: list[Any]) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 5, "messages": messages}


@pytest.mark.parametrize(("messages", "index"), REFUSED)
def test_empty_or_white_space_text_is_refused_naming_the_message(messages, index):
    payload = _payload(messages)
    message = f"payload.messages[{index}]: text content must not be empty or white space"
    with pytest.raises(InvalidPayload, match=message.replace("[", r"\[")):
        check_job(tenant_id="acme", origin="scheduled", payload=payload)
    assert not messages_payload_ok(payload)  # the batch's fast path agrees
    assert validation_error(payload, need_max_tokens=True) is not None  # and the sandbox


ACCEPTED: list[list[Any]] = [
    [HI],
    [HI, {"role": "assistant", "content": ""}],  # a prefill
    [HI, {"role": "assistant", "content": []}],
    [{"role": "user", "content": " a "}],
    [{"role": "user", "content": [{"type": "image", "source": {}}, {"type": "text", "text": "x"}]}],
    [{"role": "user", "content": [{"type": "tool_result", "content": ""}]}],  # not a text block
    [{"role": "user", "content": "\u200b"}],  # a zero-width space is not str.isspace()
    [{"role": "user", "content": [{"type": "text"}]}],  # no text: left to the provider
]


@pytest.mark.parametrize("messages", ACCEPTED)
def test_other_content_is_accepted(messages):
    payload = _payload(messages)
    check_job(tenant_id="acme", origin="scheduled", payload=payload)
    assert messages_payload_ok(payload)
    assert validation_error(payload, need_max_tokens=True) is None


def test_other_kinds_are_left_alone():
    payload = _payload([{"role": "user", "content": ""}])
    check_job(tenant_id="acme", origin="scheduled", payload=payload, kind="custom")
