"""Running one claimed job to a counted outcome: the handler (or, for a payload that cannot be
decoded, a permanent failure), the outcome's write through the completer, the slot freed, and
the count in the worker's stats and metrics; also the write of Interrupted for jobs a stop
returns to the queue.

:class:`JobRuns` is one part of :class:`pgqueue.worker.runtime.Worker`, which sets the state
declared here; the producer (:mod:`pgqueue.worker.producer`) starts one :meth:`JobRuns._run_job`
task per claimed job.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from dataclasses import dataclass, field

from psycopg_pool import PoolClosed

from pgqueue.handlers.registry import Registry
from pgqueue.models import Failed, Interrupted, Job, Outcome
from pgqueue.observability import metrics
from pgqueue.settings import Settings
from pgqueue.worker.completer import Completer, OutcomeAbandoned
from pgqueue.worker.decoding import Undecodable
from pgqueue.worker.executor import SharedDeadline, execute
from pgqueue.worker.inflight import InFlight
from pgqueue.worker.transient import first_line, is_held_row, is_transient

log = logging.getLogger("pgqueue.worker")

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


class JobRuns:
    """Runs claimed jobs and counts their outcomes (a part of
    :class:`~pgqueue.worker.runtime.Worker`, whose ``__init__`` sets these attributes)."""

    settings: Settings
    registry: Registry
    concurrency: int
    stats: WorkerStats
    _rng: random.Random
    # set when a slot frees: the producer claims again
    _wake: asyncio.Event
    # the jobs this worker holds, by lease
    _jobs: InFlight
    # kinds this worker cannot run: a burst worker does not wait for their jobs
    _cannot_run: set[str]
    _completer: Completer | None

    async def _run_job(
        self, job: Job, deadline: SharedDeadline, poison: Undecodable | None = None
    ) -> None:
        """Run ``job`` and record its outcome; a job whose payload could not be decoded
        (``poison``) is not run but failed for good, naming why, and its claim's other jobs run
        as usual."""
        assert self._completer is not None
        outcome: Outcome
        write_behind = False
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
            behind = len(self._jobs.flushing) < self.concurrency and self._completer.batches(
                job, outcome
            )
            written = self._completer.submit(job, outcome)
            if behind:
                # Write-behind: the handler is done, so its slot frees now and the next claim
                # overlaps the flush that records this success. The lease stays held (the
                # heartbeat covers flushing jobs); at most `concurrency` wait like this. No
                # task waits for the write: the job is counted when it ends (a task and a
                # shield per job were a tenth of a no-op job's CPU in the worker).
                self._jobs.flushing[lease] = (job, written)
                written.add_done_callback(lambda done: self._write_ended(job, outcome, done))
                self._release(job)
                write_behind = True
                return
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
                state = self._not_recorded(job, exc)
            self._count(outcome, state)
        finally:
            if not write_behind:
                self._jobs.forget(job)
                self._release(job)

    def _write_ended(self, job: Job, outcome: Outcome, write: asyncio.Future[str | None]) -> None:
        """Count a write-behind success when its batched write ends, and forget its lease."""
        if write.cancelled():  # a stop gave up waiting for it
            self._count_late(job, outcome, write)
        else:
            error = write.exception()
            self._count(
                outcome, write.result() if error is None else self._not_recorded(job, error)
            )
        self._jobs.forget(job)

    def _not_recorded(self, job: Job, error: BaseException) -> str:
        """Say that ``job``'s outcome write failed with ``error``; returns :data:`UNRECORDED`."""
        if (
            is_transient(error)
            or is_held_row(error)
            or isinstance(error, OutcomeAbandoned | PoolClosed)
        ):
            # The database did not answer for the whole retry window (the producer reports the
            # outage), or a stop gave up waiting for it (the stop says how many): no traceback
            # for each job (found by a tester).
            log.warning(
                "job %s: could not record its outcome (%s); it runs again when its lease expires",
                job.id,
                first_line(error),
            )
        else:
            log.error(
                "job %s: could not record its outcome; the rescuer will", job.id, exc_info=error
            )
        return UNRECORDED

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
        self._wake.set()

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


def _written(write: asyncio.Future[str | None]) -> str | None:
    """What an outcome write came to: the state recorded (None: the lease was lost), or
    ``UNRECORDED`` when it failed or was abandoned."""
    if write.cancelled() or write.exception() is not None:
        return UNRECORDED
    return write.result()
