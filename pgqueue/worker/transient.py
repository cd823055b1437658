"""Retrying the worker's statements: which database errors another try can get past, the
tenacity policy for them, and running a named query on a pooled connection under it.

Used by the producer (claims), the completer (outcome writes) and the background loops.
"""

from __future__ import annotations

import random
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolClosed
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_random_exponential,
)

from pgqueue.db import queries

#: SQLSTATE classes of an ``OperationalError`` that another try can get past: connection
#: exception (08), insufficient resources (53), operator intervention (57: shutdown, cannot
#: connect now), system error (58). Not program limit exceeded (54: a value too large for
#: jsonb fails the same way every time) nor object not in prerequisite state (55).
_TRANSIENT_CLASSES = frozenset({"08", "53", "57", "58"})


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a database error another try can get past: a deadlock, a
    serialization failure, a lost connection (no SQLSTATE), or an ``OperationalError`` of the
    classes in ``_TRANSIENT_CLASSES`` (PostgreSQL manual, appendix A, "Error Codes")."""
    if isinstance(exc, psycopg.errors.DeadlockDetected | psycopg.errors.SerializationFailure):
        return True
    if not isinstance(exc, psycopg.OperationalError) or isinstance(exc, PoolClosed):
        # (a closed pool never opens again: found by a tester, a handler that ignored its
        # cancellation finished after the stop had closed the pool, and its outcome write
        # retried for ~105 s, keeping the process alive)
        return False
    state = exc.sqlstate
    return state is None or state[:2] in _TRANSIENT_CLASSES


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (a Postgres error also carries CONTEXT and DETAIL
    lines: found by a tester, a one-line warning spanned two), or its type's name."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


#: How long an outcome write of its own waits for a row another transaction holds before it
#: lets go of its connection and tries again later (``lock_timeout``, milliseconds).
HELD_ROW_WAIT_MS = 500
#: The longest pause before a write that met a held row tries again (seconds).
HELD_ROW_PAUSE_SECONDS = 1.0


def is_held_row(exc: BaseException) -> bool:
    """Whether ``exc`` is a write that gave up waiting for a row another transaction holds
    (SQLSTATE 55P03, ``lock_not_available``, from ``lock_timeout``): worth another try later."""
    return isinstance(exc, psycopg.errors.LockNotAvailable)


def transient_retry(
    give_up_after_seconds: float = 30.0, *, held_rows: bool = False
) -> AsyncRetrying:
    """A tenacity policy for transient database errors (deadlock, serialization failure,
    lost connection): full-jitter exponential waits up to 3 s, for at most
    ``give_up_after_seconds`` (30 s by default: long enough to ride out a Postgres restart;
    outcome writes use the lease instead, see :class:`pgqueue.worker.completer.Completer`).
    With ``held_rows``, a row another transaction holds (:func:`is_held_row`) is tried again
    too."""
    backoff = wait_random_exponential(multiplier=0.05, max=3.0)

    def pause(state: RetryCallState) -> float:
        failed = state.outcome.exception() if state.outcome is not None else None
        if failed is not None and is_held_row(failed):
            # held rows: tried again every ~1-1.5 s (with the lock wait), so that a hold that
            # ends is noticed soon (found by a tester: after backing off to 3 s, a write missed
            # a hold that ended 3 s before a stop's last moment, and its job ran again)
            return random.uniform(HELD_ROW_PAUSE_SECONDS / 2, HELD_ROW_PAUSE_SECONDS)
        return float(backoff(state))

    return AsyncRetrying(
        retry=retry_if_exception(
            (lambda e: is_transient(e) or is_held_row(e)) if held_rows else is_transient
        ),
        wait=pause,
        stop=stop_after_delay(give_up_after_seconds),
        reraise=True,
    )


async def run_named(
    pool: AsyncConnectionPool[Any],
    name: str,
    params: dict[str, Any],
    *,
    retry_seconds: float = 30.0,
    connection_wait_seconds: float | None = None,
) -> list[dict[str, Any]]:
    """Run the named ``:many`` query on a pooled connection; on a transient error, run it
    again under :func:`transient_retry` for up to ``retry_seconds``. The first try skips
    building tenacity's retry state, a measurable part of a claim or a flush of no-op jobs.
    ``connection_wait_seconds`` bounds each try's wait for a pooled connection (default: the
    pool's, 30 s); past it the try fails with ``PoolTimeout``, a transient error.

    Raises:
        psycopg.Error: a non-transient error, or a transient one that outlived the retries.
    """
    rows: list[dict[str, Any]]
    try:
        async with pool.connection(timeout=connection_wait_seconds) as conn:
            rows = await queries.arun(conn, name, params)
        return rows
    except Exception as exc:
        if not is_transient(exc):
            raise
    async for attempt in transient_retry(retry_seconds):
        with attempt:
            async with pool.connection(timeout=connection_wait_seconds) as conn:
                rows = await queries.arun(conn, name, params)
            return rows
    raise AssertionError("unreachable: transient_retry re-raises the last error")
