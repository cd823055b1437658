"""The baseline and peer workers ``pgqueue bench`` runs as child processes
(``python -m pgqueue.bench plain-worker|pgqueuer-worker DSN N``)."""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from pgqueue.bench.common import (
    GO_CHANNEL,
    PLAIN_CLAIM,
    PLAIN_COMPLETE,
    READY_APP,
    _pgqueuer_queries,
)

# ------------------------------------------------------------------------------------ workers


async def plain_worker(dsn: str, concurrency: int, claim_batch: int | None = None) -> None:
    """The baseline worker: same shape as pgqueue's, minus tiers, DRR, leases bookkeeping
    (``claim_batch``: at most that many jobs per claim, as ``pgqueue work --claim-batch``)."""
    from psycopg_pool import AsyncConnectionPool

    worker_id = f"plain:{os.getpid()}"
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn,
        min_size=1,
        max_size=min(concurrency, 8) + 2,
        kwargs={"autocommit": True},
        open=False,
    )
    await pool.open(wait=True)
    try:
        await _wait_go(dsn)

        async def complete(job_id: int, token: Any) -> None:
            async with pool.connection() as conn:
                await conn.execute(PLAIN_COMPLETE, (job_id, token))

        inflight: set[asyncio.Task[None]] = set()
        while True:
            inflight = {t for t in inflight if not t.done()}
            free = concurrency - len(inflight)
            if free > 0:
                want = min(free, claim_batch or free)
                async with pool.connection() as conn:
                    cur = await conn.execute(PLAIN_CLAIM, (want, worker_id))
                    rows = await cur.fetchall()
                for job_id, token, _payload in rows:
                    inflight.add(asyncio.create_task(complete(job_id, token)))
                if rows and len(rows) == want:
                    continue
                if not rows and not inflight:
                    return
            await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await pool.close()


async def _wait_go(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, application_name=READY_APP
    ) as conn:
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(GO_CHANNEL)))
        async for _notify in conn.notifies():
            return


async def pgqueuer_worker(dsn: str, batch_size: int, max_in_flight: int | None = None) -> None:
    """A pgqueuer ``QueueManager`` with a no-op entrypoint, draining the queue
    (``max_in_flight``: its ``max_concurrent_tasks``; None, its default, is no cap)."""
    from pgqueuer import QueueManager
    from pgqueuer.models import Job
    from pgqueuer.types import QueueExecutionMode

    queries, close = await _pgqueuer_queries(dsn)
    try:
        qm = QueueManager(queries)

        @qm.entrypoint("noop")  # type: ignore[untyped-decorator, unused-ignore]
        async def noop(job: Job) -> None:
            return None

        await _wait_go(dsn)
        await qm.run(
            batch_size=batch_size,
            mode=QueueExecutionMode.drain,
            log_aggregation_interval=timedelta(0),
            max_concurrent_tasks=max_in_flight,
        )
    finally:
        await close()


def _child_main(argv: list[str]) -> int:
    if len(argv) not in (3, 4) or argv[0] not in ("plain-worker", "pgqueuer-worker"):
        sys.stderr.write(
            "usage: python -m pgqueue.bench plain-worker|pgqueuer-worker DSN N [LIMIT]\n"
        )
        return 2
    role, dsn, size = argv[0], argv[1], int(argv[2])
    limit = int(argv[3]) if len(argv) == 4 else None
    if role == "plain-worker":
        asyncio.run(plain_worker(dsn, size, limit))
    else:
        asyncio.run(pgqueuer_worker(dsn, size, limit))
    return 0
