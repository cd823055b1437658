"""The built-in anthropic.messages handler against the sandbox: every answer maps to an outcome."""

from __future__ import annotations

import asyncio
import json
import random
import urllib.request
from datetime import UTC, datetime

import pytest
from pydantic import SecretStr

from pgqueue.errors import Defer, Discard, RateLimited, RetryLater
from pgqueue.handlers.anthropic import AnthropicMessagesHandler
from pgqueue.models import Deferred, HandlerResult, Job, Succeeded, Throttled, Tier
from pgqueue.sandbox import SandboxConfig, running_sandbox
from pgqueue.settings import Settings
from pgqueue.worker.executor import execute
from pgqueue.worker.runtime import builtin_registry

PAYLOAD = {
    "model": "claude-haiku-4-5",
    "max_tokens": 12,
    "messages": [{"role": "user", "content": "hello there"}],
}


def make_job(payload=PAYLOAD, kind="anthropic.messages", attempts=1) -> Job:
    return Job(
        id=1,
        tenant_id="acme",
        kind=kind,
        priority=Tier.CRITICAL,
        payload=dict(payload),
        cost=1.0,
        attempts=attempts,
        max_attempts=5,
        throttle_retries=0,
        enqueued_at=datetime.now(UTC),
        lease_token="00000000-0000-0000-0000-000000000000",
    )


def settings_for(base_url: str, **kw) -> Settings:
    return Settings(anthropic_base_url=base_url, anthropic_api_key=SecretStr("sandbox-key"), **kw)


async def test_success_returns_message_and_usage():
    with running_sandbox() as url:
        handler = AnthropicMessagesHandler(settings_for(url))
        try:
            result = await handler(make_job())
        finally:
            await handler.aclose()
    assert isinstance(result, HandlerResult)
    assert result.input_tokens and result.input_tokens > 0
    assert result.output_tokens == 12
    assert result.result is not None and result.result["type"] == "message"
    assert any(k.startswith("anthropic-ratelimit-") for k in result.headers)
    assert not any("key" in k or "authorization" in k for k in result.headers)


@pytest.mark.parametrize(
    ("status", "retry_after", "expected"),
    [(429, "2", 2.0), (429, "0.5", 0.5), (529, "3", 3.0), (429, None, None)],  # None: reset
)
async def test_throttles_carry_the_retry_after_hint(status, retry_after, expected):
    config = SandboxConfig(fail_first_n=1, fail_status=status, fail_retry_after=retry_after)
    with running_sandbox(config) as url:
        handler = AnthropicMessagesHandler(settings_for(url))
        try:
            with pytest.raises(RateLimited) as info:
                await handler(make_job())
        finally:
            await handler.aclose()
    assert info.value.status_code == status
    if expected is None:
        # no retry-after: the time until the spent bucket's anthropic-ratelimit-*-reset
        # (issue 32: a reset 30 s away gave a retry after the 1 s default); the sandbox's
        # buckets are full again within a minute
        hint = info.value.retry_after_seconds
        assert hint is not None and 0.0 <= hint <= 60.0
    else:
        assert info.value.retry_after_seconds == expected


async def test_http_date_retry_after():
    with running_sandbox() as url:
        # The SDK's first import (~1.7 s of CPU, more on a loaded machine) happens before the
        # clock starts, not between the date and the answer (it made this test flaky).
        await asyncio.to_thread(AnthropicMessagesHandler(settings_for(url)).load_sdk)
        in_five = datetime.now(UTC).timestamp() + 5
        stamp = datetime.fromtimestamp(in_five, UTC).strftime("%a, %d %b %Y %H:%M:%S GMT")
        body = json.dumps({"status": 429, "count": 1, "retry_after": stamp}).encode()
        request = urllib.request.Request(
            f"{url}/_sandbox/script", data=body, headers={"content-type": "application/json"}
        )
        await asyncio.to_thread(urllib.request.urlopen, request)
        handler = AnthropicMessagesHandler(settings_for(url))
        try:
            with pytest.raises(RateLimited) as info:
                await handler(make_job())
        finally:
            await handler.aclose()
    assert info.value.retry_after_seconds is not None
    assert 3.0 <= info.value.retry_after_seconds <= 5.0


@pytest.mark.parametrize(
    ("status", "error"),
    [(500, RetryLater), (503, RetryLater), (408, RetryLater), (400, Discard), (403, Discard)],
)
async def test_other_statuses(status, error):
    with running_sandbox(SandboxConfig(fail_first_n=1, fail_status=status)) as url:
        handler = AnthropicMessagesHandler(settings_for(url))
        try:
            with pytest.raises(error):
                await handler(make_job())
        finally:
            await handler.aclose()


async def test_connection_refused_is_retried_later():
    handler = AnthropicMessagesHandler(
        settings_for("http://127.0.0.1:9", provider_timeout_seconds=2)
    )
    try:
        with pytest.raises(RetryLater):
            await handler(make_job())
    finally:
        await handler.aclose()


async def test_bad_parameters_are_discarded():
    with running_sandbox() as url:
        handler = AnthropicMessagesHandler(settings_for(url))
        try:
            with pytest.raises(Discard):
                await handler(make_job({**PAYLOAD, "not_a_parameter": 1}))
            with pytest.raises(Discard):
                await handler(make_job({**PAYLOAD, "stream": True}))
        finally:
            await handler.aclose()


@pytest.mark.parametrize(
    "option",
    [
        {"extra_headers": {"x-api-key": "a-tenant-key"}},
        {"extra_body": {"model": "claude-opus-4-1", "max_tokens": 32000}},
        {"extra_query": {"beta": "true"}},
        {"timeout": 600},
    ],
)
async def test_sdk_request_options_in_a_payload_are_refused_unsent(option):
    """Found by a hostile-tenant test: a payload's ``extra_headers`` replaced the worker's API
    key, and ``extra_body`` sent opus while the queue charged a 10-token haiku job. Such a job
    is discarded before anything is sent (the provider here is a closed port: a send would
    be a connection error, retried later, not a discard)."""
    handler = AnthropicMessagesHandler(settings_for("http://127.0.0.1:9"))
    try:
        with pytest.raises(Discard, match="request options"):
            await handler(make_job({**PAYLOAD, **option}))
    finally:
        await handler.aclose()


async def test_missing_key_defers_without_using_an_attempt(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    settings = Settings(anthropic_base_url="http://127.0.0.1:9")
    handler = AnthropicMessagesHandler(settings)
    assert not handler.has_api_key()
    with pytest.raises(Defer, match="API key"):
        await handler(make_job())
    registry = builtin_registry(settings)
    outcome = await execute(make_job(), registry, settings, random.Random(0))
    assert isinstance(outcome, Deferred) and outcome.delay_seconds > 0


async def test_executor_maps_outcomes_through_the_sandbox():
    rng = random.Random(1)
    config = SandboxConfig(fail_first_n=1, fail_status=429, fail_retry_after="1")
    with running_sandbox(config) as url:
        settings = settings_for(url)
        registry = builtin_registry(settings)
        throttled = await execute(make_job(), registry, settings, rng)
        ok = await execute(make_job(), registry, settings, rng)
        unknown = await execute(make_job(kind="nobody.handles"), registry, settings, rng)
        await registry.get("anthropic.messages").aclose()  # type: ignore[attr-defined]
    assert isinstance(throttled, Throttled)
    assert throttled.retry_after_seconds == 1.0
    assert 1.0 <= throttled.wait_seconds <= 1.0 * 1.2 * 1.2  # never before retry-after
    assert isinstance(ok, Succeeded) and ok.output_tokens == 12
    assert isinstance(unknown, Deferred)
