"""Which database errors the worker retries (pgqueue.worker.completer.is_transient)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from pgqueue.worker.completer import is_transient


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
