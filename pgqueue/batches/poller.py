"""The batch poller: seals, submits, reconciles, polls and finishes Message Batches.

Every step starts from a row of ``pgqueue.batches`` that one worker takes at a time
(``batch_take``: ``FOR UPDATE SKIP LOCKED``, then ``due_at`` moved a lease ahead), so any
worker can carry on where a dead one stopped:

- ``collecting`` and full (``batches_max_requests``) or old (``batches_max_age_seconds``):
  sealed (``submitting``, committed: the record BEFORE the SDK call), then submitted with
  ``custom_id`` = job id, then ``submitted`` with the provider's id;
- ``submitting`` taken again (its worker died, or the call failed, maybe after the provider
  created the batch): reconciled by ``custom_id`` first. Provider batches created since the
  seal that no row knows are read: one whose results hold our job ids is adopted; while one
  is still in progress nothing is decided (it may be ours); only when none is ours is the
  batch submitted. No job is sent twice;
- ``submitted``: polled every ``batches_poll_seconds``; the jobs' leases renewed; once ended,
  each job finished from its result (:mod:`pgqueue.batches.outcomes`) in one transaction.
  While it runs, a batch whose jobs were all cancelled is cancelled at the provider (the API
  cancels whole batches only; a cancelled job's result is dropped by the lease fence).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from datetime import datetime, timedelta
from typing import Any

import anthropic
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from pgqueue.batches.outcomes import Finish, Tally, finish
from pgqueue.db import queries
from pgqueue.scheduling.backpressure import backoff_seconds
from pgqueue.settings import Settings
from pgqueue.worker.completer import success_batch
from pgqueue.worker.transient import first_line, is_transient

log = logging.getLogger("pgqueue.worker")

#: Provider batches created this long before a seal are still read when reconciling it
#: (clock skew between the database and the provider), in seconds.
RECONCILE_SKEW_SECONDS = 300.0


class BatchPoller:
    """One worker's share of the batches lane.

    Args:
        pool: the worker's pool (autocommit connections).
        client: an ``anthropic.AsyncAnthropic`` (its ``messages.batches``).
        settings: ``batches_*``, ``lease_seconds``, backoff settings.
        worker_id: recorded on the batch a step works on.
        rng: jitter of the retry backoff.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        client: anthropic.AsyncAnthropic,
        settings: Settings,
        worker_id: str,
        rng: random.Random | None = None,
    ) -> None:
        self.pool = pool
        self.client = client
        self.settings = settings
        self.worker_id = worker_id
        self.rng = rng or random.Random()

    async def loop(self, stop: asyncio.Event, interval_seconds: float) -> None:
        """Run steps until ``stop``: every due batch at once, then a pause of about
        ``interval_seconds``. A database or provider error is logged; the batch is due again
        later (its lease runs out), so nothing is lost. Closes the client at the end."""
        try:
            await self._loop(stop, interval_seconds)
        finally:
            with contextlib.suppress(Exception):
                await self.client.close()

    async def _loop(self, stop: asyncio.Event, interval_seconds: float) -> None:
        while not stop.is_set():
            try:
                while await self.step():
                    pass
            except Exception as exc:
                if not is_transient(exc):
                    log.exception("batches: a step failed; the batch is taken again later")
                else:
                    log.warning("batches: database unavailable (%s)", first_line(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_seconds * self.rng.uniform(0.8, 1.2))

    async def step(self) -> bool:
        """Take one due batch and move it on; False when none was due."""
        s = self.settings
        async with self.pool.connection() as conn:
            row = await queries.arun(
                conn,
                "batch_take",
                {
                    "max_requests": s.batches_max_requests,
                    "max_age_seconds": s.batches_max_age_seconds,
                    "lease_seconds": s.lease_seconds,
                    "worker_id": self.worker_id,
                },
            )
            if row is None:
                return False
            await queries.arun(
                conn, "batch_jobs_lease", {"batch_id": row["id"], "lease_seconds": s.lease_seconds}
            )
        try:
            if row["state"] == "submitting":
                await self._submit(row["id"], row["submit_started_at"], fresh=row["fresh"])
            else:
                await self._poll(row["id"], row["provider_batch_id"])
        except anthropic.APIError as exc:
            log.warning("batches: batch %s: %s; tried again later", row["id"], first_line(exc))
            await self._release(row["id"], f"{type(exc).__name__}: {first_line(exc)}")
        return True

    async def _release(self, batch_id: int, error: str | None) -> None:
        async with self.pool.connection() as conn:
            await queries.arun(
                conn,
                "batch_release",
                {
                    "id": batch_id,
                    "poll_seconds": self.settings.batches_poll_seconds,
                    "error": error,
                },
            )

    async def _requests(self, batch_id: int) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            rows: list[dict[str, Any]] = await queries.arun(
                conn, "batch_requests", {"batch_id": batch_id}
            )
        return rows

    async def _submit(self, batch_id: int, sealed_at: datetime, *, fresh: bool) -> None:
        jobs = await self._requests(batch_id)
        if not fresh:
            adopted = await self._reconcile({str(j["id"]) for j in jobs}, sealed_at)
            if adopted is None:  # a batch that may be ours is still in progress
                await self._release(batch_id, "reconciling: a provider batch is in progress")
                return
            if adopted:
                log.info("batches: batch %s reconciled with %s", batch_id, adopted)
                await self._submitted(batch_id, adopted)
                return
        live = [j for j in jobs if j["state"] == "running"]
        if not live:  # every job was cancelled before the call
            await self._finish(batch_id, jobs, [])
            return
        try:
            made = await self.client.messages.batches.create(
                requests=[{"custom_id": str(j["id"]), "params": j["payload"]} for j in live]
            )
        except anthropic.APIStatusError as exc:
            if exc.status_code in (408, 409, 429) or exc.status_code >= 500:
                raise  # maybe created, or try later: reconciled at the next take
            await self._refused(batch_id, live, f"HTTP {exc.status_code}: {exc.message}")
            return
        await self._submitted(batch_id, made.id)

    async def _refused(self, batch_id: int, live: list[dict[str, Any]], error: str) -> None:
        """The provider refused the batch (a 4xx: nothing was created): its jobs follow the
        usual retry policy (back to the queue after a backoff, into a new batch; failed once
        their attempts are spent) and the batch ends with the error."""
        log.warning("batches: batch %s refused (%s); its jobs are retried", batch_id, error)
        text = f"batch refused: {error}"[:2000]
        async with self.pool.connection() as conn, conn.transaction():
            for job in live:
                f = Finish(int(job["id"]), "errored", "retry", error=text)
                await self._write_other(conn, f, job)
            await queries.arun(conn, "batch_refused", {"id": batch_id, "error": text})

    async def _submitted(self, batch_id: int, provider_batch_id: str) -> None:
        async with self.pool.connection() as conn:
            await queries.arun(
                conn,
                "batch_submitted",
                {
                    "id": batch_id,
                    "provider_batch_id": provider_batch_id,
                    "poll_seconds": self.settings.batches_poll_seconds,
                },
            )

    async def _reconcile(self, ours: set[str], sealed_at: datetime) -> str | None:
        """The provider batch holding our ``custom_id``s: its id, ``""`` when there is none
        (safe to submit), None when a batch that may be ours has not ended yet."""
        since = sealed_at - timedelta(seconds=RECONCILE_SKEW_SECONDS)
        candidates = []
        async for batch in self.client.messages.batches.list(limit=100):
            if batch.created_at < since:
                break  # newest first: the rest are older
            candidates.append(batch)
        async with self.pool.connection() as conn:
            known = await queries.arun(conn, "batch_known", {"ids": [b.id for b in candidates]})
        known_ids = {r["provider_batch_id"] for r in known}
        undecided = False
        for batch in candidates:
            if batch.id in known_ids:
                continue
            if batch.processing_status != "ended":
                undecided = True
                continue
            async for line in await self.client.messages.batches.results(batch.id):
                if line.custom_id in ours:
                    return batch.id
        return None if undecided else ""

    async def _poll(self, batch_id: int, provider_batch_id: str) -> None:
        batch = await self.client.messages.batches.retrieve(provider_batch_id)
        jobs = await self._requests(batch_id)
        if batch.processing_status != "ended":
            if batch.processing_status == "in_progress" and all(
                j["state"] == "cancelled" for j in jobs
            ):
                await self.client.messages.batches.cancel(provider_batch_id)
            await self._release(batch_id, None)
            return
        lines = [
            line.model_dump(mode="json")
            async for line in await self.client.messages.batches.results(provider_batch_id)
        ]
        fates = []
        for line in lines:
            try:
                fates.append(finish(line, self.settings.batches_expired))
            except ValueError as exc:  # not a request of ours: nothing to finish
                log.warning("batches: batch %s: %s", batch_id, exc)
        await self._finish(batch_id, jobs, fates)

    async def _finish(self, batch_id: int, jobs: list[dict[str, Any]], fates: list[Finish]) -> None:
        """Every job's outcome, the batch's counts and its end, in one transaction. Each job
        write is fenced by its lease: a job cancelled meanwhile keeps its state."""
        held = {j["id"]: j for j in jobs if j["state"] == "running"}
        tally = Tally()
        for f in fates:
            tally.add(f)
        successes = [
            (f.job_id, held[f.job_id]["tenant_id"], held[f.job_id]["lease_token"], f.result,
             f.input_tokens, f.output_tokens)
            for f in fates if f.action == "succeed" and f.job_id in held
        ]  # fmt: skip
        outcomes = Jsonb({str(f.job_id): f.outcome for f in fates})
        async with self.pool.connection() as conn, conn.transaction():
            done = await queries.arun(conn, "job_complete_many", success_batch(successes))
            written = {r["id"] for r in done}
            for job_id, tenant_id, token, result, itok, otok in successes:
                if job_id not in written:  # its row was held by another transaction: wait
                    await queries.arun(
                        conn,
                        "job_complete",
                        {
                            "id": job_id,
                            "tenant_id": tenant_id,
                            "lease_token": token,
                            "result": Jsonb(result),
                            "input_tokens": itok,
                            "output_tokens": otok,
                        },
                    )
            for f in fates:
                job = held.get(f.job_id)
                if job is None or f.action == "succeed":
                    continue
                await self._write_other(conn, f, job)
            await queries.arun(
                conn,
                "batch_outcomes",
                {"batch_id": batch_id, "outcomes": outcomes},
            )
            await queries.arun(
                conn,
                "batch_end",
                {
                    "id": batch_id,
                    **tally.counts,
                    "input_tokens": tally.input_tokens,
                    "output_tokens": tally.output_tokens,
                },
            )
        log.info("batches: batch %s ended: %s", batch_id, tally.counts)

    async def _write_other(self, conn: Any, f: Finish, job: dict[str, Any]) -> None:
        key = {"id": f.job_id, "tenant_id": job["tenant_id"], "lease_token": job["lease_token"]}
        if f.action == "cancel":
            await queries.arun(
                conn,
                "job_cancel",
                {"job_id": f.job_id, "tenant_id": job["tenant_id"], "reason": f.error},
            )
            return
        delay = 0.0
        if f.action == "retry":
            delay = backoff_seconds(
                max(int(job["attempts"]), 1),
                self.rng,
                base_seconds=self.settings.backoff_base_seconds,
                cap_seconds=self.settings.backoff_cap_seconds,
            )
        await queries.arun(
            conn,
            "job_retry",
            {**key, "permanent": f.action == "fail", "delay_seconds": delay, "error": f.error},
        )
