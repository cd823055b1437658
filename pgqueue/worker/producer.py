"""The producer: the only part of a worker that claims. It wakes on NOTIFY, a jittered poll, a
freed slot or the next due ``run_at``, claims at most the free slots (at most
``claim_batch_max`` at once), starts one task per claimed job, and decides when a burst worker
has nothing left to run. A database that stops answering pauses it; it does not end it.

:class:`Producer` is one part of :class:`pgqueue.worker.runtime.Worker`, which sets the state
declared here and calls :meth:`Producer._produce` until a stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from pgqueue.batches.lane import open_batches, park_claimed
from pgqueue.db import queries
from pgqueue.errors import InvalidSetting
from pgqueue.models import Job
from pgqueue.observability import metrics
from pgqueue.worker.decoding import Undecodable
from pgqueue.worker.executor import SharedDeadline
from pgqueue.worker.lease_keeper import LeaseKeeper
from pgqueue.worker.outage import (
    BAD_SETTING_PAUSE_SECONDS,
    OUTAGE_PAUSE_SECONDS,
    PRODUCER_RETRY_SECONDS,
    BadSettingLog,
    OutageLog,
    PoolWarnings,
)
from pgqueue.worker.runs import JobRuns
from pgqueue.worker.transient import first_line, is_transient, run_named, transient_retry

log = logging.getLogger("pgqueue.worker")

#: How often a worker checks every ``pgqueue.*`` setting (seconds; and when it starts).
SETTINGS_CHECK_SECONDS = 30.0
#: An idle burst worker waits this long past the end of another worker's lease, so that the
#: rescue it runs next finds the lease expired.
LEASE_END_MARGIN_SECONDS = 0.05


@contextlib.contextmanager
def _setting_errors_typed() -> Iterator[None]:
    """A malformed ``pgqueue.*`` setting (SQLSTATE PQ012) raised inside as
    :class:`InvalidSetting`, with the server's one-line message; other errors as they are."""
    try:
        yield
    except psycopg.Error as exc:
        if exc.sqlstate != InvalidSetting.sqlstate:
            raise
        raise InvalidSetting(exc.diag.message_primary or first_line(exc)) from None


class Producer(JobRuns):
    """Claims jobs for the free slots and starts them (a part of
    :class:`~pgqueue.worker.runtime.Worker`, whose ``__init__`` sets these attributes)."""

    worker_id: str
    burst: bool
    _stop: asyncio.Event
    _stopping: bool
    _leases: LeaseKeeper
    # seconds until the provider's limits have room again, from the last claim (None: room)
    _blocked_seconds: float | None
    _pool: AsyncConnectionPool[Any] | None
    _pool_warnings: PoolWarnings | None
    # the worker's outage report, which every loop starts and ends (outage.py)
    _outage: OutageLog
    # monotonic time of the last pgqueue.settings_check that passed (None: not yet)
    _settings_checked: float | None = None
    # whether a claim statement is under way (its jobs go back to the queue after a stop)
    _claiming: bool = False
    # monotonic time an idle burst worker began to wait for other workers' leases (None: not yet)
    _lease_wait_started: float | None = None

    async def _produce(self) -> None:
        """Claim until stopped (or, in burst mode, until nothing is left to run).

        A database that stops answering does not end the worker: a claim that outlived
        :func:`transient_retry` is logged and tried again after a pause (until a stop), while
        the jobs already claimed run on, and their outcomes are retried by the completer.
        (Found by a tester: after an outage of over 30 s the worker exited 1 without draining
        its jobs, and their writes then failed on the closed pool.)

        A malformed ``pgqueue.*`` setting (:class:`InvalidSetting`) pauses claims the same way:
        one error line names it, the pool's connections are replaced (they read ``ALTER
        DATABASE`` settings when they open), and claims resume once it is fixed; a burst
        worker stops with the error instead.
        """
        batch = min(self.concurrency, self.settings.claim_batch_max or self.concurrency)
        outage = self._outage
        bad_setting = BadSettingLog()
        while not self._stopping:
            tried = time.monotonic()
            try:
                more = await self._produce_once(batch)
            except InvalidSetting as exc:
                if self.burst:
                    raise  # one line from the CLI, exit 1: a burst run cannot finish
                bad_setting.failed(exc)
                if self._pool is not None:
                    await self._pool.drain()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), BAD_SETTING_PAUSE_SECONDS)
                continue
            except Exception as exc:
                if not is_transient(exc):
                    raise
                outage.failed(tried, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), OUTAGE_PAUSE_SECONDS)
                continue
            bad_setting.answered()
            if not more:
                return

    async def _produce_once(self, batch: int) -> bool:
        """One claim (when slots are free), then a wait for a reason to claim again; False when a
        burst worker has nothing left to run."""
        await self._check_settings()
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
            self._claiming = True
            try:
                claimed = await self._claim(want)
            finally:
                self._claiming = False
            if claimed == want:
                return True  # the queue may hold more: claim again (at once if slots are free)
        timeout = self.settings.poll_interval_seconds * self._rng.uniform(0.8, 1.2)
        if self._blocked_seconds is not None and free > 0:
            # Work is due but the provider's limits are spent: wait for the refill.
            timeout = min(timeout, max(self._blocked_seconds, 0.01))
        elif free > 0 and claimed == 0:
            due = await self._next_due()
            horizon = self.settings.burst_horizon_seconds
            if (
                self.burst
                and due is not None
                and due <= horizon
                and self._idle()
                and await self._learn_unhandled_kinds()
            ):
                due = await self._next_due()  # without the jobs of the kinds just learned
            if (
                self.burst
                and self._idle()
                and (due is None or due > horizon)
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
                due = await self._lease_wait()
                if due is None:
                    await self._say_what_is_left()
                    log.info("burst: nothing left to run; exiting")
                    return False
            if due is not None:
                timeout = min(timeout, max(due, 0.01))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        return True

    async def _check_settings(self) -> None:
        """Every :data:`SETTINGS_CHECK_SECONDS`, ``pgqueue.settings_check``: a malformed
        ``pgqueue.*`` setting raises :class:`InvalidSetting` before a claim, not when a sent
        job's outcome is written (a tester: a bad ``demotion_throttle_threshold`` failed only
        the completion, and each rescue sent the request again)."""
        now = time.monotonic()
        if self._settings_checked is not None and now < (
            self._settings_checked + SETTINGS_CHECK_SECONDS
        ):
            return
        assert self._pool is not None
        # never prepared (a run every 30 s gains nothing from it): behind a pooler in
        # transaction mode the claim stays this connection's first prepared statement, whose
        # clash names the setting to change (tests/worker/test_pgbouncer.py)
        with _setting_errors_typed():
            async with self._pool.connection(timeout=PRODUCER_RETRY_SECONDS) as conn:
                await queries.arun(conn, "settings_check", {}, prepare=False)
        self._outage.answered()
        self._settings_checked = now

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
        with _setting_errors_typed():
            rows = await run_named(
                self._pool,
                "job_claim",
                params,
                retry_seconds=PRODUCER_RETRY_SECONDS,
                connection_wait_seconds=PRODUCER_RETRY_SECONDS,
            )
        # (a busy producer claims nothing: only a statement that succeeded ends an outage)
        self._outage.answered()
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
            by_tier[row["priority"]] += 1
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
            metrics.count_claimed(tier, count)
        self.stats.claimed += claimed
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

    def _idle(self) -> bool:
        """Whether no job of this worker can still be stored: none running (but those whose
        lease is lost), none waiting for its batched write (found by a tester: successes still
        waiting for their write, their rows held, got the stop's last 10 s only)."""
        return len(self._jobs.running) == len(self._jobs.lost_runs()) and not self._jobs.flushing

    async def _learn_unhandled_kinds(self) -> bool:
        """Add to the kinds this worker cannot run those of queued jobs due within the burst
        horizon that have no handler here; whether there were any. Found by a tester: a burst
        worker waited 60 s, silent, for a job that an earlier run had put back for want of a
        handler, then put it back again."""
        assert self._pool is not None
        params = {
            "kinds": sorted(set(self.registry) | self._cannot_run),
            "horizon_seconds": min(self.settings.burst_horizon_seconds, 1e9),
        }
        try:
            async with self._pool.connection(timeout=PRODUCER_RETRY_SECONDS) as conn:
                rows = await queries.arun(conn, "job_due_kinds_besides", params)
        except (psycopg.Error, PoolTimeout):
            return False  # the burst worker waits for them, as before
        self._cannot_run.update(str(r["kind"]) for r in rows)
        return bool(rows)

    async def _lease_wait(self) -> float | None:
        """For an idle burst worker with nothing queued within the horizon: seconds to wait for
        the earliest lease of another worker's running job to end (then the rescue puts the job
        back, and this worker runs it), or None to exit. Found by a tester: `work --burst` right
        after a worker was killed said "nothing left to run" while that worker's jobs were
        still ``running`` under leases that ended 8 s later. A lease ending within
        ``burst_horizon_seconds`` is waited for, as a job due then; a live worker's heartbeat
        moves its leases on, so the waits for leases take at most that horizon in all, from
        the first. On exit, the jobs left under other leases are said (INFO); none when the
        database cannot say."""
        assert self._pool is not None
        params = {"worker_id": self.worker_id, "skip_kinds": sorted(self._cannot_run)}
        try:
            async with self._pool.connection(timeout=PRODUCER_RETRY_SECONDS) as conn:
                row = await queries.arun(conn, "job_leases_elsewhere", params)
        except (psycopg.Error, PoolTimeout):
            return None
        if row is None or row["seconds"] is None:
            return None
        seconds = float(row["seconds"])
        horizon = self.settings.burst_horizon_seconds
        now = time.monotonic()
        started = self._lease_wait_started
        if seconds <= horizon and (started is None or now - started < horizon):
            if started is None:
                self._lease_wait_started = now
            # just past the end: the rescue at the next round finds the lease expired
            return max(seconds, 0.0) + LEASE_END_MARGIN_SECONDS
        log.info(
            "burst: left %d job(s) running under other workers' leases, the earliest ending in "
            "%.0f s; they come back to the queue if their worker is gone",
            row["jobs"],
            max(seconds, 0.0),
        )
        return None

    async def _say_what_is_left(self) -> None:
        """At a burst exit, one warning per reason for the queued jobs of kinds this worker
        cannot run (none queued: nothing said; found by a tester: it warned with none of them
        queued); nothing when the database cannot say."""
        kinds = sorted(self._cannot_run)
        if not kinds:
            return
        assert self._pool is not None
        try:
            async with self._pool.connection(timeout=PRODUCER_RETRY_SECONDS) as conn:
                rows = await queries.arun(conn, "job_queued_kinds", {"kinds": kinds})
        except (psycopg.Error, PoolTimeout):
            return
        left = {str(r["kind"]): int(r["jobs"]) for r in rows}
        for no_handler, why in ((True, "without a handler"), (False, "this worker cannot run")):
            these = {k: n for k, n in left.items() if (k not in self.registry) == no_handler}
            if these:
                total = sum(these.values())
                log.warning(
                    "burst: left %d queued job%s of kinds %s: %s; they stay queued for a "
                    "worker that can run them",
                    total,
                    "" if total == 1 else "s",
                    why,
                    ", ".join(these),
                )

    async def _next_due(self) -> float | None:
        assert self._pool is not None
        async for attempt in transient_retry(PRODUCER_RETRY_SECONDS):
            with attempt:
                async with self._pool.connection(timeout=PRODUCER_RETRY_SECONDS) as conn:
                    row = await queries.arun(
                        conn, "job_next_due", {"skip_kinds": sorted(self._cannot_run)}
                    )
        return None if row is None or row["seconds"] is None else float(row["seconds"])
