"""The sandbox's Message Batches API: the store of batches and its HTTP routes.

Serves ``POST /v1/messages/batches`` (create), ``GET /v1/messages/batches`` (list, newest
first, ``after_id`` / ``before_id`` / ``limit``), ``GET /v1/messages/batches/{id}``
(retrieve), ``POST /v1/messages/batches/{id}/cancel`` and ``GET
/v1/messages/batches/{id}/results`` (JSONL), in the shapes of the ``anthropic`` SDK's
``client.messages.batches`` types (``MessageBatch``, ``MessageBatchIndividualResponse``).

A batch processes as a whole: it is ``in_progress`` for ``processing_seconds`` of the wall
clock after creation, then ends, and only then are its results and counts known (as the real
API's counts are zero until the batch ends). Cancelling an unfinished batch makes it
``canceling``; it ends, every request ``canceled``, at the next look. The fault mode
(``POST /_sandbox/batches/faults``) makes the next N requests submitted end ``errored``
(a retryable ``api_error``) or ``expired``, or refuses the next N creates (400). The store
counts submissions per ``custom_id`` across batches (``GET /_sandbox/batches/stats``), so a
test can prove no request was sent twice. Batch requests have their own limits: they do not
touch the Messages API limiter.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pgqueue.sandbox.messages import (
    count_input_tokens,
    error_body,
    filler_text,
    output_token_count,
    validation_error,
)
from pgqueue.sandbox.state import rfc3339

#: The API's bound on requests per batch.
MAX_REQUESTS_PER_BATCH = 100_000
#: How long a batch may take before it expires, and how long results are kept (seconds).
EXPIRES_AFTER_SECONDS = 24 * 3600.0
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

Outcome = Literal["succeeded", "errored", "canceled", "expired"]


@dataclass
class SandboxBatch:
    """One batch: its requests in order, its times (epoch seconds) and, once ended, results."""

    id: str
    requests: list[dict[str, Any]]
    created_at: float
    fates: list[Outcome | None]  # a fault's fixed outcome per request, None = process it
    cancel_initiated_at: float | None = None
    ended_at: float | None = None
    results: list[dict[str, Any]] = field(default_factory=list)


class BatchStore:
    """Every batch the sandbox holds, and the submission counts per ``custom_id``.

    Args:
        wall_clock: epoch seconds (inject a fake in tests).
        processing_seconds: how long a batch stays ``in_progress`` after creation, >= 0.
        output_ratio: fraction of ``max_tokens`` each answer uses (as the Messages API's).

    Raises:
        ValueError: if ``processing_seconds`` < 0.
    """

    def __init__(
        self, wall_clock: Callable[[], float], processing_seconds: float, output_ratio: float
    ) -> None:
        if processing_seconds < 0:
            raise ValueError(f"processing_seconds must be >= 0, got {processing_seconds!r}")
        self.wall_clock = wall_clock
        self.processing_seconds = processing_seconds
        self.output_ratio = output_ratio
        self.reset()

    def reset(self) -> None:
        """Forget every batch, count and pending fault."""
        self.batches: dict[str, SandboxBatch] = {}
        self.submissions: Counter[str] = Counter()
        self.pending_faults: list[Outcome] = []
        self.refusals = 0

    def queue_faults(self, errored: int, expired: int, refused: int = 0) -> int:
        """The next ``errored`` requests submitted end errored, the ``expired`` after them
        expired; the next ``refused`` creates are answered 400. Returns the faults now
        pending."""
        faults: list[Outcome] = ["errored"] * errored
        self.pending_faults.extend(faults + ["expired"] * expired)
        self.refusals += refused
        return len(self.pending_faults) + self.refusals

    def create(self, requests: list[dict[str, Any]]) -> SandboxBatch:
        """Store a new batch of valid-shaped requests (see :func:`create_problem`)."""
        fates: list[Outcome | None] = []
        for request in requests:
            self.submissions[request["custom_id"]] += 1
            fates.append(self.pending_faults.pop(0) if self.pending_faults else None)
        batch = SandboxBatch(
            id=f"msgbatch_sandbox_{uuid.uuid4().hex[:24]}",
            requests=requests,
            created_at=self.wall_clock(),
            fates=fates,
        )
        self.batches[batch.id] = batch
        return batch

    def cancel(self, batch: SandboxBatch) -> None:
        """Start cancelling ``batch`` unless it has ended (then nothing changes)."""
        self.refresh(batch)
        if batch.ended_at is None and batch.cancel_initiated_at is None:
            batch.cancel_initiated_at = self.wall_clock()

    def refresh(self, batch: SandboxBatch) -> None:
        """End ``batch`` if it is being cancelled or its processing time has passed."""
        if batch.ended_at is not None:
            return
        now = self.wall_clock()
        if batch.cancel_initiated_at is not None:
            batch.results = [self._result(r, "canceled") for r in batch.requests]
        elif now >= batch.created_at + self.processing_seconds:
            batch.results = [
                self._result(r, f) for r, f in zip(batch.requests, batch.fates, strict=True)
            ]
        else:
            return
        batch.ended_at = now

    def _result(self, request: dict[str, Any], fate: Outcome | None) -> dict[str, Any]:
        custom_id = request["custom_id"]
        if fate == "errored":
            error = error_body(500, "Scripted sandbox batch fault.")
            return {"custom_id": custom_id, "result": {"type": "errored", "error": error}}
        if fate is not None:
            return {"custom_id": custom_id, "result": {"type": fate}}
        params = request["params"]
        problem = validation_error(params, need_max_tokens=True)
        if problem is not None:
            result = {"type": "errored", "error": error_body(400, problem)}
            return {"custom_id": custom_id, "result": result}
        max_tokens: int = params["max_tokens"]
        output_tokens = output_token_count(max_tokens, self.output_ratio)
        message = {
            "id": f"msg_sandbox_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": params["model"],
            "content": [{"type": "text", "text": filler_text(output_tokens)}],
            "stop_reason": "max_tokens" if output_tokens >= max_tokens else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": count_input_tokens(params), "output_tokens": output_tokens},
        }
        return {"custom_id": custom_id, "result": {"type": "succeeded", "message": message}}

    def view(self, batch: SandboxBatch, base_url: str, *, refresh: bool = True) -> dict[str, Any]:
        """``batch`` as the API's ``MessageBatch`` JSON, after :meth:`refresh` unless
        ``refresh`` is False (the answer to a cancel shows ``canceling``)."""
        if refresh:
            self.refresh(batch)
        counts = dict.fromkeys(("processing", "succeeded", "errored", "canceled", "expired"), 0)
        if batch.ended_at is None:
            counts["processing"] = len(batch.requests)
        for line in batch.results:
            counts[line["result"]["type"]] += 1
        ended = batch.ended_at is not None
        status = "ended" if ended else "canceling" if batch.cancel_initiated_at else "in_progress"
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": counts,
            "created_at": rfc3339(batch.created_at),
            "expires_at": rfc3339(batch.created_at + EXPIRES_AFTER_SECONDS),
            "ended_at": None if batch.ended_at is None else rfc3339(batch.ended_at),
            "cancel_initiated_at": (
                None if batch.cancel_initiated_at is None else rfc3339(batch.cancel_initiated_at)
            ),
            "archived_at": None,
            "results_url": (f"{base_url}v1/messages/batches/{batch.id}/results" if ended else None),
        }

    def stats(self) -> dict[str, Any]:
        """``GET /_sandbox/batches/stats``: batches, requests submitted, the most times one
        ``custom_id`` was submitted, the ``custom_id``s submitted more than once, faults
        pending."""
        return {
            "batches": len(self.batches),
            "requests": sum(self.submissions.values()),
            "max_submissions_per_custom_id": max(self.submissions.values(), default=0),
            "duplicates": sorted(k for k, n in self.submissions.items() if n > 1),
            "pending_faults": len(self.pending_faults) + self.refusals,
        }


def create_problem(body: object) -> str | None:
    """What is wrong with a create body as a whole, or None. Per-request ``params`` problems
    are not checked here: like the API, the sandbox reports them as ``errored`` results."""
    if not isinstance(body, dict) or not isinstance(body.get("requests"), list):
        return "requests: field required (list)"
    requests = body["requests"]
    if not 1 <= len(requests) <= MAX_REQUESTS_PER_BATCH:
        return f"requests: must hold 1 to {MAX_REQUESTS_PER_BATCH} requests"
    seen: set[str] = set()
    for i, request in enumerate(requests):
        if not isinstance(request, dict) or not isinstance(request.get("params"), dict):
            return f"requests.{i}: must be an object with custom_id and params"
        custom_id = request.get("custom_id")
        if not isinstance(custom_id, str) or not _CUSTOM_ID.match(custom_id):
            return f"requests.{i}.custom_id: must match ^[a-zA-Z0-9_-]{{1,64}}$"
        if custom_id in seen:
            return f"requests.{i}.custom_id: {custom_id!r} is not unique in the batch"
        seen.add(custom_id)
    return None


def batch_routes(
    store: BatchStore,
    authenticated: Callable[[Request], bool],
    error: Callable[[int, str], Response],
) -> list[Route]:
    """The batches routes on ``store``; ``authenticated`` and ``error`` are the app's."""

    async def body_of(request: Request) -> object:
        try:
            return await request.json()
        except ValueError:
            return None

    def find(request: Request) -> SandboxBatch | Response:
        if not authenticated(request):
            return error(401, "x-api-key header or Authorization: Bearer token is required")
        batch = store.batches.get(request.path_params["batch_id"])
        if batch is None:
            return error(404, f"message batch {request.path_params['batch_id']!r} not found")
        return batch

    async def create(request: Request) -> Response:
        if not authenticated(request):
            return error(401, "x-api-key header or Authorization: Bearer token is required")
        body = await body_of(request)
        problem = create_problem(body)
        if problem is not None or not isinstance(body, dict):
            return error(400, problem or "invalid request")
        if store.refusals > 0:
            store.refusals -= 1
            return error(400, "Scripted sandbox refusal of a batch.")
        batch = store.create(body["requests"])
        return JSONResponse(store.view(batch, str(request.base_url)))

    async def listing(request: Request) -> Response:
        if not authenticated(request):
            return error(401, "x-api-key header or Authorization: Bearer token is required")
        ids = list(reversed(store.batches))  # newest first
        after, before = request.query_params.get("after_id"), request.query_params.get("before_id")
        if after in store.batches:
            ids = ids[ids.index(after) + 1 :]
        elif before in store.batches:
            ids = ids[: ids.index(before)]
        try:
            limit = int(request.query_params.get("limit", "20"))
        except ValueError:
            return error(400, "limit: must be an integer from 1 to 1000")
        if not 1 <= limit <= 1000:
            return error(400, "limit: must be an integer from 1 to 1000")
        page = ids[-limit:] if before in store.batches else ids[:limit]
        data = [store.view(store.batches[i], str(request.base_url)) for i in page]
        return JSONResponse(
            {
                "data": data,
                "has_more": len(page) < len(ids),
                "first_id": page[0] if page else None,
                "last_id": page[-1] if page else None,
            }
        )

    async def retrieve(request: Request) -> Response:
        batch = find(request)
        if isinstance(batch, Response):
            return batch
        return JSONResponse(store.view(batch, str(request.base_url)))

    async def cancel(request: Request) -> Response:
        batch = find(request)
        if isinstance(batch, Response):
            return batch
        store.cancel(batch)
        return JSONResponse(store.view(batch, str(request.base_url), refresh=False))

    async def results(request: Request) -> Response:
        batch = find(request)
        if isinstance(batch, Response):
            return batch
        store.refresh(batch)
        if batch.ended_at is None:
            return error(400, f"message batch {batch.id!r} has not ended yet")
        text = "".join(json.dumps(line) + "\n" for line in batch.results)
        return Response(text, media_type="application/binary")

    async def faults(request: Request) -> Response:
        body = await body_of(request)
        counts = body if isinstance(body, dict) else {}
        errored, expired, refused = (counts.get(k, 0) for k in ("errored", "expired", "refused"))
        for value in (errored, expired, refused):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                return error(400, "errored / expired / refused: must be integers >= 0")
        return JSONResponse({"pending": store.queue_faults(errored, expired, refused)})

    async def stats(request: Request) -> Response:
        return JSONResponse(store.stats())

    return [
        Route("/v1/messages/batches", create, methods=["POST"]),
        Route("/v1/messages/batches", listing, methods=["GET"]),
        Route("/v1/messages/batches/{batch_id}", retrieve, methods=["GET"]),
        Route("/v1/messages/batches/{batch_id}/cancel", cancel, methods=["POST"]),
        Route("/v1/messages/batches/{batch_id}/results", results, methods=["GET"]),
        Route("/_sandbox/batches/faults", faults, methods=["POST"]),
        Route("/_sandbox/batches/stats", stats, methods=["GET"]),
    ]
