"""The worker's lease keeping: heartbeats for the jobs it holds, and the rescue of jobs whose
lease expired (any worker's), with the pruners of finished jobs and of the scheduler's idle
flow rows on the rescuer's round.

The statements are :mod:`pgqueue.worker.leases`'; this module runs them on their schedule
and counts what they find in the worker's stats.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from psycopg_pool import AsyncConnectionPool

from pgqueue.observability import metrics
from pgqueue.settings import Settings
from pgqueue.worker import leases, upkeep
from pgqueue.worker.inflight import InFlight

if TYPE_CHECKING:
    from pgqueue.worker.runs import WorkerStats

log = logging.getLogger("pgqueue.worker")

Pool = AsyncConnectionPool[Any]


class LeaseKeeper:
    """Heartbeat and rescue rounds of one worker.

    Args:
        jobs: the jobs the worker holds (their leases are extended).
        settings: ``heartbeat_seconds``, ``lease_seconds``, ``rescue_interval_seconds`` (±20 %
            jitter), ``retention_seconds`` (None: no pruning of finished jobs; idle flow
            rows are pruned on every round).
        stats: where lost leases and rescued jobs are counted.
        wake: asks the producer to claim (rescued jobs are queued again).
        stopping: whether the worker is stopping (the heartbeat then keeps only what it must).
        rng: the jitter's source.
    """

    def __init__(
        self,
        jobs: InFlight,
        settings: Settings,
        *,
        stats: WorkerStats,
        wake: Callable[[], None],
        stopping: Callable[[], bool],
        rng: random.Random,
    ) -> None:
        self._jobs = jobs
        self._settings = settings
        self._stats = stats
        self._wake = wake
        self._stopping = stopping
        self._rng = rng
        # one rescue at a time in this process, so that the burst exit waits for a rescue
        # the background rescuer has under way
        self._rescue_lock = asyncio.Lock()

    async def heartbeat_loop(self, pool: Pool) -> None:
        while True:
            await asyncio.sleep(self._settings.heartbeat_seconds)
            await self.heartbeat_once(pool)

    async def heartbeat_once(self, pool: Pool) -> None:
        """Extend the leases of the jobs this worker holds (:meth:`InFlight.heartbeat`)."""
        self._stats.lost_leases += await self._jobs.heartbeat(
            pool, self._settings.lease_seconds, stopping=self._stopping()
        )

    async def rescue_loop(self, pool: Pool) -> None:
        while True:
            await self.rescue_once(pool)
            if self._settings.retention_seconds is not None:
                await upkeep.prune(pool, self._settings.retention_seconds)
            await upkeep.prune_flows(pool)
            jitter = self._rng.uniform(0.8, 1.2)
            await asyncio.sleep(self._settings.rescue_interval_seconds * jitter)

    async def rescue_once(self, pool: Pool) -> int:
        """Requeue (or fail) jobs whose lease expired; returns how many went back to the queue
        (0 on a database error). A burst worker also runs it before exiting, so that it does not
        leave rescued work behind."""
        async with self._rescue_lock:
            rows = await leases.rescue(pool)
        if rows:
            self._stats.rescued += len(rows)
            metrics.RESCUED.inc(len(rows))
            log.warning("rescued %d job(s) whose lease expired", len(rows))
            self._wake()
        return sum(1 for row in rows if row["state"] == "queued")
