"""Starting a worker's batch poller, without importing the SDK on a worker without a key (a
worker that cannot call the provider never loads it: tests/worker/test_startup.py)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from psycopg_pool import AsyncConnectionPool

from pgqueue.handlers.anthropic import api_key
from pgqueue.settings import Settings


def start_poller(
    pool: AsyncConnectionPool[Any],
    settings: Settings,
    worker_id: str,
    rng: random.Random,
    stop: asyncio.Event,
) -> asyncio.Task[None] | None:
    """The worker's poller task (a step every ``poll_interval_seconds``), or None on a worker
    without an Anthropic API key (other workers then carry the lane)."""
    try:
        key = api_key(settings)
    except OSError:
        key = None
    if not key:
        return None
    import anthropic

    from pgqueue.batches.poller import BatchPoller

    client = anthropic.AsyncAnthropic(
        api_key=key,
        base_url=settings.anthropic_base_url,
        max_retries=0,
        timeout=settings.provider_timeout_seconds,
    )
    poller = BatchPoller(pool, client, settings, worker_id, rng)
    return asyncio.create_task(
        poller.loop(stop, settings.poll_interval_seconds), name="pgqueue-batches"
    )
