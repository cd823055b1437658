"""Runs one claimed job through its handler and turns whatever happens into one Outcome.

Only the executor catches handler exceptions. Every path ends in Succeeded, Failed (retry at a
delay, or permanent), Throttled, or Deferred (this worker cannot run it; no attempt used).
Cancellation propagates to the runtime, which records Interrupted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import math
import random
import threading
import weakref
from typing import Any

from pgqueue.errors import Defer, Discard, InvalidKind, RateLimited, RetryLater
from pgqueue.handlers.registry import Handler, Registry
from pgqueue.models import Deferred, Failed, HandlerResult, Job, Outcome, Succeeded, Throttled
from pgqueue.scheduling.backpressure import backoff_seconds, throttle_wait_seconds
from pgqueue.settings import Settings

log = logging.getLogger("pgqueue.worker")

_MAX_ERROR_CHARS = 2000
#: A job of a kind this worker has no handler for goes back for another worker (seconds).
UNHANDLED_KIND_DELAY_SECONDS = 60.0


def _is_async_callable(fn: object) -> bool:
    try:
        return _ASYNC_CALLABLE[fn]
    except (KeyError, TypeError):  # not seen yet, or unhashable
        pass
    found = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - instances with an async __call__
    )
    with contextlib.suppress(TypeError):
        _ASYNC_CALLABLE[fn] = found
    return found


#: Handlers already inspected (the check cost a noticeable part of a no-op job); weak keys, so a
#: registry's handlers are not kept alive by it.
_ASYNC_CALLABLE: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


#: Calls of synchronous handlers whose thread has not returned yet (guarded by the lock): a
#: timeout or a shutdown abandons the call, but Python cannot stop the thread.
_sync_running = 0
_sync_lock = threading.Lock()


def sync_handlers_running() -> int:
    """How many synchronous handlers are still running in a thread, abandoned or not: the
    process cannot exit before they return."""
    return _sync_running


class _RaisedInThread(Exception):
    """Carries a ``BaseException`` that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``) out of a synchronous handler's thread: raised as it is, it would end
    the event loop from the task that waits for the thread, not just fail the job."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(raised)
        self.raised = raised


def _in_thread(handler: Handler, job: Job) -> Any:
    global _sync_running
    with _sync_lock:
        _sync_running += 1
    try:
        return handler(job)
    except Exception:
        raise
    except BaseException as exc:
        raise _RaisedInThread(exc) from None
    finally:
        with _sync_lock:
            _sync_running -= 1


def runs_in_thread(handler: Handler) -> bool:
    """Whether ``handler`` is a plain function, run in a thread: such a run cannot be stopped,
    so its job is held (lease and slot) until the thread returns."""
    return not _is_async_callable(handler)


async def _call(handler: Handler, job: Job) -> Any:
    result = await handler(job)  # type: ignore[misc]
    if inspect.isawaitable(result):
        return await result
    return result


async def _call_in_thread(handler: Handler, job: Job, timeout_seconds: float) -> tuple[Any, bool]:
    """Run a plain function ``handler`` in a thread and wait until the thread returns, whatever
    happens meanwhile; returns what it returned (it raises what the handler raised) and whether
    it ran past ``timeout_seconds``.

    A thread cannot be stopped. Found by a fault run: a job whose synchronous handler timed out,
    or was interrupted by a stop, went back to the queue while its thread ran on, and was run
    again beside it (by another worker after a stop, by this one after a timeout). So neither a
    timeout nor a cancellation (a stop) ends this wait: the job keeps its slot and its lease
    (the heartbeat runs on) until the thread returns, and its outcome is then recorded: the
    timeout's failure, or what the handler returned. Each cancellation is absorbed
    (``uncancel``) so that the task's state stays clean; a process that must end sooner is
    ended whole (a third signal), and the rescuer takes its jobs when their leases expire.
    """
    loop = asyncio.get_running_loop()
    thread = asyncio.ensure_future(asyncio.to_thread(_in_thread, handler, job))
    deadline = loop.time() + timeout_seconds
    timed_out = False
    told = False
    while not thread.done():
        try:
            wait = None if timed_out else max(0.0, deadline - loop.time())
            await asyncio.wait({thread}, timeout=wait)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if not told:
                told = True
                log.warning(
                    "job %s: its synchronous handler still runs (a thread cannot be stopped); "
                    "the job keeps its lease until it returns",
                    job.id,
                )
            continue
        if not thread.done() and not timed_out:
            timed_out = True
            if not told:
                told = True
                log.warning(
                    "job %s: its synchronous handler ran past %s s; the job keeps its lease until "
                    "its thread returns, then fails as timed out",
                    job.id,
                    timeout_seconds,
                )
    try:
        result = thread.result()
    except _RaisedInThread as carried:
        raise carried.raised from None
    if inspect.isawaitable(result):
        result = await result
    return result, timed_out


#: The largest token count a job row holds (``integer`` columns).
MAX_TOKENS = 2_147_483_647


def _bad_handler_result(returned: HandlerResult) -> str | None:
    """Why a ``HandlerResult`` cannot be stored as it is, or None. Found by a tester: a list
    result was stored, a negative token count was charged to the tenant, 1.5 tokens became 2,
    and a count past the integer range failed the job after it had succeeded."""
    if returned.result is not None and not isinstance(returned.result, dict):
        kind = type(returned.result).__name__
        return f"handler returned HandlerResult with a {kind} result; expected dict or None"
    for name in ("input_tokens", "output_tokens"):
        value = getattr(returned, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
            return (
                f"handler returned HandlerResult with {name}={value!r}; "
                f"expected an integer from 0 to {MAX_TOKENS}, or None"
            )
    return None


def _to_success(returned: Any) -> Outcome:
    if isinstance(returned, HandlerResult):
        problem = _bad_handler_result(returned)
        if problem is not None:
            return Failed(problem, retry_in_seconds=0.0, permanent=True)
        return Succeeded(
            returned.result, returned.input_tokens, returned.output_tokens, returned.headers
        )
    if returned is None or isinstance(returned, dict):
        return Succeeded(returned)
    return Failed(
        f"handler returned {type(returned).__name__}; expected dict, HandlerResult or None",
        retry_in_seconds=0.0,
        permanent=True,
    )


class SharedDeadline:
    """One timer for the provider timeouts of the jobs one claim started: each job gets
    ``seconds`` from the moment its handler starts (:meth:`run`), as with ``asyncio.timeout``,
    and a job still in its handler then is cancelled, its :meth:`run` raising ``TimeoutError``.

    The jobs of a claim start within moments of each other, so their deadlines come in the
    order they started: one timer, armed for the earliest deadline of a job still running and
    re-armed when it fires, serves them all, instead of a timer each (``asyncio.timeout`` per
    job cost ~5 µs of worker CPU per no-op job: ``docs/bench.md``). It is armed by the first
    job that starts, so a claim that took nothing costs nothing; its owner calls
    :meth:`finish` once per job when the job is over, and after the last the timer goes. As
    with ``asyncio.timeout``, a cancellation of the task from elsewhere (a shutdown) is not
    turned into a timeout, and a synchronous handler's thread is abandoned, not stopped.

    Args:
        seconds: each job's time in its handler (``provider_timeout_seconds``).
        jobs: how many jobs share it (calls of :meth:`finish` expected).
    """

    def __init__(self, seconds: float, jobs: int) -> None:
        self._seconds = seconds
        self._left = jobs
        # (deadline on the loop's clock, task) in the order the jobs started
        self._started: collections.deque[tuple[float, asyncio.Task[Any]]] = collections.deque()
        self._running: set[asyncio.Task[Any]] = set()
        self._expired: set[asyncio.Task[Any]] = set()
        self._handle: asyncio.TimerHandle | None = None

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """Arm the timer for the earliest deadline of a job still in its handler, if any."""
        while self._started and self._started[0][1] not in self._running:
            self._started.popleft()
        if self._started:
            self._handle = loop.call_at(self._started[0][0], self._fire)

    def _fire(self) -> None:
        self._handle = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._started:
            deadline, task = self._started[0]
            if task in self._running and deadline > now:
                break
            self._started.popleft()
            if task in self._running:
                self._expired.add(task)
                task.cancel()
        self._arm(loop)

    async def run(self, awaitable: Any) -> Any:
        """Await ``awaitable`` in the current task, for at most ``seconds`` from now.

        Raises:
            TimeoutError: the time ran out first.
            asyncio.CancelledError: the task was cancelled for another reason.
        """
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("SharedDeadline.run() needs a running task")
        loop = asyncio.get_running_loop()
        before = task.cancelling()
        self._running.add(task)
        self._started.append((loop.time() + self._seconds, task))
        if self._handle is None:
            self._arm(loop)
        try:
            return await awaitable
        except asyncio.CancelledError:
            if task in self._expired:
                self._expired.discard(task)
                if task.uncancel() <= before:
                    raise TimeoutError from None  # only the deadline asked: a timeout
            raise
        finally:
            self._running.discard(task)
            if task in self._expired:  # expired, but the handler ignored the cancellation
                self._expired.discard(task)
                task.uncancel()

    def finish(self) -> None:
        """One of the jobs is over; after the last, the timer is cancelled."""
        self._left -= 1
        if self._left <= 0:
            if self._handle is not None:
                self._handle.cancel()
                self._handle = None
            self._started.clear()


async def execute(
    job: Job,
    registry: Registry,
    settings: Settings,
    rng: random.Random,
    deadline: SharedDeadline | None = None,
) -> Outcome:
    """Run ``job`` with the handler registered for its kind and return its outcome.

    The handler gets ``provider_timeout_seconds`` (shorter than the lease) from its start,
    timed by ``deadline`` (the claim's :class:`SharedDeadline`) when given. Retry
    delays come from :func:`backoff_seconds`; throttle waits from :func:`throttle_wait_seconds`
    (the provider's ``retry-after`` × 1.2 ± 20 %, never below it). Raises only
    ``asyncio.CancelledError``.
    """
    try:
        handler = registry.get(job.kind)
    except InvalidKind as exc:
        return Deferred(f"{exc} on this worker", UNHANDLED_KIND_DELAY_SECONDS)
    try:
        if runs_in_thread(handler):
            returned, timed_out = await _call_in_thread(
                handler, job, settings.provider_timeout_seconds
            )
            if timed_out:
                raise TimeoutError
        elif deadline is None:
            async with asyncio.timeout(settings.provider_timeout_seconds):
                returned = await _call(handler, job)
        else:
            returned = await deadline.run(_call(handler, job))
    except RateLimited as exc:
        hint = _handler_delay(exc.retry_after_seconds, None)
        wait = throttle_wait_seconds(
            hint,
            rng,
            multiplier=settings.retry_after_multiplier,
            jitter=settings.retry_after_jitter,
            default_seconds=settings.default_retry_after_seconds,
        )
        status = exc.status_code
        if isinstance(status, bool) or not isinstance(status, int):
            status = 429
        return Throttled(_text(exc.reason), wait, status, hint)
    except RetryLater as exc:
        delay = _handler_delay(exc.delay_seconds, None)
        return Failed(
            _text(exc.reason), delay if delay is not None else _backoff(job, settings, rng)
        )
    except Defer as exc:
        deferred = _handler_delay(exc.delay_seconds, DEFAULT_DEFER_SECONDS)
        assert deferred is not None
        return Deferred(_text(exc.reason), deferred)
    except Discard as exc:
        return Failed(_text(exc.reason), 0.0, permanent=True)
    except TimeoutError:
        return Failed(
            f"timed out after {settings.provider_timeout_seconds} s", _backoff(job, settings, rng)
        )
    except asyncio.CancelledError:
        raise  # the worker's own stop (or the job's cancellation): Interrupted
    except BaseException as exc:
        # SystemExit, KeyboardInterrupt or GeneratorExit raised by a handler fail its job like
        # any exception. Found by a tester: `raise SystemExit(3)` in one handler ended the
        # worker (exit 3), and every other job it held stayed `running` until its lease expired.
        return Failed(_text(exc, f"{type(exc).__name__}: "), _backoff(job, settings, rng))
    return _to_success(returned)


#: The longest delay a handler may ask for (90 days): a job's next ``run_at`` must stay a time
#: Postgres and Python both hold (``jobs_run_at_range``) and that ``make_interval`` accepts.
MAX_HANDLER_DELAY_SECONDS = 90 * 86_400.0
#: What a ``Defer`` whose delay is not a number waits, seconds (``Defer``'s own default).
DEFAULT_DEFER_SECONDS = 60.0


def _handler_delay(value: object, fallback: float | None) -> float | None:
    """A delay a handler gave (seconds), made safe to store: negative → 0, above
    :data:`MAX_HANDLER_DELAY_SECONDS` → that; NaN, ±infinity, None or not a number →
    ``fallback``. Found by a tester: ``RetryLater(delay_seconds=inf)`` made the outcome
    unstorable (``make_interval`` refuses it) and the job sat ``running`` until its lease
    expired; ``1e11`` stored a ``run_at`` in the year 5195."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return fallback
    delay = float(value)
    if not math.isfinite(delay):
        return fallback
    return min(max(delay, 0.0), MAX_HANDLER_DELAY_SECONDS)


def _text(value: object, prefix: str = "") -> str:
    """``prefix`` and ``str(value)``, cut to :data:`_MAX_ERROR_CHARS`, whatever ``value`` is: a
    handler's exception (or the reason it gave) never keeps its job's outcome from being
    recorded (found by a tester: ``RetryLater(123)`` crashed on ``reason[:2000]``)."""
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:
        text = f"<{type(value).__name__} whose str() failed>"
    return f"{prefix}{text}"[:_MAX_ERROR_CHARS]


def _backoff(job: Job, settings: Settings, rng: random.Random) -> float:
    return backoff_seconds(
        max(job.attempts, 1),
        rng,
        base_seconds=settings.backoff_base_seconds,
        cap_seconds=settings.backoff_cap_seconds,
    )
