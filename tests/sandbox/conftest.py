"""Shared fixtures for the sandbox tests: a fake clock and an in-process app + SDK client."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import anthropic
import pytest
from starlette.testclient import TestClient

from pgqueue.sandbox import SandboxConfig, create_app


class FakeClock:
    """A manually advanced clock (seconds); usable as both monotonic and wall clock."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class SleepRecorder:
    """Stands in for asyncio.sleep: records requested delays (seconds), never waits."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


class Harness:
    """An in-process sandbox on a fake clock, with a raw HTTP client and the real SDK."""

    def __init__(self, config: SandboxConfig) -> None:
        self.clock = FakeClock()
        self.sleep = SleepRecorder()
        self.app = create_app(config, clock=self.clock, wall_clock=self.clock, sleep=self.sleep)
        self.http = TestClient(self.app, base_url="http://sandbox.test")
        self.sdk = anthropic.Anthropic(
            base_url="http://sandbox.test",
            api_key="sandbox-key",
            max_retries=0,
            http_client=self.http,
        )

    def create(self, content: str = "hello", max_tokens: int = 10) -> anthropic.types.Message:
        return self.sdk.messages.create(
            model="claude-sandbox",
            max_tokens=max_tokens,
            messages=[{"role": "user", "content": content}],
        )

    def stats(self) -> dict[str, object]:
        data: dict[str, object] = self.http.get("/_sandbox/stats").json()
        return data


@pytest.fixture(autouse=True)
def _no_real_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def make_harness() -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(config: SandboxConfig | None = None) -> Harness:
        h = Harness(config or SandboxConfig())
        made.append(h)
        return h

    yield make
    for h in made:
        h.sdk.close()
        h.http.close()
