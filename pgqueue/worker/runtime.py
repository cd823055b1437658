"""The worker's composition root: producer loop, executors, shutdown; heartbeats and rescue
are :mod:`pgqueue.worker.lease_keeper`'s, the stop's budget for final writes
:mod:`pgqueue.worker.shutdown`'s.

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
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from pgqueue.batches.lane import open_batches, park_claimed
from pgqueue.batches.startup import start_poller
from pgqueue.db import queries
from pgqueue.db.migrate import check_schema
from pgqueue.handlers.anthropic import KIND as ANTHROPIC_KIND
from pgqueue.handlers.anthropic import AnthropicMessagesHandler, prepare_for_worker
from pgqueue.handlers.registry import NOOP_KIND, Registry, noop
from pgqueue.models import Failed, Interrupted, Job, Outcome
from pgqueue.observability import metrics
from pgqueue.settings import Settings
from pgqueue.worker import shutdown, upkeep
from pgqueue.worker.completer import Completer, OutcomeAbandoned
from pgqueue.worker.connections import CONNECTION_OPTIONS, WorkerPool
from pgqueue.worker.decoding import Undecodable, configure_connection
from pgqueue.worker.executor import (
    SharedDeadline,
    execute,
    runs_in_thread,
    sync_handlers_running,
)
from pgqueue.worker.inflight import InFlight
from pgqueue.worker.lease_keeper import LeaseKeeper
from pgqueue.worker.notifier import Notifier
from pgqueue.worker.outage import (
    OUTAGE_PAUSE_SECONDS,
    POOL_RECONNECT_SECONDS,
    PRODUCER_RETRY_SECONDS,
    OutageLog,
)
from pgqueue.worker.transient import (
    first_line,
    is_held_row,
    is_transient,
    run_named,
    transient_retry,
)

log = logging.getLogger("pgqueue.worker")


def builtin_registry(settings: Settings) -> Registry:
    """The handlers every worker has: ``anthropic.messages`` and ``pgqueue.noop``."""
    registry = Registry()
    registry.register(ANTHROPIC_KIND, AnthropicMessagesHandler(settings))
    registry.register(NOOP_KIND, noop)
    return registry


def default_worker_id() -> str:
    """``host:pid:random`` — unique per process, readable in ``pgqueue.jobs.worker_id``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


#: The outcome of a job whose write failed or was given up (the rescuer puts the job back when
#: its lease expires): counted apart from lost leases.
UNRECORDED = "unrecorded"


@dataclass
class WorkerStats:
    """Counts of what one worker run did, by outcome (``succeeded``, ``queued``, ...)."""

    claimed: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    lost_leases: int = 0
    rescued: int = 0


class Worker:
    """One ``pgqueue work`` process.

    Args:
        dsn: where the queue lives.
        settings: tunables (lease, heartbeat, poll interval, grace period, retry policy).
        registry: handlers by kind; the built-ins are added under it.
        concurrency: jobs in flight at once (default ``settings.concurrency``).
        burst: exit when nothing is queued within ``settings.burst_horizon_seconds``.
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
            log.info(
                "stopping: no new claims; waiting up to %.0f s for %d job(s) to finish and be "
                "recorded",
                self.settings.shutdown_grace_seconds,
                self._jobs.waited_for(),
            )
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
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

    async def _run(self) -> WorkerStats:
        await asyncio.to_thread(self._check_schema)
        self._cannot_run |= await prepare_for_worker(self.registry.get(ANTHROPIC_KIND))
        if self._stopping:  # asked to stop while starting: nothing was claimed
            return self.stats
        pool_size = min(self.concurrency, 8) + 2
        metrics.SLOTS.set(self.concurrency)
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
            await self._budget.wait([task for _job, task in self._jobs.flushing.values()])
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

    def _check_schema(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            check_schema(conn)

    async def _produce(self) -> None:
        """Claim until stopped (or, in burst mode, until nothing is left to run).

        A database that stops answering does not end the worker: a claim that outlived
        :func:`transient_retry` is logged and tried again after a pause (until a stop), while
        the jobs already claimed run on, and their outcomes are retried by the completer.
        (Found by a tester: after an outage of over 30 s the worker exited 1 without draining
        its jobs, and their writes then failed on the closed pool.)
        """
        batch = min(self.concurrency, self.settings.claim_batch_max or self.concurrency)
        outage = OutageLog()
        while not self._stopping:
            tried = time.monotonic()
            try:
                more = await self._produce_once(batch)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                outage.failed(tried, exc, len(self._jobs.running))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), OUTAGE_PAUSE_SECONDS)
                continue
            outage.answered()
            if not more:
                return

    async def _produce_once(self, batch: int) -> bool:
        """One claim (when slots are free), then a wait for a reason to claim again; False when a
        burst worker has nothing left to run."""
        free = self.concurrency - len(self._jobs.running)
        fold = 0 < free < min(batch, self.concurrency // 2)
        if fold and self.settings.claim_fold_seconds > 0:
            # Busy: let a few more slots free up so that one claim takes several jobs.
            await asyncio.sleep(self.settings.claim_fold_seconds)
            free = self.concurrency - len(self._jobs.running)
        claimed = 0
        # Whatever woke the producer is answered now: by this claim or, with every slot
        # busy, by the claim a freed slot (it sets the event again) triggers. Left set while
        # every slot was busy, a wake-up made this loop spin at full CPU (found by a tester).
        self._wake.clear()
        if free > 0:
            want = min(free, batch)
            claimed = await self._claim(want)
            if claimed == want:
                return True  # the queue may hold more: claim again (at once if slots are free)
        timeout = self.settings.poll_interval_seconds * self._rng.uniform(0.8, 1.2)
        if self._blocked_seconds is not None and free > 0:
            # Work is due but the provider's limits are spent: wait for the refill.
            timeout = min(timeout, max(self._blocked_seconds, 0.01))
        elif free > 0 and claimed == 0:
            due = await self._next_due()
            if (
                self.burst
                # none that can be stored (found by a tester: successes still waiting for
                # their batched write, their rows held, got the stop's last 10 s only)
                and len(self._jobs.running) == len(self._jobs.lost_runs())
                and not self._jobs.flushing
                and (due is None or due > self.settings.burst_horizon_seconds)
                and self._pool is not None
                and not await open_batches(self._pool)  # the lane's jobs are not done yet
            ):
                if await self._leases.rescue_once(self._pool):
                    return True  # expired leases went back to the queue: run them first
                # The background rescuer may just have put jobs back (found by a tester:
                # a burst worker started beside expired leases exited with them queued).
                due = await self._next_due()
                if due is not None and due <= self.settings.burst_horizon_seconds:
                    return True
                left = await self._queued_kinds(sorted(self._cannot_run))
                if left:  # (found by a tester: it said so with none of them queued)
                    log.warning(
                        "burst: nothing left that this worker can run; jobs of kind %s stay "
                        "queued for a worker that can",
                        ", ".join(left),
                    )
                log.info("burst: nothing left to run; exiting")
                return False
            if due is not None:
                timeout = min(timeout, max(due, 0.01))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        return True

    async def _claim(self, limit: int) -> int:
        assert self._pool is not None
        params = {
            "limit": limit,
            "worker_id": self.worker_id,
            "lease_seconds": self.settings.lease_seconds,
            # their lanes are left to workers that can run them (nothing taken from a model's
            # buckets for a job this worker would put back)
            "skip_kinds": sorted(self._cannot_run),
        }
        started = time.perf_counter()
        rows = await run_named(
            self._pool,
            "job_claim",
            params,
            retry_seconds=PRODUCER_RETRY_SECONDS,
            connection_wait_seconds=PRODUCER_RETRY_SECONDS,
        )
        first = next((row for row in rows if row["id"] is not None), None)
        if first is not None and not first["durable"]:
            await self._make_durable(first)
        metrics.CLAIM_SECONDS.observe(time.perf_counter() - started)
        metrics.CLAIMS.inc()
        self._blocked_seconds = None
        claimed = 0
        by_tier: Counter[str] = Counter()
        to_batch: list[Job] = []
        # the jobs of one claim start together: one timer for their provider timeout
        deadline = SharedDeadline(self.settings.provider_timeout_seconds, len(rows))
        for row in rows:
            if row["id"] is None:  # the provider's limits stopped the batch
                self._blocked_seconds = float(row["blocked_seconds"])
                metrics.RATELIMIT_WAITS.inc()
                deadline.finish()
                continue
            claimed += 1
            payload = row["payload"]
            poison = payload if isinstance(payload, Undecodable) else None
            job = Job.from_row(row if poison is None else {**row, "payload": {}})
            by_tier[job.priority.value] += 1
            if row["to_batch"] and poison is None:  # the batches lane's: parked below, not run
                to_batch.append(job)
                deadline.finish()
                continue
            task = asyncio.create_task(
                self._run_job(job, deadline, poison), name=f"pgqueue-job-{job.id}"
            )
            if self._jobs.add(job, task):  # an earlier run of it here lost its lease
                self.stats.lost_leases += 1
            if self._stopping:
                # A claim under way when the stop came (found by a tester: one that waited out
                # an outage started its jobs after "no new claims"): its jobs never start, and
                # the drain returns them to the queue without using an attempt.
                task.cancel()
        if to_batch:
            await park_claimed(self._pool, to_batch, self.settings.batches_max_requests)
        for tier, count in by_tier.items():
            metrics.JOBS_CLAIMED.labels(tier).inc(count)
        self.stats.claimed += claimed
        metrics.SLOTS_IN_USE.set(len(self._jobs.running))
        return claimed

    async def _make_durable(self, row: dict[str, Any]) -> None:
        """Wait until the claim just received is flushed to disk (``job_claim_durable``), so
        that a crash of Postgres cannot lose a claim whose handlers run. If the database does
        not answer, the jobs run anyway (a claim lost then runs its jobs again, as before)."""
        assert self._pool is not None
        try:
            await run_named(
                self._pool,
                "job_claim_durable",
                {k: row[k] for k in ("id", "tenant_id", "lease_token")},
                retry_seconds=PRODUCER_RETRY_SECONDS,
                connection_wait_seconds=PRODUCER_RETRY_SECONDS,
            )
        except (psycopg.Error, PoolTimeout) as exc:
            log.warning("could not wait for the claim to be flushed (%s)", first_line(exc))

    async def _queued_kinds(self, kinds: list[str]) -> list[str]:
        """Which of ``kinds`` still have queued jobs (none asked: no statement); an empty list
        when the database cannot say (it only words a warning)."""
        if not kinds:
            return []
        assert self._pool is not None
        try:
            async with self._pool.connection(timeout=PRODUCER_RETRY_SECONDS) as conn:
                rows = await queries.arun(conn, "job_queued_kinds", {"kinds": kinds})
        except (psycopg.Error, PoolTimeout):
            return []
        return [str(r["kind"]) for r in rows]

    async def _next_due(self) -> float | None:
        assert self._pool is not None
        async for attempt in transient_retry(PRODUCER_RETRY_SECONDS):
            with attempt:
                async with self._pool.connection(timeout=PRODUCER_RETRY_SECONDS) as conn:
                    row = await queries.arun(
                        conn, "job_next_due", {"skip_kinds": sorted(self._cannot_run)}
                    )
        return None if row is None or row["seconds"] is None else float(row["seconds"])

    async def _run_job(
        self, job: Job, deadline: SharedDeadline, poison: Undecodable | None = None
    ) -> None:
        """Run ``job`` and record its outcome; a job whose payload could not be decoded
        (``poison``) is not run but failed for good, naming why, and its claim's other jobs run
        as usual."""
        assert self._completer is not None
        outcome: Outcome
        released = False
        lease = job.lease
        try:
            try:
                if poison is not None:
                    log.error("job %s: its payload cannot be decoded (%s)", job.id, poison.reason)
                    reason = f"payload cannot be decoded: {poison.reason}"
                    outcome = Failed(reason, 0.0, permanent=True)
                else:
                    outcome = await execute(job, self.registry, self.settings, self._rng, deadline)
            except asyncio.CancelledError:
                outcome = Interrupted()
            finally:
                deadline.finish()
            withdrawn = self._jobs.withdrawn.get(lease)
            if withdrawn is not None:
                log.info("job %s: %s while running; its handler was stopped", job.id, withdrawn)
                self._count(outcome, "cancelled")
                return
            if job.kind not in self.registry:  # no handler here: a burst worker won't wait
                self._cannot_run.add(job.kind)
            self._jobs.recording.add(lease)
            if len(self._jobs.flushing) < self.concurrency and self._completer.batches(
                job, outcome
            ):
                # Write-behind: the handler is done, so its slot frees now and the next claim
                # overlaps the flush that records this success. The lease stays held (the
                # heartbeat covers flushing jobs); at most `concurrency` wait like this.
                task = asyncio.current_task()
                assert task is not None
                self._jobs.flushing[lease] = (job, task)
                self._release(job)
                released = True
            written = self._completer.submit(job, outcome)
            try:
                state = await asyncio.shield(written)
            except asyncio.CancelledError:
                # The stop's budget for final writes ran out (or another signal came): the
                # write goes on, or is abandoned with the completer. The job counts when it
                # ends, as what it came to (found by testers: such jobs were in no count, then
                # counted unrecorded though their write committed a moment later).
                written.add_done_callback(lambda done: self._count_late(job, outcome, done))
                raise
            except Exception as exc:
                if (
                    is_transient(exc)
                    or is_held_row(exc)
                    or isinstance(exc, OutcomeAbandoned | PoolClosed)
                ):
                    # The database did not answer for the whole retry window (the producer
                    # reports the outage), or a stop gave up waiting for it (the stop says
                    # how many): no traceback for each job (found by a tester).
                    log.warning(
                        "job %s: could not record its outcome (%s); it runs again when its "
                        "lease expires",
                        job.id,
                        first_line(exc),
                    )
                else:
                    log.exception("job %s: could not record its outcome; the rescuer will", job.id)
                state = UNRECORDED
            self._count(outcome, state)
        finally:
            self._jobs.forget(job)
            if not released:
                self._release(job)

    def _count_late(self, job: Job, outcome: Outcome, write: asyncio.Future[str | None]) -> None:
        """Count ``job``'s outcome when its write ends after its task was cancelled (a stop
        gave up waiting for it), saying so in one line if it was not recorded."""
        state = _written(write)
        if state == UNRECORDED:
            error = None if write.cancelled() else write.exception()
            log.warning(
                "job %s: could not record its outcome (%s); it runs again when its lease expires",
                job.id,
                "abandoned" if error is None else first_line(error),
            )
        self._count(outcome, state)

    def _release(self, job: Job) -> None:
        """Free the job's slot and wake the producer."""
        self._jobs.release(job.lease)
        metrics.SLOTS_IN_USE.set(len(self._jobs.running))
        self._wake.set()

    async def _drain(self) -> None:
        running = [task for _job, task in self._jobs.running.values()]
        # Successes waiting for their batched write get the grace period too (found by a
        # tester: one whose row was held for a moment got only the stop's last 10 s, and ran
        # again); what is left of them then goes with the completer's close, below _drain.
        flushing = [task for _job, task in self._jobs.flushing.values()]
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
            running + flushing, self.settings.shutdown_grace_seconds, self._hard_stopped
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
            await self._budget.wait([asyncio.ensure_future(self._interrupt(j)) for j in unstarted])

    async def _interrupt(self, job: Job) -> None:
        assert self._completer is not None
        try:
            state = await self._completer.record(job, Interrupted())
        except Exception:
            log.exception("job %s: could not return it to the queue; the rescuer will", job.id)
            state = UNRECORDED
        finally:
            self._release(job)
        self._count(Interrupted(), state)

    def _count(self, outcome: Outcome, state: str | None) -> None:
        """Count an outcome: ``state`` as recorded, None when the lease was lost, or
        ``UNRECORDED`` when the write failed or was given up (found by a tester: those were
        counted as lost leases)."""
        self.stats.outcomes[state or "lease_lost"] += 1
        metrics.count_outcome(outcome, state)

    async def _close_handlers(self) -> None:
        for kind in self.registry:
            closer = getattr(self.registry.get(kind), "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()


def _written(write: asyncio.Future[str | None]) -> str | None:
    """What an outcome write came to: the state recorded (None: the lease was lost), or
    ``UNRECORDED`` when it failed or was abandoned."""
    if write.cancelled() or write.exception() is not None:
        return UNRECORDED
    return write.result()
