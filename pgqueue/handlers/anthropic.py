"""The built-in ``anthropic.messages`` handler: one Messages API call per job.

It sends the job's payload with the official SDK (``max_retries=0``: retries are the queue's
job, through ``run_at``) and a timeout shorter than the lease, stores the message and its
``usage``, and maps every provider error to an outcome: 429/529 → :class:`RateLimited` (with the
``retry-after`` hint), 408/409/5xx/connection errors → :class:`RetryLater`, other 4xx →
:class:`Discard`. The API key comes from ``PGQUEUE_ANTHROPIC_API_KEY_FILE`` or
``ANTHROPIC_API_KEY`` and is never logged or stored.

The SDK is not imported with this module: importing it costs about 1.7 s of CPU (pydantic
builds its models), which every ``pgqueue work`` process paid at start even when it could not
run an ``anthropic.messages`` job. A worker with an API key loads it before its first claim
(:meth:`AnthropicMessagesHandler.load_sdk`), so that a request the rate limiter admitted is
not held back by the import; the others never load it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pgqueue.errors import Defer, Discard, RateLimited, RetryLater
from pgqueue.models import HandlerResult, Job
from pgqueue.scheduling.backpressure import parse_ratelimit_reset, parse_retry_after
from pgqueue.settings import Settings

if TYPE_CHECKING:
    import anthropic

KIND = "anthropic.messages"

#: The worker's logger: the no-key warning is the worker's (``pgqueue work`` shows it).
_worker_log = logging.getLogger("pgqueue.worker")

#: Response headers kept with the result (rate-limit state and the request id, never secrets).
_KEPT_HEADER_PREFIXES = ("anthropic-ratelimit-", "retry-after", "request-id")


def _api_key(settings: Settings) -> str | None:
    if settings.anthropic_api_key is not None:
        return settings.anthropic_api_key.get_secret_value()
    if settings.anthropic_api_key_file is not None:
        return settings.anthropic_api_key_file.read_text(encoding="utf-8").strip()
    return os.environ.get("ANTHROPIC_API_KEY")


def api_key(settings: Settings) -> str | None:
    """The Anthropic API key this process uses (settings, key file, ANTHROPIC_API_KEY), or
    None. Raises ``OSError`` when the key file cannot be read. Never log it."""
    return _api_key(settings)


def _kept_headers(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower().startswith(_KEPT_HEADER_PREFIXES)}


#: Keyword arguments of the SDK's ``create`` that are not Messages API parameters. A payload
#: holding one is refused: ``extra_headers`` could replace the worker's API key (whose 429s
#: then close the model to every tenant) and ``extra_body`` could send another model or
#: prompt than the one the queue charged and admitted (found by a hostile-tenant test).
SDK_REQUEST_OPTIONS = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})


class AnthropicMessagesHandler:
    """Calls ``POST /v1/messages`` for a job; one SDK client per worker process.

    The base URL is ``settings.anthropic_base_url``, else the SDK's ``ANTHROPIC_BASE_URL``
    (point it at ``pgqueue sandbox`` for local runs). Timeout: ``provider_timeout_seconds``,
    which settings validation keeps shorter than the lease.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._client: anthropic.AsyncAnthropic | None = None

    def has_api_key(self) -> bool:
        """Whether an API key is configured (the key itself is never returned or logged)."""
        try:
            return bool(_api_key(self._settings))
        except OSError:
            return False

    def load_sdk(self) -> None:
        """Import the Anthropic SDK now (~1.7 s of CPU), not at the first job."""
        import anthropic  # noqa: F401

    def _get_client(self) -> anthropic.AsyncAnthropic:
        import anthropic

        if self._client is None:
            key = _api_key(self._settings)
            if not key:
                raise Defer(
                    "no Anthropic API key on this worker: set ANTHROPIC_API_KEY or "
                    "PGQUEUE_ANTHROPIC_API_KEY_FILE"
                )
            self._client = anthropic.AsyncAnthropic(
                api_key=key,
                base_url=self._settings.anthropic_base_url,
                max_retries=0,
                timeout=self._settings.provider_timeout_seconds,
            )
        return self._client

    async def __call__(self, job: Job) -> HandlerResult:
        """Send ``job.payload`` as Messages API parameters.

        Returns:
            The message as JSON, with ``usage.input_tokens`` / ``usage.output_tokens``.

        Raises:
            Defer: no API key is configured on this worker (the job loses no attempt).
            RateLimited: 429 or 529, carrying the parsed ``retry-after`` (seconds), else the
                time to the spent bucket's ``anthropic-ratelimit-*-reset``, or None.
            RetryLater: 408, 409, 5xx, timeouts and connection errors.
            Discard: any other 4xx, or parameters the SDK rejects.
        """
        import anthropic

        if job.payload.get("stream"):
            raise Discard("streaming payloads are not supported by the queue handler")
        options = sorted(SDK_REQUEST_OPTIONS.intersection(job.payload))
        if options:
            raise Discard(
                f"payload key(s) {', '.join(options)} are the SDK's request options, not "
                "Messages API parameters: the queue does not send them"
            )
        client = self._get_client()
        try:
            raw = await client.messages.with_raw_response.create(**job.payload)
        except anthropic.APIStatusError as exc:
            status = exc.status_code
            headers = exc.response.headers
            if status in (429, 529):
                now = datetime.now(UTC)
                hint = parse_retry_after(headers, now)
                if hint is None:  # no retry-after: when the spent bucket is full again
                    hint = parse_ratelimit_reset(headers, now)
                raise RateLimited(f"HTTP {status}: {exc.message}", hint, status) from None
            if status in (408, 409) or status >= 500:
                raise RetryLater(f"HTTP {status}: {exc.message}") from None
            raise Discard(f"HTTP {status}: {exc.message}") from None
        except (anthropic.APITimeoutError, anthropic.APIConnectionError) as exc:
            raise RetryLater(f"{type(exc).__name__}: {exc}") from None
        except TypeError as exc:
            raise Discard(f"payload is not valid Messages API parameters: {exc}") from None
        message = await raw.parse()
        return HandlerResult(
            result=message.model_dump(mode="json"),
            input_tokens=message.usage.input_tokens,
            output_tokens=message.usage.output_tokens,
            headers=_kept_headers(raw.headers),
        )

    async def aclose(self) -> None:
        """Close the SDK's HTTP connections."""
        if self._client is not None:
            await self._client.close()
            self._client = None


async def prepare_for_worker(handler: object) -> set[str]:
    """What a worker does with its ``anthropic.messages`` handler before its first claim.

    With an API key, import the SDK now (~1.7 s of CPU): the rate limiter admits a request when
    it is claimed, and a first job that waited for the import would reach the provider late.
    Without one, warn once. Returns the kinds the worker cannot run: ``{KIND}`` without a key
    (the worker does not claim their jobs, and a burst worker does not wait for them), else
    nothing; a handler of the user's own for the kind needs nothing either.
    """
    if not isinstance(handler, AnthropicMessagesHandler):
        return set()
    if handler.has_api_key():
        await asyncio.to_thread(handler.load_sdk)
        return set()
    _worker_log.warning(
        "no Anthropic API key (ANTHROPIC_API_KEY or PGQUEUE_ANTHROPIC_API_KEY_FILE): "
        "this worker leaves %s jobs queued for a worker that has one",
        KIND,
    )
    return {KIND}
