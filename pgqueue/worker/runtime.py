"""The worker's composition root: start-up, signals, and the shutdown order. Claiming is
:mod:`pgqueue.worker.producer`'s, running a claimed job to its counted outcome
:mod:`pgqueue.worker.runs`'s; heartbeats and rescue are :mod:`pgqueue.worker.lease_keeper`'s,
the stop's budget for final writes :mod:`pgqueue.worker.shutdown`'s.

One asyncio process runs up to ``concurrency`` jobs. The producer is the only task that
claims: it wakes on NOTIFY, a jittered poll, a freed slot or the next due ``run_at``, and
claims at most the free slots, so a job is claimed only when it can start at once; with
``claim_batch_max`` below ``concurrency``, at most that many per claim, so that the next claim
overlaps the jobs still running instead of waiting for them. Shutdown
order (fixed here): stop claiming → let running jobs finish within the grace period → return
the rest to the queue (Interrupted, no attempt used) → stop background tasks → close the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
import uuid
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from pgqueue.batches.startup import start_poller
from pgqueue.db.migrate import check_schema
from pgqueue.handlers.anthropic import KIND as ANTHROPIC_KIND
from pgqueue.handlers.anthropic import AnthropicMessagesHandler, prepare_for_worker
from pgqueue.handlers.registry import NOOP_KIND, Registry, noop
from pgqueue.observability import metrics
from pgqueue.settings import Settings
from pgqueue.worker import shutdown, upkeep
from pgqueue.worker.completer import Completer
from pgqueue.worker.connections import CONNECTION_OPTIONS, WorkerPool
from pgqueue.worker.decoding import configure_connection
from pgqueue.worker.executor import runs_in_thread, sync_handlers_running
from pgqueue.worker.inflight import InFlight
from pgqueue.worker.lease_keeper import LeaseKeeper
from pgqueue.worker.notifier import Notifier
from pgqueue.worker.outage import POOL_RECONNECT_SECONDS, OutageLog, PoolWarnings
from pgqueue.worker.producer import Producer
from pgqueue.worker.runs import UNRECORDED, WorkerStats

__all__ = ["UNRECORDED", "Worker", "WorkerStats", "builtin_registry", "default_worker_id"]

log = logging.getLogger("pgqueue.worker")

#: How often (seconds) a worker looks whether ``pgqueue.jobs`` needs an ANALYZE (a queue
#: filled since the last one: the claim's generic plans, made without statistics, read whole
#: indexes until then; ``upkeep.analyze_jobs_if_stale``).
ANALYZE_CHECK_SECONDS = 1.0

#: Pooled connections a worker process keeps at most, whatever its concurrency: the producer's
#: claims, the heartbeat and the batch flusher keep one each, and outcomes written one at a
#: time (a failure, a retry, a success whose row another claim held) share the rest with the
#: upkeep loops (``Completer``'s write slots: this less three). A pool of
#: ``min(concurrency, 8) + 2`` grew to 10 whenever writes waited, and each new connection costs
#: the server its first plans and function compiles (~100 M instructions, callgrind): two
#: workers on one queue opened 20-22 and spent 15-25 % more Postgres CPU per job in a drain
#: of 8,000-20,000 jobs (bench/cpu_per_job.py) than with at most 5 each. (The LISTEN
#: connection is apart: notifier.py.)
POOL_SIZE_MAX = 5


def builtin_registry(settings: Settings) -> Registry:
    """The handlers every worker has: ``anthropic.messages`` and ``pgqueue.noop``."""
    registry = Registry()
    registry.register(ANTHROPIC_KIND, AnthropicMessagesHandler(settings))
    registry.register(NOOP_KIND, noop)
    return registry


def default_worker_id() -> str:
    """``host:pid:random`` — unique per process, readable in ``pgqueue.jobs.worker_id``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker(Producer):
    """One ``pgqueue work`` process.

    Args:
        dsn: where the queue lives.
        settings: tunables (lease, heartbeat, poll interval, grace period, retry policy).
        registry: handlers by kind; the built-ins are added under it.
        concurrency: jobs in flight at once (default ``settings.concurrency``).
        burst: exit when nothing is queued within ``settings.burst_horizon_seconds``, nor
            running under another worker's lease that ends within it (waited for at most
            that horizon in all).
        listen: use LISTEN/NOTIFY (off → poll only, e.g. behind PgBouncer in transaction mode).

    Raises (from :meth:`run`):
        SchemaOutOfDate: the schema is missing or behind; the message says to run migrate.
    """

    def __init__(
        self,
        dsn: str,
        settings: Settings,
        registry: Registry | None = None,
        *,
        concurrency: int | None = None,
        burst: bool = False,
        listen: bool = True,
        worker_id: str | None = None,
        seed: int | None = None,
    ) -> None:
        self.dsn = dsn
        self.settings = settings
        self.registry = builtin_registry(settings).merged(registry or Registry())
        self.concurrency = concurrency or settings.concurrency
        self.burst = burst
        self.listen = listen
        self.worker_id = worker_id or default_worker_id()
        self.stats = WorkerStats()
        self._rng = random.Random(seed)
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        # set by a hard stop: the grace period ends
        self._hard_stopped = asyncio.Event()
        # the stop's waits for outcome writes: one budget, ended early by a later signal
        self._budget = shutdown.StopBudget()
        self._stopping = False
        self._hard_stop = False
        # the jobs this worker holds, by lease
        self._jobs = InFlight()
        self._leases = LeaseKeeper(
            self._jobs,
            settings,
            stats=self.stats,
            wake=self.wake,
            stopping=lambda: self._stopping,
            rng=self._rng,
        )
        self._blocked_seconds: float | None = None
        # kinds this worker cannot run (no handler, no API key): their jobs go back to the queue
        # unrun, and a burst worker does not wait for them (found by a tester: without a key,
        # `--burst` re-claimed the deferred jobs every 60 s and never exited)
        self._cannot_run: set[str] = set()
        self._pool: AsyncConnectionPool[Any] | None = None
        self._pool_warnings: PoolWarnings | None = None
        self._completer: Completer | None = None

    # ------------------------------------------------------------------ control
    def wake(self) -> None:
        """Ask the producer to try a claim now (NOTIFY, freed slot, rescue)."""
        self._wake.set()

    def request_stop(self, *, hard: bool = False) -> None:
        """Stop claiming; with ``hard``, also interrupt running jobs now (back to the queue)."""
        self._stopping = True
        self._stop.set()
        self._wake.set()
        if hard and not self._hard_stop:
            self._hard_stop = True
            self._hard_stopped.set()
            self._jobs.cancel_handlers()

    def _on_signal(self) -> None:
        if self._hard_stop:
            threads = self._in_threads([task for _job, task in self._jobs.running.values()])
            if threads:
                # The only way to stop a thread is to end the process: its jobs' leases then
                # expire and the rescuer puts them back; nothing runs them twice at once.
                log.warning(
                    "another signal: exiting now, with %d synchronous handler(s) still running; "
                    "their jobs go back to the queue when their leases expire",
                    len(threads),
                )
                os._exit(128 + signal.SIGTERM)
            log.warning(
                "another signal: no more waiting for outcome writes; "
                "their jobs go back to the queue when their leases expire"
            )
            self._budget.abandon.set()
        elif self._stopping:
            log.warning("second signal: returning running jobs to the queue")
            self.request_stop(hard=True)
        else:
            # INFO, which `pgqueue work` shows without -v (found by a tester: the first Ctrl-C
            # printed nothing for the up to 30 s it waited; and a normal stop is no warning).
            waited_for = self._jobs.waited_for()
            if waited_for:
                log.info(
                    "stopping: no new claims; waiting up to %g s for %d running job(s); press "
                    "Ctrl-C again (or send another SIGTERM) to return them to the queue now",
                    self.settings.shutdown_grace_seconds,
                    waited_for,
                )
            elif self._claiming:
                # found by a tester: "no job running", then 16 jobs went back to the queue
                log.info(
                    "stopping: no new claims; no job running; the jobs of the claim under way "
                    "go back to the queue unrun"
                )
            else:
                log.info("stopping: no new claims; no job running")
            self.request_stop()

    # --------------------------------------------------------------------- run
    async def run(self, *, install_signal_handlers: bool = True) -> WorkerStats:
        """Work until stopped (or, in burst mode, until nothing is left); returns the stats.

        The signal handlers go in first, so that SIGTERM during start-up (schema check, SDK
        load: up to ~2 s) is a clean stop before the first claim, not the default kill.
        """
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal)
        try:
            return await self._run()
        finally:
            if self._pool_warnings is not None:
                self._pool_warnings.remove()
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

    async def _run(self) -> WorkerStats:
        await asyncio.to_thread(self.check_schema)
        self._cannot_run |= await prepare_for_worker(self.registry.get(ANTHROPIC_KIND))
        if self._stopping:  # asked to stop while starting: nothing was claimed
            return self.stats
        pool_size = min(self.concurrency + 3, POOL_SIZE_MAX)
        metrics.SLOTS.set(self.concurrency)
        # read when scraped: a set() at every claim and freed slot cost each job ~1 µs
        metrics.SLOTS_IN_USE.set_function(lambda: len(self._jobs.running))
        self._pool = WorkerPool(
            self.dsn,
            min_size=1,
            max_size=pool_size,
            kwargs={
                "autocommit": True,
                "prepare_threshold": self.settings.prepare_threshold,
                **CONNECTION_OPTIONS,
            },
            reconnect_timeout=POOL_RECONNECT_SECONDS,
            configure=configure_connection,
            open=False,
        )
        # the pool's warnings of an outage, one per connection and attempt: INFO (outage.py)
        self._pool_warnings = PoolWarnings(self._pool.name)
        self._pool_warnings.install()
        # one outage report, whichever loop sees it: the producer's claims, or the heartbeat,
        # the rescuer and the upkeep loops on this pool (found by a tester: a busy worker
        # reported none, and an idle one each upkeep loop's failure too)
        self._outage = OutageLog(self._pool_warnings, running=lambda: len(self._jobs.running))
        self._pool.outage = self._outage
        await self._pool.open(wait=True)
        self._completer = Completer(self._pool, self.settings, write_slots=max(1, pool_size - 3))
        self._completer.start()
        background: list[asyncio.Task[None]] = [
            asyncio.create_task(self._leases.heartbeat_loop(self._pool), name="pgqueue-heartbeat"),
            asyncio.create_task(self._leases.rescue_loop(self._pool), name="pgqueue-rescuer"),
        ]
        compact_every = self.settings.counters_compact_interval_seconds
        if compact_every is not None:
            background.append(
                asyncio.create_task(
                    upkeep.compact_loop(self._pool, compact_every, self._rng),
                    name="pgqueue-counters-compactor",
                )
            )
        vacuum_every = self.settings.hot_tables_vacuum_interval_seconds
        if vacuum_every is not None:
            background.append(
                asyncio.create_task(
                    upkeep.vacuum_loop(self._pool, vacuum_every, self._rng), name="pgqueue-vacuum"
                )
            )
            background.append(
                asyncio.create_task(
                    upkeep.analyze_loop(self._pool, ANALYZE_CHECK_SECONDS, self._rng),
                    name="pgqueue-analyze",
                )
            )
        poller = start_poller(self._pool, self.settings, self.worker_id, self._rng, self._stop)
        if poller is not None:
            background.append(poller)
        if self.listen:
            notifier = Notifier(
                self.dsn, self.wake, poll_interval_seconds=self.settings.poll_interval_seconds
            )
            background.append(asyncio.create_task(notifier.run(self._stop), name="pgqueue-listen"))
        try:
            await self._produce()
            await self._drain()
        finally:
            closing = asyncio.ensure_future(self._completer.aclose())
            if not await self._budget.wait([closing], "batched success write(s)"):
                await self._completer.abandon(shutdown.SETTLE_SECONDS)
            # their successes are written (or abandoned): let them count their outcomes
            await self._budget.wait([write for _job, write in self._jobs.flushing.values()])
            self._stop.set()
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self._close_handlers()
            await self._pool.close()
        threads = sync_handlers_running()
        if threads:
            # Found by a tester: the process then waited silently for the threads to return.
            log.warning(
                "%d synchronous handler(s) still running in a thread (timed out or interrupted: "
                "Python cannot stop a thread); the process exits when they return",
                threads,
            )
        return self.stats

    def check_schema(self) -> None:
        """Raise :class:`~pgqueue.errors.SchemaOutOfDate` unless the database's schema is at
        this version's head (:meth:`run` checks first; `pgqueue work` also checks before it says
        the worker started: found by a tester, it said "started", then failed)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            check_schema(conn)

    async def _drain(self) -> None:
        running = [task for _job, task in self._jobs.running.values()]
        # Successes waiting for their batched write get the grace period too (found by a
        # tester: one whose row was held for a moment got only the stop's last 10 s, and ran
        # again); what is left of them then goes with the completer's close, below _drain.
        flushing = [write for _job, write in self._jobs.flushing.values()]
        if not running and not flushing:
            return
        # A burst run ends here with nothing in flight; a stop request gives running jobs the
        # grace period (a hard stop ends it), then returns the rest to the queue (Interrupted).
        # After a hard stop, the jobs of a claim that returned after it are interrupted too, at
        # once (found by a tester: they ran on for the whole grace period).
        if self._hard_stop:
            self._jobs.cancel_handlers()
        else:
            # A run whose lease is lost (rescued, or superseded by this worker's newer claim of
            # the same job) can store nothing: it is not waited for (found by a tester: a stop
            # and a burst exit waited for such a run for the whole grace period).
            self._jobs.cancel_handlers(self._jobs.lost_runs())
        pending = await shutdown.wait_all(
            [*running, *flushing], self.settings.shutdown_grace_seconds, self._hard_stopped
        )
        still_running = [task for task in running if task in pending]
        in_threads = self._in_threads(still_running)
        others = [task for task in still_running if task not in in_threads]
        self._jobs.cancel_handlers(others)
        await self._budget.wait(others)
        if in_threads:
            # A thread cannot be stopped: its job keeps its lease (the heartbeat runs on) until
            # it returns, and is then recorded as it ended (found by a fault run: returned to
            # the queue at once, the job ran on another worker beside the thread).
            log.warning(
                "waiting for %d synchronous handler(s) to return (a thread cannot be stopped); "
                "their jobs keep their leases. Another signal ends the process now: their jobs "
                "then go back to the queue when their leases expire",
                len(in_threads),
            )
            await asyncio.wait(in_threads)
        await self._interrupt_unstarted()

    def _in_threads(self, tasks: list[asyncio.Task[None]]) -> list[asyncio.Task[None]]:
        """Those of ``tasks`` whose job's handler is a plain function, run in a thread."""
        return [
            task
            for job, task in self._jobs.running.values()
            if task in tasks
            and job.kind in self.registry
            and runs_in_thread(self.registry.get(job.kind))
        ]

    async def _interrupt_unstarted(self) -> None:
        """Return to the queue the jobs whose task was cancelled before its first step (a hard
        stop right after their claim): their ``_run_job`` never ran, so nothing recorded them.
        Found by a tester: they stayed ``running`` until their lease expired, and the rescue
        counted an attempt they never had."""
        unstarted = [job for job, task in self._jobs.running.values() if task.done()]
        if unstarted:
            log.info("returning %d job(s) claimed as the stop came to the queue", len(unstarted))
            await self._budget.wait([asyncio.ensure_future(self._interrupt(j)) for j in unstarted])

    async def _close_handlers(self) -> None:
        for kind in self.registry:
            closer = getattr(self.registry.get(kind), "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()
