"""Starlette app factory for the sandbox: a local stand-in for Anthropic's Messages API.

One job: answer ``POST /v1/messages`` the way the real API does as far as a job queue can
tell — auth, minimal validation, usage accounting, per-minute rate limits with
``anthropic-ratelimit-*`` / ``retry-after`` headers, 429 / 529 errors in Anthropic's error
JSON — plus scripted faults and an admin API (``/_sandbox/*``) for tests and benchmarks.
The real ``anthropic`` SDK talks to it unchanged via ``base_url``.

Rate-limit accounting lives in :mod:`pgqueue.sandbox.limits`, the shapes of requests and
answers in :mod:`pgqueue.sandbox.messages`, the configuration and mutable state in
:mod:`pgqueue.sandbox.state`; running the app under uvicorn lives in
:mod:`pgqueue.sandbox.server`.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pgqueue.sandbox.batches import BatchStore, batch_routes
from pgqueue.sandbox.limits import (
    Admission,
)
from pgqueue.sandbox.messages import (
    CHARS_PER_TOKEN,
    count_input_tokens,
    error_body,
    filler_text,
    output_token_count,
    validation_error,
)
from pgqueue.sandbox.state import SandboxConfig, SandboxState, ScriptedFault, rfc3339

__all__ = [
    "CHARS_PER_TOKEN",
    "SandboxConfig",
    "SandboxState",
    "ScriptedFault",
    "count_input_tokens",
    "create_app",
    "error_body",
    "filler_text",
    "output_token_count",
    "rfc3339",
]

_MODELS = ("claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1")


def _request_id() -> str:
    return f"req_sandbox_{uuid.uuid4().hex[:24]}"


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    all_headers = {"request-id": _request_id(), **(headers or {})}
    return JSONResponse(error_body(status, message), status_code=status, headers=all_headers)


def _authenticated(request: Request) -> bool:
    """Any non-empty ``x-api-key``, or ``Authorization: Bearer <non-empty token>``."""
    if request.headers.get("x-api-key", "").strip():
        return True
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and bool(token.strip())


async def _json_body(request: Request) -> tuple[object, str | None]:
    try:
        return await request.json(), None
    except ValueError:
        return None, "request body is not valid JSON"


def _rate_limit_message(admission: Admission, cfg: SandboxConfig) -> str:
    limits = {
        "requests": f"{cfg.requests_per_minute} requests per minute",
        "input_tokens": f"{cfg.input_tokens_per_minute} input tokens per minute",
        "output_tokens": f"{cfg.output_tokens_per_minute} output tokens per minute",
    }
    which = ", ".join(limits[name] for name in admission.limiting)
    if admission.exceeds_capacity:
        return f"This request alone exceeds the sandbox rate limit of {which}."
    return f"This request would exceed the sandbox rate limit of {which}."


async def _slept(nap: Awaitable[None], stopping: asyncio.Event) -> bool:
    """Await ``nap`` unless ``stopping`` is set first (the server is shutting down); whether
    it ran to its end."""
    if stopping.is_set():
        return False
    slept = asyncio.ensure_future(nap)
    stopped = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({slept, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        slept.cancel()
        stopped.cancel()
    return not slept.cancelled() and slept.done()


def create_app(
    config: SandboxConfig | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Starlette:
    """Build the sandbox ASGI app.

    Args:
        config: behaviour; ``SandboxConfig()`` (tier-1 limits, no faults) when None.
        clock: monotonic clock in seconds for the rate limiter (inject a fake in tests).
        wall_clock: epoch seconds for ``*-reset`` headers and stats timestamps.
        sleep: coroutine used for simulated latency, in seconds (``asyncio.sleep``).

    Returns:
        A Starlette app. Its state is on ``app.state.sandbox`` (a :class:`SandboxState`),
        its Message Batches on ``app.state.batches`` (a
        :class:`~pgqueue.sandbox.batches.BatchStore`). Setting ``app.state.stopping`` (an
        ``asyncio.Event``; the server does as it shuts down) ends the simulated latency of
        the requests in flight: they are answered 503, "the sandbox is shutting down".

    Routes:
        ``POST /v1/messages``, ``POST /v1/messages/count_tokens``, ``GET /v1/models``,
        ``POST /_sandbox/script``, ``GET /_sandbox/stats``, ``POST /_sandbox/reset``, and the
        Message Batches routes of :mod:`pgqueue.sandbox.batches`.
    """
    cfg = config if config is not None else SandboxConfig()
    state = SandboxState(cfg, clock=clock, wall_clock=wall_clock)
    batches = BatchStore(wall_clock, cfg.batch_processing_seconds, cfg.output_ratio)
    stopping = asyncio.Event()

    async def messages(request: Request) -> Response:
        state.counts["requests"] += 1
        response = await _messages(request)
        state.record_status(response.status_code)
        return response

    async def _messages(request: Request) -> Response:
        if not _authenticated(request):
            return _error(401, "x-api-key header or Authorization: Bearer token is required")
        body, problem = await _json_body(request)
        problem = problem or validation_error(body, need_max_tokens=True)
        if problem is not None or not isinstance(body, dict):
            return _error(400, problem or "invalid request", state.ratelimit_headers())

        fault = state.script.popleft() if state.script else None
        if fault is not None:
            headers = state.ratelimit_headers()
            if fault.retry_after is not None:
                headers["retry-after"] = fault.retry_after
            if fault.retry_after_ms is not None:
                headers["retry-after-ms"] = fault.retry_after_ms
            return _error(fault.status, f"Scripted sandbox fault ({fault.status}).", headers)

        if cfg.overload_rate > 0 and state.rng.random() < cfg.overload_rate:
            return _error(529, "Overloaded", state.ratelimit_headers())

        max_tokens: int = body["max_tokens"]
        input_tokens = count_input_tokens(body)
        admission = state.limiter.try_admit(input_tokens, max_tokens)
        if not admission.admitted:
            headers = state.ratelimit_headers(admission.snapshot)
            headers["retry-after"] = str(max(1, math.ceil(admission.retry_after_seconds)))
            return _error(429, _rate_limit_message(admission, cfg), headers)

        output_tokens = output_token_count(max_tokens, cfg.output_ratio)
        try:
            latency = cfg.base_latency_seconds + output_tokens * cfg.seconds_per_output_token
            if latency > 0 and not await _slept(sleep(latency), stopping):
                # found by a tester: cancelled by uvicorn at its stop, it answered 500 with a
                # traceback on the server's stderr
                return _error(503, "the sandbox is shutting down", state.ratelimit_headers())
        finally:
            state.limiter.refund_output(max_tokens - output_tokens)
        state.record_admission(input_tokens, output_tokens)
        payload = {
            "id": f"msg_sandbox_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": filler_text(output_tokens)}],
            "stop_reason": "max_tokens" if output_tokens >= max_tokens else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }
        headers = {"request-id": _request_id(), **state.ratelimit_headers()}
        return JSONResponse(payload, headers=headers)

    async def count_tokens(request: Request) -> Response:
        if not _authenticated(request):
            return _error(401, "x-api-key header or Authorization: Bearer token is required")
        body, problem = await _json_body(request)
        problem = problem or validation_error(body, need_max_tokens=False)
        if problem is not None or not isinstance(body, dict):
            return _error(400, problem or "invalid request")
        return JSONResponse({"input_tokens": count_input_tokens(body)})

    async def models(request: Request) -> Response:
        if not _authenticated(request):
            return _error(401, "x-api-key header or Authorization: Bearer token is required")
        data = [
            {
                "type": "model",
                "id": model_id,
                "display_name": model_id,
                "created_at": "2025-01-01T00:00:00Z",
            }
            for model_id in _MODELS
        ]
        return JSONResponse(
            {"data": data, "has_more": False, "first_id": _MODELS[0], "last_id": _MODELS[-1]}
        )

    async def script(request: Request) -> Response:
        body, problem = await _json_body(request)
        if problem is not None or not isinstance(body, dict):
            return _error(400, problem or "body must be a JSON object")
        count = body.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            return _error(400, "count: must be an integer >= 0")
        raw = {key: body.get(key) for key in ("retry_after", "retry_after_ms")}
        if any(v is not None and not isinstance(v, str | int | float) for v in raw.values()):
            return _error(400, "retry_after / retry_after_ms: must be a string, number or null")
        try:
            fault = ScriptedFault(
                status=body.get("status", 429),
                retry_after=None if raw["retry_after"] is None else str(raw["retry_after"]),
                retry_after_ms=(
                    None if raw["retry_after_ms"] is None else str(raw["retry_after_ms"])
                ),
            )
        except ValueError as exc:
            return _error(400, str(exc))
        pending = state.queue_faults(fault, count)
        return JSONResponse({"queued": count, "pending": pending})

    async def stats(request: Request) -> Response:
        return JSONResponse(state.stats())

    async def reset(request: Request) -> Response:
        state.reset()
        batches.reset()
        return JSONResponse({"reset": True})

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        return _error(status, f"{request.method} {request.url.path}: {status}")

    app = Starlette(
        routes=[
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/_sandbox/script", script, methods=["POST"]),
            Route("/_sandbox/stats", stats, methods=["GET"]),
            Route("/_sandbox/reset", reset, methods=["POST"]),
            *batch_routes(batches, _authenticated, _error),
        ],
        exception_handlers={HTTPException: http_error},
    )
    app.state.sandbox = state
    app.state.batches = batches
    app.state.stopping = stopping
    return app
