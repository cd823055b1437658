"""Which database errors the worker retries (pgqueue.worker.transient.is_transient)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors
from psycopg_pool import PoolClosed, PoolTimeout
from tenacity import RetryCallState

from pgqueue.worker.transient import HELD_ROW_PAUSE_SECONDS, is_transient, transient_retry


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.OperationalError("server closed the connection unexpectedly"),  # no SQLSTATE
        errors.DeadlockDetected(),
        errors.SerializationFailure(),
        errors.AdminShutdown(),
        errors.CannotConnectNow(),
        errors.TooManyConnections(),
        PoolTimeout("no connection in 30 s"),
    ],
)
def test_errors_another_try_can_get_past_are_transient(exc: Exception) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        # A result too large for jsonb: retried for 30 s, then the jobs of the batch were left
        # running for the rescuer and ran again (found by a tester, 60 results of 5 MB).
        errors.ProgramLimitExceeded(),
        errors.StatementTooComplex(),
        errors.ObjectNotInPrerequisiteState(),
        errors.UniqueViolation(),
        ValueError("not a database error"),
        # A closed pool never opens again (found by a tester: a handler that ignored its
        # cancellation finished after a stop had closed the pool, and its write was retried
        # for ~105 s, keeping the process alive).
        PoolClosed("the pool 'p' is already closed"),
    ],
)
def test_errors_that_fail_the_same_way_again_are_not(exc: Exception) -> None:
    assert not is_transient(exc)


def test_outcome_writes_are_retried_while_the_lease_may_hold() -> None:
    """Found by a tester: outcome writes gave up after 30 s, so after a longer outage every job
    that finished during it ran again once its lease expired. Now they are retried for the
    lease less one heartbeat (the lease's least remaining time), never less than 30 s."""
    from typing import Any

    from pgqueue.settings import Settings
    from pgqueue.worker.completer import Completer

    pool: Any = None
    assert Completer(pool, Settings())._retry_seconds == 120.0 - 15.0
    short = Settings(lease_seconds=20, heartbeat_seconds=5, provider_timeout_seconds=10)
    assert Completer(pool, short)._retry_seconds == 30.0


def _pause(exc: BaseException, attempt: int) -> float:
    retrying = transient_retry(30.0, held_rows=True)
    state = RetryCallState(retrying, fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    state.set_exception((type(exc), exc, None))
    return float(retrying.wait(state))


def test_a_write_on_a_held_row_tries_again_within_a_second() -> None:
    """Found by a tester: after backing off to 3 s between tries, a write on a held row missed
    a hold that ended a moment before a stop's last second, and its job ran again. Held rows
    are tried again every HELD_ROW_PAUSE_SECONDS at most (plus the lock wait); other errors
    still back off up to 3 s."""
    held = errors.LockNotAvailable()
    pauses = [_pause(held, attempt) for attempt in range(1, 40)]
    assert max(pauses) <= HELD_ROW_PAUSE_SECONDS
    down = psycopg.OperationalError("server closed the connection unexpectedly")
    assert max(_pause(down, 20) for _ in range(200)) > HELD_ROW_PAUSE_SECONDS
