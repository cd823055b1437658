"""Writes outcomes back, fenced by the lease token, shielded from cancellation.

Every write is guarded (``state = 'running' AND lease_token = …``): a worker that lost its
lease cannot overwrite what the job's new owner wrote; its outcome is logged and dropped.
Transient database errors (deadlock, serialization failure, dropped connection) are retried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, assert_never

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from pgqueue.db import queries
from pgqueue.handlers.anthropic import KIND as ANTHROPIC_KIND
from pgqueue.models import Deferred, Failed, Interrupted, Job, Outcome, Succeeded, Throttled
from pgqueue.scheduling.ratelimit import LimitHeader, parse_ratelimit_headers
from pgqueue.settings import Settings
from pgqueue.validation import storable_text
from pgqueue.worker.transient import (
    HELD_ROW_WAIT_MS,
    first_line,
    is_held_row,
    is_transient,
    run_named,
    transient_retry,
)

log = logging.getLogger("pgqueue.worker")

#: The longest error text recorded for a job.
_MAX_ERROR_CHARS = 2000

#: One success for :func:`success_batch`: job id, tenant id, lease token, the handler's result
#: (a JSON-able dict or None), input and output tokens (or None).
Success = tuple[int, str, str, dict[str, Any] | None, int | None, int | None]


def success_batch(successes: Iterable[Success]) -> dict[str, Jsonb]:
    """Parameters of the named query ``job_complete_many``: the successes as ONE jsonb object
    ``{"<id>": [tenant_id, lease_token, result, input_tokens, output_tokens]}``, encoded when
    the statement is sent (a result ``json`` cannot encode fails that statement: the completer
    then records the jobs one by one, so that only that job fails)."""
    return {"batch": Jsonb({str(s[0]): [s[1], s[2], s[3], s[4], s[5]] for s in successes})}


class Completer:
    """Records each job's outcome with one guarded statement, batching successes.

    :meth:`record` returns the job's new state (``succeeded``, ``queued``, ``failed``), or
    ``None`` when the lease was lost and the outcome dropped. Successes of jobs that do not
    feed the rate limiter are written by one flusher task, many per statement: when idle each
    is written at once, under load whatever accumulated during the previous write goes in the
    next (group commit). :meth:`start` before use, :meth:`aclose` to flush and stop.
    """

    #: At most this many successes per statement.
    MAX_BATCH = 500

    def __init__(
        self, pool: AsyncConnectionPool[Any], settings: Settings, write_slots: int | None = None
    ) -> None:
        self._pool = pool
        self._settings = settings
        # Outcome writes of their own (failures, retries, throttles, successes the limiter
        # learns from) hold at most this many pooled connections at once, so that the producer
        # and the heartbeat always find one. Writes waiting on rows another transaction holds
        # (a user's cancel or UPDATE in an open transaction) used to take every connection: the
        # heartbeat then could not extend any lease, and the jobs would run twice once their
        # leases expired (found by a tester). The worker gives the pool's size less three
        # (producer, heartbeat, the batch flusher), at least one; None: no bound.
        self._write_slots = asyncio.Semaphore(write_slots or 1_000_000)
        # How long an outcome write is retried on transient errors: while the job's lease may
        # still hold (the last heartbeat extended it by a lease), at least 30 s. A write that
        # lands after a rescue is fenced off anyway; one given up makes the job run again once
        # its lease expires (found by a tester: after a 60 s outage every job that finished
        # during it ran twice).
        self._retry_seconds = max(30.0, settings.lease_seconds - settings.heartbeat_seconds)
        self._pending: list[tuple[Job, Succeeded, asyncio.Future[str | None]]] = []
        self._ready = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._closing = False
        # writes of single outcomes under way, shielded from their caller's cancellation
        self._writes: set[asyncio.Task[str | None]] = set()

    def start(self) -> None:
        """Start the flusher task (on the running loop)."""
        self._flusher = asyncio.create_task(self._flush_loop(), name="pgqueue-completer")

    async def aclose(self) -> None:
        """Write every pending success, then stop the flusher; wait for the single writes
        still under way (their callers may have been cancelled), so that none is cut off by the
        pool closing after this."""
        self._closing = True
        self._ready.set()
        if self._flusher is not None:
            await self._flusher
        while self._writes:
            await asyncio.wait(set(self._writes))

    async def abandon(self, settle_seconds: float = 0.05) -> None:
        """Stop writing: cancel the flusher and the single writes under way, and fail the
        successes still waiting for a batch (a stopping worker whose database does not answer;
        their jobs go back to the queue when their leases expire). Returns once the cancelled
        writes have ended, or after ``settle_seconds``, so that what waits on them (the
        worker's counts) hears of it before the worker reports."""
        self._closing = True
        ending: list[asyncio.Future[Any]] = []
        if self._flusher is not None:
            self._flusher.cancel()
            ending.append(self._flusher)
        for write in list(self._writes):
            write.cancel()
            ending.append(write)
        _fail_abandoned(self._pending)
        self._pending.clear()
        if ending:
            await asyncio.wait(ending, timeout=settle_seconds)
        await asyncio.sleep(0)  # their done callbacks run

    def batches(self, job: Job, outcome: Outcome) -> bool:
        """Whether :meth:`record` writes this outcome with the next batch (a success that
        teaches the rate limiter nothing), rather than with a statement of its own."""
        return (
            isinstance(outcome, Succeeded)
            and self._flusher is not None
            and not self._flusher.done()
            and self._limiter_statement(job, outcome) is None
        )

    async def record(self, job: Job, outcome: Outcome) -> str | None:
        """Write ``outcome`` for ``job``; survives cancellation of the calling task."""
        return await asyncio.shield(self.submit(job, outcome))

    def submit(self, job: Job, outcome: Outcome) -> asyncio.Future[str | None]:
        """Start writing ``outcome`` for ``job``: the future of that write (the state recorded,
        None when the lease was lost), which the caller's cancellation does not cancel."""
        if isinstance(outcome, Succeeded) and self.batches(job, outcome):
            future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
            self._pending.append((job, outcome, future))
            self._ready.set()
            return future  # the flusher task writes the batch whatever happens to the caller
        write = asyncio.ensure_future(self._record(job, outcome))
        self._writes.add(write)

        def done(task: asyncio.Task[str | None]) -> None:
            self._writes.discard(task)
            if not task.cancelled():
                task.exception()  # retrieved: no "never retrieved" warning if nobody waits

        write.add_done_callback(done)
        return write

    async def _flush_loop(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._pending:
                batch = self._pending[: self.MAX_BATCH]
                del self._pending[: len(batch)]
                try:
                    await self._flush(batch)
                except asyncio.CancelledError:  # abandoned (abandon()): nobody writes these now
                    _fail_abandoned(batch)
                    raise
            if self._closing:
                return

    async def _flush(self, batch: list[tuple[Job, Succeeded, asyncio.Future[str | None]]]) -> None:
        try:
            params = success_batch(
                (job.id, job.tenant_id, job.lease_token, o.result, o.input_tokens, o.output_tokens)
                for job, o, _f in batch
            )
            rows = await run_named(
                self._pool, "job_complete_many", params, retry_seconds=self._retry_seconds
            )
        except Exception as exc:
            if is_transient(exc):  # still failing after the retries: the rescuer will
                for _job, _o, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                return
            # One job's result can make the whole statement fail (a NUL character, a value
            # json cannot encode, a batch over jsonb's 256 MB): record the jobs one by one,
            # so that only that job fails.
            log.warning(
                "batched completion of %d job(s) failed (%s); recording them one by one",
                len(batch),
                first_line(exc),
            )
            for job, outcome, future in batch:
                await self._record_alone(job, outcome, future)
            return
        recorded = {(row["id"], row["lease_token"]) for row in rows}
        for job, outcome, future in batch:
            if job.lease in recorded:
                if not future.done():
                    future.set_result("succeeded")
                continue
            # Not recorded: its lease was lost, or another transaction held the row (the batch
            # skips held rows, so that one cannot stop the others). Written on its own, in a
            # task of its own, so that the flusher goes on: it waits for the row if held, and
            # finds nothing if the lease was lost (or the job cancelled; it says which).
            self._write_alone(job, outcome, future)

    def _write_alone(
        self, job: Job, outcome: Succeeded, future: asyncio.Future[str | None]
    ) -> None:
        """:meth:`_record_alone` in a task of its own, awaited by :meth:`aclose`; cancelled by
        :meth:`abandon`, it fails the wait as an abandoned write."""
        write = asyncio.ensure_future(self._record_alone(job, outcome, future))
        self._writes.add(write)

        def done(task: asyncio.Future[None]) -> None:
            self._writes.discard(task)
            if task.cancelled():
                _fail_abandoned([(job, outcome, future)])

        write.add_done_callback(done)

    async def _record_alone(
        self, job: Job, outcome: Succeeded, future: asyncio.Future[str | None]
    ) -> None:
        """Record one success of a failed batch; a success that cannot be stored is recorded
        as a permanent failure naming the reason, so the job is not run again."""
        try:
            state = await self._record(job, outcome)
        except Exception as exc:
            # A row held past the retry window is not a result that cannot be stored: the job
            # comes back when its lease expires (found by a tester: a success held ~2 minutes
            # was recorded as a permanent failure once the hold ended).
            if is_transient(exc) or is_held_row(exc):
                if not future.done():
                    future.set_exception(exc)
                return
            log.error(
                "job %s: its result could not be stored (%s); job failed", job.id, first_line(exc)
            )
            reason = f"the handler's result could not be stored: {exc}"[:_MAX_ERROR_CHARS]
            try:
                state = await self._record(job, Failed(reason, 0.0, permanent=True))
            except Exception as again:
                if not future.done():
                    future.set_exception(again)
                return
        if not future.done():
            future.set_result(state)

    async def _record(self, job: Job, outcome: Outcome) -> str | None:
        name, params, success_state = self._statement(job, outcome)
        limiter = self._limiter_statement(job, outcome)
        written = False
        result: Any = None
        async for attempt in transient_retry(self._retry_seconds, held_rows=True):
            with attempt:
                async with self._write_slots, self._pool.connection() as conn:
                    # A retry after the job's own statement committed runs only the limiter's:
                    # run again, the fenced job statement found nothing and the recorded
                    # outcome was reported as a lost lease (found by a tester).
                    if not written:
                        # A row another transaction holds (a user's cancel or UPDATE left
                        # open) is waited for briefly, then let go of: the write slot and the
                        # connection go back, and the write is tried again after a pause
                        # (found by a tester: seven held rows took every write slot, and the
                        # worker stopped for every tenant).
                        async with conn.transaction():
                            await queries.arun(
                                conn, "session_lock_timeout", {"ms": HELD_ROW_WAIT_MS}
                            )
                            result = await queries.arun(conn, name, params)
                        written = True
                    if limiter is not None:
                        await queries.arun(conn, *limiter)
        if success_state is not None:
            state = success_state if result else None
        else:
            state = None if result is None else str(result["state"])
        if state is None:
            withdrawn = await self._withdrawn(job)
            if withdrawn is not None:
                log.info("job %s: %s while running; its outcome was dropped", job.id, withdrawn)
                return "cancelled"
            log.warning(
                "job %s: lease lost before its outcome was recorded; outcome dropped", job.id
            )
        return state

    async def _withdrawn(self, job: Job) -> str | None:
        """Why an outcome write found no row, when the job was withdrawn: ``"cancelled"``
        (``pgqueue.cancel``) or ``"deleted"`` (no such row any more), rather than rescued after
        a lost lease (found by a tester: cancellations were logged as lost leases, a warning
        operators alert on). None when it was not, or cannot be told."""
        try:
            async with self._write_slots, self._pool.connection() as conn:
                rows = await queries.arun(conn, "job_lease_states", {"ids": [job.id]})
        except psycopg.Error:
            return None
        if not rows:
            return "deleted"
        return "cancelled" if rows[0]["state"] == "cancelled" else None

    def _limiter_statement(self, job: Job, outcome: Outcome) -> tuple[str, dict[str, Any]] | None:
        """What the shared rate limiter learns from this outcome (rate-limited jobs only)."""
        if job.kind != ANTHROPIC_KIND or job.model is None:
            return None
        if isinstance(outcome, Succeeded):
            seen = parse_ratelimit_headers(outcome.headers)
            none = LimitHeader(None, None, None)
            requests = seen.get("requests", none)
            inputs = seen.get("input-tokens", none)
            outputs = seen.get("output-tokens", none)
            reserved = job.payload.get("max_tokens")
            return (
                "ratelimit_observe",
                {
                    "model": job.model,
                    "requests_limit": requests.limit,
                    "requests_remaining": requests.remaining,
                    "input_limit": inputs.limit,
                    "input_remaining": inputs.remaining,
                    "output_limit": outputs.limit,
                    "output_remaining": outputs.remaining,
                    "estimated_input": job.est_input_tokens,
                    "actual_input": outcome.input_tokens,
                    "reserved_output": reserved if isinstance(reserved, int) else None,
                    "actual_output": outcome.output_tokens,
                },
            )
        if isinstance(outcome, Deferred):  # not sent: give back what the claim took
            reserved = job.payload.get("max_tokens")
            return (
                "ratelimit_release",
                {
                    "model": job.model,
                    "estimated_input": job.est_input_tokens,
                    "reserved_output": reserved if isinstance(reserved, int) else 0,
                },
            )
        if isinstance(outcome, Throttled):
            hint = outcome.retry_after_seconds
            seconds = hint or self._settings.default_retry_after_seconds
            return ("ratelimit_cooldown", {"model": job.model, "seconds": seconds})
        return None

    def _statement(self, job: Job, outcome: Outcome) -> tuple[str, dict[str, Any], str | None]:
        """The named query recording ``outcome``, its parameters, and the state it records
        when the statement does not return one. Error text is made storable here, the one
        place every outcome passes (:func:`storable_text`)."""
        key = {"id": job.id, "tenant_id": job.tenant_id, "lease_token": job.lease_token}
        match outcome:
            case Succeeded(result=result, input_tokens=itok, output_tokens=otok):
                return (
                    "job_complete",
                    {
                        **key,
                        "result": None if result is None else Jsonb(result),
                        "input_tokens": itok,
                        "output_tokens": otok,
                    },
                    "succeeded",
                )
            case Failed(error=error, retry_in_seconds=delay, permanent=permanent):
                return (
                    "job_retry",
                    {
                        **key,
                        "error": storable_text(error, _MAX_ERROR_CHARS),
                        "delay_seconds": delay,
                        "permanent": permanent,
                    },
                    None,
                )
            case Throttled(
                error=error, wait_seconds=wait, status_code=status, retry_after_seconds=hint
            ):
                return (
                    "job_throttle",
                    {
                        **key,
                        "error": storable_text(error, _MAX_ERROR_CHARS),
                        "wait_seconds": wait,
                        "status_code": status,
                        "retry_after_seconds": hint,
                        "max_throttle_wait_seconds": _hours_to_seconds(
                            self._settings.max_throttle_wait_hours
                        ),
                    },
                    None,
                )
            case Interrupted(reason=reason):
                error = storable_text(reason, _MAX_ERROR_CHARS)
                return ("job_interrupt", {**key, "error": error, "delay_seconds": 0.0}, "queued")
            case Deferred(reason=reason, delay_seconds=delay):
                error = storable_text(reason, _MAX_ERROR_CHARS)
                return ("job_interrupt", {**key, "error": error, "delay_seconds": delay}, "queued")
            case _:
                assert_never(outcome)


def _hours_to_seconds(hours: float | None) -> float | None:
    """Hours as seconds (None stays None: no bound)."""
    return None if hours is None else hours * 3600.0


class OutcomeAbandoned(Exception):
    """A stopping worker gave up writing this outcome (its database did not answer in time);
    the job goes back to the queue when its lease expires."""


def _fail_abandoned(batch: list[tuple[Job, Succeeded, asyncio.Future[str | None]]]) -> None:
    """Fail the waits of successes a stopping worker abandoned (their callers record nothing)."""
    gone = OutcomeAbandoned("the worker stopped before this outcome was written")
    for _job, _outcome, future in batch:
        if not future.done():
            future.set_exception(gone)
