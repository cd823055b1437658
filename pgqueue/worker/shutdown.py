"""How a stopping worker bounds its waits, and how ``pgqueue work`` treats signals once its
worker has stopped.

A stop gives running handlers the grace period (a hard stop ends it); the outcome writes still
under way then get :data:`FINAL_WRITES_SECONDS` more in all (one budget shared by every wait of
the stop: the jobs' own writes, the batched successes, the successes waiting for them), or less
if another signal comes, and what is left is abandoned: those jobs stay ``running`` until their
leases expire and the rescuer puts them back. Found by a tester: a write stuck on a database
that stopped answering, or on rows another transaction held locked, kept a stopping worker
alive through any number of signals.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgqueue.worker.runtime import Worker, WorkerStats

log = logging.getLogger("pgqueue.worker")

#: How long a stopping worker waits for the outcome writes still under way once no handler runs
#: (after the grace period, or a hard stop), before it leaves their jobs to the rescuer (seconds).
FINAL_WRITES_SECONDS = 10.0
#: What a task given up on still gets to finish by itself (a write that just failed).
SETTLE_SECONDS = 0.05


async def wait_all(
    tasks: Collection[asyncio.Future[Any]], seconds: float, until: asyncio.Event
) -> set[asyncio.Future[Any]]:
    """Wait until every one of ``tasks`` is done, ``seconds`` have passed, or ``until`` is set;
    return the tasks not done."""
    remaining = {task for task in tasks if not task.done()}
    if not remaining or until.is_set():
        return remaining
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    stop = asyncio.ensure_future(until.wait())
    try:
        while remaining and not until.is_set() and loop.time() < end:
            done, _ = await asyncio.wait(
                remaining | {stop}, timeout=end - loop.time(), return_when=asyncio.FIRST_COMPLETED
            )
            remaining -= done
    finally:
        stop.cancel()
    return remaining


async def final_writes(
    tasks: Collection[asyncio.Future[Any]],
    abandon: asyncio.Event,
    what: str = "job(s)",
    seconds: float | None = None,
) -> bool:
    """Wait for ``tasks`` (jobs writing their outcomes, or the completer closing: ``what`` they
    are, for the log) for at most ``seconds`` (default :data:`FINAL_WRITES_SECONDS`; what is
    left of the stop's budget), or until ``abandon`` is set (another signal); cancel what is
    left then, saying so with the time actually waited, and return whether everything
    finished."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    budget = FINAL_WRITES_SECONDS if seconds is None else max(0.0, seconds)
    remaining = await wait_all(tasks, budget, abandon)
    if remaining:
        # Writes that just failed or finished (an abandoned batch) settle within a few loop
        # turns: without this they were counted again after the stop had already reported them
        # (found by a tester: "8 … 1 … 8 job(s) not recorded" for 8 jobs).
        done, _ = await asyncio.wait(remaining, timeout=SETTLE_SECONDS)
        remaining -= done
    if not remaining:
        return True
    log.warning(
        "%d %s not recorded after %.0f s more (an outcome write the database does not "
        "answer, or a handler that ignores cancellation); their jobs go back to the queue "
        "when their leases expire",
        len(remaining),
        what,
        loop.time() - began,
    )
    for task in remaining:
        task.cancel()
    return False


class StopBudget:
    """One budget of :data:`FINAL_WRITES_SECONDS` for every wait for outcome writes of one
    stop, counted from the first, and the event a later signal sets to end them at once.
    Found by a tester: a stop whose writes met rows another transaction held waited the budget
    once for the jobs' own writes, again for the batched successes and again for the successes
    waiting on them (~35-50 s with the 30 s grace period)."""

    def __init__(self) -> None:
        #: set by a signal after a hard stop: stop waiting for outcome writes
        self.abandon = asyncio.Event()
        self._deadline: float | None = None  # loop time; set by the first wait

    async def wait(self, tasks: Collection[asyncio.Future[Any]], what: str = "job(s)") -> bool:
        """:func:`final_writes` with what is left of the budget; whether everything finished."""
        loop = asyncio.get_running_loop()
        if self._deadline is None:
            self._deadline = loop.time() + FINAL_WRITES_SECONDS
        return await final_writes(tasks, self.abandon, what, self._deadline - loop.time())


async def work_until_stopped(worker: Worker) -> WorkerStats:
    """Run ``worker`` with its signal handlers; once it has returned, a late SIGTERM or SIGINT
    no longer kills the process before it prints its summary (found by a tester: two signals
    10 ms apart to an idle worker exited 143 every time). A late signal while abandoned
    synchronous handlers' threads keep the process alive ends it at once, exit 128 + signal.
    """
    try:
        return await worker.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _late_signal)


def _late_signal(signum: int, _frame: object) -> None:
    from pgqueue.worker.executor import sync_handlers_running

    name = signal.Signals(signum).name
    threads = sync_handlers_running()
    if threads:
        log.warning("%s: exiting now, leaving %d synchronous handler thread(s)", name, threads)
        os._exit(128 + signum)
    log.warning("%s: the worker has already stopped; exiting", name)
