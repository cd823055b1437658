"""The jobs a worker holds, kept by lease, and the heartbeat that keeps their leases.

A job is kept by its lease (:attr:`pgqueue.models.Job.lease`: id and lease token), not by its
id: a job whose lease expired while its handler still ran can be rescued and claimed again by
the same worker, a second run of the same id (found in review: kept by id, the second claim
replaced the first run's entry, and the worker ran three handlers in two slots).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Any

from psycopg_pool import AsyncConnectionPool

from pgqueue.models import Job, Lease
from pgqueue.worker import leases

log = logging.getLogger("pgqueue.worker")

Entry = tuple[Job, "asyncio.Task[None]"]
#: A success waiting for its batched write: the job and the write's future.
Flushing = tuple[Job, "asyncio.Future[Any]"]


class InFlight:
    """What one worker holds: running jobs (each takes a slot), successes waiting for their
    batched write (``flushing``: the slot is free, the lease still held), and per lease whether
    its outcome is being written (``recording``), its lease is lost (``lost``: its outcome
    will be fenced off) or the job was withdrawn while it ran (``withdrawn``: ``"cancelled"``
    by ``pgqueue.cancel``, or ``"deleted"``; the handler is stopped, nothing is written)."""

    def __init__(self) -> None:
        self.running: dict[Lease, Entry] = {}
        self.flushing: dict[Lease, Flushing] = {}
        self.recording: set[Lease] = set()
        self.lost: set[Lease] = set()
        self.withdrawn: dict[Lease, str] = {}
        # the newest lease of each job id held here
        self._newest: dict[int, Lease] = {}

    def add(self, job: Job, task: asyncio.Task[None]) -> bool:
        """Hold ``job`` (its handler runs in ``task``). Returns True when an earlier lease of
        the same id is still held here: it expired and was rescued (this claim proves it), so
        it is lost now (its outcome fenced off, the heartbeat no longer asks for it)."""
        lease = job.lease
        earlier = self._newest.get(job.id)
        self._newest[job.id] = lease
        self.running[lease] = (job, task)
        if earlier is None or earlier in self.lost:
            return False
        self.lost.add(earlier)
        log.warning(
            "job %s: claimed again by this worker while an earlier run still goes on "
            "(its lease expired); the earlier run's outcome will be dropped",
            job.id,
        )
        return True

    def release(self, lease: Lease) -> None:
        """Free the slot of ``lease`` (its handler is done, or never started)."""
        self.running.pop(lease, None)

    def forget(self, job: Job) -> None:
        """Drop everything kept about ``job``'s lease but its slot (see :meth:`release`)."""
        lease = job.lease
        self.flushing.pop(lease, None)
        self.recording.discard(lease)
        self.lost.discard(lease)
        self.withdrawn.pop(lease, None)
        if self._newest.get(job.id) == lease:
            del self._newest[job.id]

    def lost_runs(self) -> list[asyncio.Task[None]]:
        """The tasks of the running jobs whose lease is lost."""
        return [task for lease, (_job, task) in self.running.items() if lease in self.lost]

    def waited_for(self) -> int:
        """How many jobs a stop waits for: running ones whose lease is not lost, and
        successes waiting for their batched write."""
        return len(self.running) - len(self.lost_runs()) + len(self.flushing)

    def cancel_handlers(self, tasks: Collection[asyncio.Future[Any]] | None = None) -> None:
        """Cancel the jobs (of ``tasks``, default all running) whose handler still runs. A job
        whose outcome is being written is left to finish that write: cancelled, it abandoned
        the write, the worker closed its pool under it, and the job stayed ``running`` with an
        attempt used (found by a tester, with a hard stop or a grace period ending while
        failures were being recorded)."""
        for job, task in list(self.running.values()):
            if job.lease not in self.recording and (tasks is None or task in tasks):
                task.cancel()

    async def heartbeat(
        self, pool: AsyncConnectionPool[Any], lease_seconds: float, *, stopping: bool
    ) -> int:
        """Extend the leases held here; stop the handlers of withdrawn jobs (and, while
        ``stopping``, of jobs whose lease is lost: a stop does not wait for them). Returns how
        many leases it found lost.

        A job whose outcome is being written is not judged: its write may have committed
        while the heartbeat waited (the completer reports a lost lease itself)."""
        # a lost lease is not asked for: its id may be held again, by a newer run here
        jobs = [
            job
            for job, _task in (*self.running.values(), *self.flushing.values())
            if job.lease not in self.lost
        ]
        if not jobs:
            return 0
        held = await leases.extend(pool, jobs, lease_seconds)
        if held is None:
            return 0
        unextended = [
            job
            for job in jobs
            # flushing jobs are recording: only a handler still running can lose its lease
            if job.lease not in held
            and job.lease in self.running
            and job.lease not in self.recording
        ]
        if not unextended:
            return 0
        verdicts = await leases.why_not_extended(pool, unextended)
        if verdicts is None:
            return 0
        found_lost = 0
        for lease, verdict in verdicts.items():
            entry = self.running.get(lease)
            if verdict == "held" or entry is None or lease in self.recording:
                continue  # ask again next time; or its outcome is being written meanwhile
            if lease in self.lost:
                continue  # a claim of the same id found it lost meanwhile
            if verdict in ("cancelled", "deleted"):
                # pgqueue.cancel, or the row deleted by hand: stop the handler now, so the slot
                # frees and no more of the provider's time is spent on an answer nobody will
                # store (a deleted job's handler ran to its end: found by a tester)
                self.withdrawn[lease] = verdict
                entry[1].cancel()
                continue
            self.lost.add(lease)
            found_lost += 1
            log.warning("job %s: lease lost; its outcome will be dropped", lease[0])
            if stopping:  # a stop does not wait for it (found by a tester)
                entry[1].cancel()
        return found_lost
