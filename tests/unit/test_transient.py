"""Which database errors the worker retries (pgqueue.worker.transient.is_transient)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from pgqueue.worker.transient import is_transient


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.OperationalError("server closed the connection unexpectedly"),  # no SQLSTATE
        errors.DeadlockDetected(),
        errors.SerializationFailure(),
        errors.AdminShutdown(),
        errors.CannotConnectNow(),
        errors.TooManyConnections(),
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
