"""Enqueue a planned trace at its recorded arrival times (scaled by a speed-up factor).

The plan comes from :func:`pgqueue.trace.plan_replay` (real arrival times and token counts from
the Azure LLM inference trace 2023, CC-BY 4.0; see ``pgqueue/data/README.md``). Jobs due at
the same moment go in one ``enqueue_many`` round trip, each committed at once so workers see
them as they arrive.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from pgqueue.batch import JobSpec
from pgqueue.batches.outcomes import cost_saved_usd
from pgqueue.enqueue import enqueue_many
from pgqueue.models import Tier
from pgqueue.scheduling.tiers import classify
from pgqueue.settings import Settings
from pgqueue.trace import PlannedJob


@dataclass(frozen=True, slots=True)
class ReplayStats:
    """What a replay enqueued: ``jobs`` in ``batches`` round trips, over ``elapsed_seconds``,
    with ``max_lag_seconds`` the worst delay behind the planned arrival time; ``ids`` are the
    jobs' ids in plan order (sorted by ``at_seconds``, ties in plan order; None for a job
    admission control dropped)."""

    jobs: int
    batches: int
    elapsed_seconds: float
    max_lag_seconds: float
    ids: tuple[int | None, ...] = ()


def as_planned(job: PlannedJob) -> JobSpec:
    """The job a planned request becomes: its own tenant, origin, payload and SLA."""
    return JobSpec(job.tenant_id, job.origin, job.payload, job.sla_seconds)


async def replay_plan(
    dsn: str,
    plan: Sequence[PlannedJob],
    settings: Settings,
    *,
    clock: Callable[[], float] = time.monotonic,
    spec: Callable[[PlannedJob], JobSpec] = as_planned,
    on_batch: Callable[[int], None] | None = None,
) -> ReplayStats:
    """Enqueue ``plan`` against ``dsn`` in real time (``PlannedJob.at_seconds`` from now).

    ``spec`` turns each planned request into the job to enqueue (the demo's FIFO arm puts
    every request in one tenant and one tier); ``on_batch`` is told the jobs enqueued so far
    after each round trip.

    Raises the typed errors of :func:`pgqueue.enqueue_many` for invalid planned jobs, and
    ``psycopg.Error`` for database failures.
    """
    ordered = sorted(plan, key=lambda j: j.at_seconds)
    start = clock()
    batches = 0
    max_lag = 0.0
    index = 0
    ids: list[int | None] = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while index < len(ordered):
            now = clock() - start
            wait = ordered[index].at_seconds - now
            if wait > 0:
                await asyncio.sleep(wait)
                now = clock() - start
            due: list[JobSpec] = []
            while index < len(ordered) and ordered[index].at_seconds <= now:
                job = ordered[index]
                max_lag = max(max_lag, now - job.at_seconds)
                due.append(spec(job))
                index += 1
            ids.extend(await enqueue_many(conn, due, settings=settings))
            batches += 1
            if on_batch is not None:
                on_batch(index)
    return ReplayStats(len(ordered), batches, clock() - start, max_lag, tuple(ids))


def batch_lane_savings(plan: Sequence[PlannedJob], settings: Settings) -> dict[str, Any]:
    """What the batches lane would save on ``plan``: its batch-tier jobs (classified as at
    enqueue, no demotion), their planned tokens (prompt and ``max_tokens``), and
    ``cost_saved_usd`` (:func:`pgqueue.batches.outcomes.cost_saved_usd` at the settings'
    prices and discount). An estimate from the plan, not from answers."""
    batch = [
        job for job in plan if classify(job.origin, job.sla_seconds, demoted=False) is Tier.BATCH
    ]
    input_tokens = sum(job.input_tokens for job in batch)
    output_tokens = sum(job.output_tokens for job in batch)
    return {
        "jobs": len(batch),
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cost_saved_usd": cost_saved_usd(
            input_tokens,
            output_tokens,
            input_usd_per_mtok=settings.price_input_usd_per_mtok,
            output_usd_per_mtok=settings.price_output_usd_per_mtok,
            discount=settings.batches_discount,
        ),
    }
