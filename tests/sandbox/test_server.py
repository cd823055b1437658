"""running_sandbox: a real uvicorn server on a free port, used by the real anthropic SDK."""

from __future__ import annotations

import anthropic
import httpx2
import pytest

from pgqueue.sandbox import SandboxConfig, running_sandbox

from .conftest import FakeClock


def test_sdk_round_trip_over_tcp() -> None:
    with running_sandbox() as base_url:
        assert base_url.startswith("http://127.0.0.1:")
        with anthropic.Anthropic(base_url=base_url, api_key="sandbox-key", max_retries=0) as sdk:
            msg = sdk.messages.create(
                model="claude-sandbox",
                max_tokens=16,
                system="be brief",
                messages=[{"role": "user", "content": "hello there"}],
            )
        assert msg.usage.input_tokens == 5  # ceil((8 + 11) / 4)
        assert msg.usage.output_tokens == 16
        stats = httpx2.get(f"{base_url}/_sandbox/stats").json()
        assert (stats["requests"], stats["ok"], stats["output_tokens"]) == (1, 1, 16)


def test_base_url_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with running_sandbox() as base_url:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
        with anthropic.Anthropic(api_key="sandbox-key", max_retries=0) as sdk:
            msg = sdk.messages.create(
                model="m", max_tokens=2, messages=[{"role": "user", "content": "x"}]
            )
        assert msg.usage.output_tokens == 2


def test_rate_limit_over_tcp_with_fake_clock() -> None:
    clock = FakeClock()
    with (
        running_sandbox(SandboxConfig(requests_per_minute=2), clock=clock, wall_clock=clock) as url,
        anthropic.Anthropic(base_url=url, api_key="sandbox-key", max_retries=0) as sdk,
    ):
        for _ in range(2):
            sdk.messages.create(
                model="m", max_tokens=1, messages=[{"role": "user", "content": "x"}]
            )
        with pytest.raises(anthropic.RateLimitError) as info:
            sdk.messages.create(
                model="m", max_tokens=1, messages=[{"role": "user", "content": "x"}]
            )
        headers = info.value.response.headers
        assert headers["retry-after"] == "30"
        assert headers["anthropic-ratelimit-requests-remaining"] == "0"
        clock.advance(30.0)
        sdk.messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "x"}])


def test_sdk_retries_scripted_429s_honouring_retry_after_ms() -> None:
    """The SDK's own retry loop follows the sandbox's retry-after-ms (10 ms, no long sleeps)."""
    with running_sandbox() as url:
        script = {"status": 429, "count": 2, "retry_after": None, "retry_after_ms": "10"}
        assert httpx2.post(f"{url}/_sandbox/script", json=script).status_code == 200
        with anthropic.Anthropic(base_url=url, api_key="sandbox-key", max_retries=2) as sdk:
            msg = sdk.messages.create(
                model="m", max_tokens=3, messages=[{"role": "user", "content": "x"}]
            )
        assert msg.usage.output_tokens == 3
        stats = httpx2.get(f"{url}/_sandbox/stats").json()
        assert (stats["requests"], stats["429"], stats["ok"]) == (3, 2, 1)


def test_server_stops_on_exit() -> None:
    with running_sandbox() as url:
        assert httpx2.get(f"{url}/_sandbox/stats").status_code == 200
    with pytest.raises(httpx2.TransportError):
        httpx2.get(f"{url}/_sandbox/stats", timeout=1.0)


def test_two_sandboxes_get_distinct_ports() -> None:
    with running_sandbox() as a, running_sandbox() as b:
        assert a != b
