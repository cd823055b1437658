"""The sandbox app in-process (starlette TestClient) with the real anthropic SDK on top."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime

import anthropic
import pytest

from pgqueue.sandbox import SandboxConfig
from pgqueue.sandbox.app import count_input_tokens, filler_text, rfc3339

from .conftest import Harness

MakeHarness = Callable[..., Harness]

RATELIMIT_HEADERS = [
    f"anthropic-ratelimit-{kind}-{field}"
    for kind in ("requests", "input-tokens", "output-tokens", "tokens")
    for field in ("limit", "remaining", "reset")
]

VALID = {
    "model": "claude-sandbox",
    "max_tokens": 5,
    "messages": [{"role": "user", "content": "hi"}],
}
AUTH = {"x-api-key": "sandbox-key"}


def test_sdk_gets_a_valid_message_with_usage(make_harness: MakeHarness) -> None:
    h = make_harness()
    content = "x" * 41  # ceil(41 / 4) = 11 input tokens
    msg = h.create(content, max_tokens=7)
    assert isinstance(msg, anthropic.types.Message)
    assert msg.id.startswith("msg_")
    assert (msg.type, msg.role, msg.model) == ("message", "assistant", "claude-sandbox")
    assert msg.usage.input_tokens == 11
    assert msg.usage.output_tokens == 7
    assert msg.stop_reason == "max_tokens"
    assert msg.stop_sequence is None
    block = msg.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    assert math.ceil(len(block.text) / 4) == 7


def test_response_carries_request_id_and_ratelimit_headers(make_harness: MakeHarness) -> None:
    h = make_harness(SandboxConfig(requests_per_minute=60, output_tokens_per_minute=600))
    raw = h.sdk.messages.with_raw_response.create(
        model="m", max_tokens=60, messages=[{"role": "user", "content": "abcd"}]
    )
    headers = raw.headers
    assert headers["request-id"]
    for name in RATELIMIT_HEADERS:
        assert name in headers, name
    assert headers["anthropic-ratelimit-requests-limit"] == "60"
    assert headers["anthropic-ratelimit-requests-remaining"] == "59"
    assert headers["anthropic-ratelimit-input-tokens-remaining"] == str(40_000 - 1)
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == "540"
    # requests bucket refills 1/s, so it is full again 1 s later (RFC 3339, UTC).
    reset = datetime.fromisoformat(headers["anthropic-ratelimit-requests-reset"])
    assert reset.utcoffset() is not None
    assert headers["anthropic-ratelimit-requests-reset"] == rfc3339(h.clock() + 1.0)
    assert headers["anthropic-ratelimit-output-tokens-reset"] == rfc3339(h.clock() + 6.0)


def test_system_and_block_contents_are_counted() -> None:
    body = {
        "system": [{"type": "text", "text": "abcd"}, {"type": "text", "text": "ef"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "1234"}]},
            {"role": "assistant", "content": "12"},
        ],
    }
    assert count_input_tokens(body) == math.ceil(12 / 4)
    assert count_input_tokens({"system": "abcde", "messages": []}) == 2
    assert len(filler_text(9)) == 36


def test_output_ratio_shortens_answers_and_ends_turn(make_harness: MakeHarness) -> None:
    h = make_harness(SandboxConfig(output_ratio=0.25))
    msg = h.create(max_tokens=10)
    assert msg.usage.output_tokens == 3  # ceil(10 * 0.25)
    assert msg.stop_reason == "end_turn"
    assert h.create(max_tokens=1).usage.output_tokens == 1


def test_burst_then_429_with_retry_after_and_headers(make_harness: MakeHarness) -> None:
    h = make_harness(SandboxConfig(requests_per_minute=3))
    for _ in range(3):
        h.create()
    with pytest.raises(anthropic.RateLimitError) as info:
        h.create()
    err = info.value
    assert err.status_code == 429
    assert err.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": err.body["error"]["message"]},  # type: ignore[index]
    }
    # 3 per minute refills one request every 20 s.
    assert err.response.headers["retry-after"] == "20"
    for name in RATELIMIT_HEADERS:
        assert name in err.response.headers, name
    assert err.response.headers["anthropic-ratelimit-requests-remaining"] == "0"

    h.clock.advance(19.0)
    with pytest.raises(anthropic.RateLimitError) as info:
        h.create()
    assert info.value.response.headers["retry-after"] == "1"  # ceil of the 1.0 s left
    h.clock.advance(1.0)
    assert h.create().usage.output_tokens == 10


def test_output_tokens_limit_charges_max_tokens_and_refunds(make_harness: MakeHarness) -> None:
    h = make_harness(SandboxConfig(output_tokens_per_minute=600, output_ratio=0.1))
    h.create(max_tokens=500)  # charged 500, used 50: 600 - 500 + 450 = 550 left
    h.create(max_tokens=500)  # charged 500, used 50: 550 - 500 + 450 = 500 left
    with pytest.raises(anthropic.RateLimitError) as info:
        h.create(max_tokens=550)  # needs 550, has 500 -> 50 short at 10/s = 5 s
    assert info.value.response.headers["retry-after"] == "5"
    assert info.value.response.headers["anthropic-ratelimit-output-tokens-remaining"] == "500"
    assert h.create(max_tokens=500).usage.output_tokens == 50


def test_input_tokens_limit_refuses_large_prompts(make_harness: MakeHarness) -> None:
    h = make_harness(SandboxConfig(input_tokens_per_minute=100))
    h.create("x" * 360)  # 90 tokens
    with pytest.raises(anthropic.RateLimitError) as info:
        h.create("x" * 80)  # 20 tokens, 10 available -> 10 short at 100/60 per s = 6 s
    assert info.value.response.headers["retry-after"] == "6"


def test_overload_529_reaches_sdk_as_status_529(make_harness: MakeHarness) -> None:
    h = make_harness(SandboxConfig(overload_rate=1.0))
    with pytest.raises(anthropic.APIStatusError) as info:
        h.create()
    assert info.value.status_code == 529
    assert isinstance(info.value, anthropic.InternalServerError)
    assert info.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert h.stats()["529"] == 1
    # an overloaded answer costs no rate-limit budget
    assert info.value.response.headers["anthropic-ratelimit-requests-remaining"] == "50"


def outcomes(h: Harness, n: int) -> list[int]:
    return [h.http.post("/v1/messages", json=VALID, headers=AUTH).status_code for _ in range(n)]


def test_overload_draws_are_seeded(make_harness: MakeHarness) -> None:
    config = SandboxConfig(overload_rate=0.5, seed=7)
    first = outcomes(make_harness(config), 30)
    second = outcomes(make_harness(config), 30)
    assert first == second
    assert set(first) == {200, 529}


def test_bearer_auth_is_accepted(make_harness: MakeHarness) -> None:
    h = make_harness()
    sdk = anthropic.Anthropic(
        base_url="http://sandbox.test",
        auth_token="sandbox-token",
        max_retries=0,
        http_client=h.http,
    )
    assert sdk.messages.create(**VALID).usage.output_tokens == 5  # type: ignore[call-overload]
    resp = h.http.post("/v1/messages", json=VALID, headers={"authorization": "Bearer t"})
    assert resp.status_code == 200


@pytest.mark.parametrize(
    "headers",
    [{}, {"x-api-key": ""}, {"authorization": "Bearer "}, {"authorization": "Basic abc"}],
)
def test_missing_auth_is_401(make_harness: MakeHarness, headers: dict[str, str]) -> None:
    h = make_harness()
    resp = h.http.post("/v1/messages", json=VALID, headers=headers)
    assert resp.status_code == 401
    assert resp.json()["type"] == "error"
    assert resp.json()["error"]["type"] == "authentication_error"
    assert h.stats()["4xx"] == 1


@pytest.mark.parametrize(
    "body",
    [
        {k: v for k, v in VALID.items() if k != "model"},
        {**VALID, "model": 3},
        {k: v for k, v in VALID.items() if k != "max_tokens"},
        {**VALID, "max_tokens": 0},
        {**VALID, "max_tokens": "5"},
        {**VALID, "max_tokens": True},
        {**VALID, "messages": []},
        {**VALID, "messages": "hi"},
        {**VALID, "messages": [{"role": "system", "content": "x"}]},
        {**VALID, "messages": [{"role": "user"}]},
        # empty content, as the real API refuses it (found by a tester: answered 200)
        {**VALID, "messages": [{"role": "user", "content": ""}]},
        {**VALID, "messages": [{"role": "user", "content": []}]},
        {**VALID, "messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
        # white-space text, as the real API refuses it (and pgqueue's enqueue now does)
        {**VALID, "messages": [{"role": "user", "content": " \n"}]},
        {**VALID, "messages": [{"role": "user", "content": [{"type": "text", "text": "\t"}]}]},
        {**VALID, "system": 5},
        {**VALID, "stream": True},
        [1, 2],
    ],
)
def test_invalid_payload_is_400(make_harness: MakeHarness, body: object) -> None:
    h = make_harness()
    resp = h.http.post("/v1/messages", json=body, headers=AUTH)
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert resp.json()["error"]["message"]


def test_an_empty_final_assistant_message_is_a_prefill(make_harness: MakeHarness) -> None:
    """The API takes an empty final assistant message (the one exception to non-empty content);
    any model name is taken, as before."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]
    body = {**VALID, "model": "any-model-name", "messages": messages}
    resp = make_harness().http.post("/v1/messages", json=body, headers=AUTH)
    assert resp.status_code == 200


def test_non_json_body_is_400(make_harness: MakeHarness) -> None:
    h = make_harness()
    resp = h.http.post("/v1/messages", content=b"{nope", headers=AUTH)
    assert resp.status_code == 400


def test_sdk_raises_bad_request_for_invalid_payload(make_harness: MakeHarness) -> None:
    h = make_harness()
    with pytest.raises(anthropic.BadRequestError):
        h.create(max_tokens=0)


def test_config_scripted_faults_answer_the_first_n(make_harness: MakeHarness) -> None:
    h = make_harness(SandboxConfig(fail_first_n=2, fail_status=429, fail_retry_after="1"))
    for _ in range(2):
        with pytest.raises(anthropic.RateLimitError) as info:
            h.create()
        assert info.value.response.headers["retry-after"] == "1"
        assert "anthropic-ratelimit-requests-limit" in info.value.response.headers
    assert h.create().usage.output_tokens == 10
    stats = h.stats()
    assert (stats["requests"], stats["429"], stats["ok"]) == (3, 2, 1)


@pytest.mark.parametrize(("status", "error_type"), [(529, "overloaded_error"), (500, "api_error")])
def test_config_scripted_server_errors(
    make_harness: MakeHarness, status: int, error_type: str
) -> None:
    h = make_harness(SandboxConfig(fail_first_n=1, fail_status=status))
    with pytest.raises(anthropic.InternalServerError) as info:
        h.create()
    assert info.value.status_code == status
    assert info.value.body["error"]["type"] == error_type  # type: ignore[index]
    assert "retry-after" not in info.value.response.headers
    h.create()


def test_scripted_faults_do_not_consume_invalid_requests(make_harness: MakeHarness) -> None:
    h = make_harness(SandboxConfig(fail_first_n=1, fail_status=529))
    assert h.http.post("/v1/messages", json={}, headers=AUTH).status_code == 400
    assert h.http.post("/v1/messages", json=VALID, headers=AUTH).status_code == 529
    assert h.http.post("/v1/messages", json=VALID, headers=AUTH).status_code == 200


def test_admin_script_queues_the_next_responses(make_harness: MakeHarness) -> None:
    h = make_harness()
    resp = h.http.post(
        "/_sandbox/script",
        json={"status": 429, "count": 2, "retry_after": "1", "retry_after_ms": None},
    )
    assert resp.json() == {"queued": 2, "pending": 2}
    resp = h.http.post("/_sandbox/script", json={"status": 529, "count": 1, "retry_after_ms": 250})
    assert resp.json() == {"queued": 1, "pending": 3}

    answers = [h.http.post("/v1/messages", json=VALID, headers=AUTH) for _ in range(4)]
    assert [a.status_code for a in answers] == [429, 429, 529, 200]
    assert answers[0].headers["retry-after"] == "1"
    assert "retry-after-ms" not in answers[0].headers
    assert answers[2].headers["retry-after-ms"] == "250"
    assert "retry-after" not in answers[2].headers
    assert h.stats()["pending_faults"] == 0


@pytest.mark.parametrize(
    "body",
    [
        {"status": 200, "count": 1},
        {"status": 429, "count": -1},
        {"status": "429"},
        {"status": 429, "retry_after": ["1"]},
        [1],
    ],
)
def test_admin_script_rejects_bad_input(make_harness: MakeHarness, body: object) -> None:
    h = make_harness()
    resp = h.http.post("/_sandbox/script", json=body)
    assert resp.status_code == 400
    assert h.stats()["pending_faults"] == 0


def test_stats_count_every_outcome(make_harness: MakeHarness) -> None:
    h = make_harness(SandboxConfig(requests_per_minute=2, fail_first_n=1, fail_status=503))
    outcomes = [
        h.http.post("/v1/messages", json=VALID, headers={}).status_code,  # 401
        h.http.post("/v1/messages", json=VALID, headers=AUTH).status_code,  # scripted 503
        h.http.post("/v1/messages", json=VALID, headers=AUTH).status_code,  # ok
        h.http.post("/v1/messages", json=VALID, headers=AUTH).status_code,  # ok
        h.http.post("/v1/messages", json=VALID, headers=AUTH).status_code,  # 429
    ]
    h.http.post("/_sandbox/script", json={"status": 529, "count": 1})
    outcomes.append(h.http.post("/v1/messages", json=VALID, headers=AUTH).status_code)
    assert outcomes == [401, 503, 200, 200, 429, 529]
    stats = h.stats()
    assert {k: stats[k] for k in ("requests", "ok", "4xx", "429", "529", "5xx")} == {
        "requests": 6,
        "ok": 2,
        "4xx": 1,
        "429": 1,
        "529": 1,
        "5xx": 1,
    }
    assert (stats["input_tokens"], stats["output_tokens"]) == (2, 10)  # "hi" = 1 token each
    assert stats["admitted_at"] == [h.clock(), h.clock()]


def test_stats_keep_only_the_last_ten_minutes_of_admissions(make_harness: MakeHarness) -> None:
    h = make_harness()
    h.create()
    first = h.clock()
    h.clock.advance(300.0)
    h.create()
    assert h.stats()["admitted_at"] == [first, first + 300.0]
    h.clock.advance(301.0)
    assert h.stats()["admitted_at"] == [first + 300.0]


def test_reset_restores_buckets_stats_and_config_faults(make_harness: MakeHarness) -> None:
    h = make_harness(SandboxConfig(requests_per_minute=1, fail_first_n=1, fail_status=500))
    assert outcomes(h, 3) == [500, 200, 429]
    h.http.post("/_sandbox/script", json={"status": 529, "count": 5})
    assert h.http.post("/_sandbox/reset").status_code == 200
    stats = h.stats()
    assert (stats["requests"], stats["ok"], stats["pending_faults"]) == (0, 0, 1)
    assert stats["admitted_at"] == []
    assert outcomes(h, 3) == [500, 200, 429]


def test_latency_is_output_tokens_times_rate_plus_base(make_harness: MakeHarness) -> None:
    h = make_harness(
        SandboxConfig(seconds_per_output_token=0.01, base_latency_seconds=0.5, output_ratio=0.5)
    )
    h.create(max_tokens=40)  # 20 output tokens
    assert h.sleep.calls == [pytest.approx(0.5 + 20 * 0.01)]
    with pytest.raises(anthropic.BadRequestError):
        h.create(max_tokens=-1)
    assert len(h.sleep.calls) == 1  # errors answer without simulated latency


def test_no_latency_means_no_sleep(make_harness: MakeHarness) -> None:
    h = make_harness()
    h.create()
    assert h.sleep.calls == []


def test_count_tokens_and_models(make_harness: MakeHarness) -> None:
    h = make_harness()
    count = h.sdk.messages.count_tokens(
        model="m", system="abcd", messages=[{"role": "user", "content": "abcdefgh"}]
    )
    assert count.input_tokens == 3
    models = h.sdk.models.list()
    assert [m.id for m in models.data]
    assert h.stats()["requests"] == 0  # neither touches the Messages counters


def test_unknown_route_is_anthropic_style_404(make_harness: MakeHarness) -> None:
    h = make_harness()
    resp = h.http.get("/v1/nope", headers=AUTH)
    assert resp.status_code == 404
    assert resp.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"requests_per_minute": 0},
        {"output_ratio": 0.0},
        {"output_ratio": 1.5},
        {"overload_rate": -0.1},
        {"fail_first_n": -1},
        {"fail_status": 200},
        {"seconds_per_output_token": -1.0},
    ],
)
def test_config_rejects_out_of_range_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SandboxConfig(**kwargs)  # type: ignore[arg-type]
