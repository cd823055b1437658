"""How a worker rides out a database that stops answering: its producer's bounded retries, the
pool's reconnection window, and what it logs while the outage lasts.

Found by testers: after an outage of over 30 s the worker exited 1 without draining its jobs; a
SIGTERM during an outage took ~53 s (one pool wait and one retry window of 30 s each); claiming
resumed 20–35 s after the database came back (psycopg_pool's doubling backoff); and an outage
printed psycopg_pool's warnings, one per connection and attempt (some 30 lines in 25 s), around
the worker's own line. The worker now says one line when it starts and one when it ends
(:class:`OutageLog`, whichever of its loops sees it), naming the pool's last connection error
as the cause, and the pool's warnings of that kind are INFO (:class:`PoolWarnings`; psycopg
sets its loggers to WARNING, so they show once the ``psycopg`` logger is set to INFO).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout

from pgqueue.worker.transient import first_line, is_transient

log = logging.getLogger("pgqueue.worker")

#: Pause between claims while the database does not answer (after the retries of one claim).
OUTAGE_PAUSE_SECONDS = 1.0
#: How often a continuing outage is logged again.
OUTAGE_REPORT_SECONDS = 60.0
#: How long the producer's statements (claim, next due time) are retried, and wait for a pooled
#: connection, before the producer reports an outage and tries again after a pause: so that it
#: notices a stop within seconds while the database does not answer.
PRODUCER_RETRY_SECONDS = 5.0
#: How long the worker's other loops (heartbeat, rescue, upkeep) wait for a pooled connection:
#: as the producer's, so that whichever loop runs notices an outage within seconds (a busy
#: worker's producer does not claim; found by a tester: such a worker reported no outage).
UPKEEP_CONNECTION_WAIT_SECONDS = PRODUCER_RETRY_SECONDS
#: The pool gives up a reconnection attempt after this long and starts afresh at the next
#: request, so that its backoff between attempts (1, 2, 4 … s, doubling) stays short (with
#: psycopg_pool's default, 300 s, a worker resumed 20–35 s after the database came back).
POOL_RECONNECT_SECONDS = 10.0


#: psycopg_pool's warnings (their format strings) for a connection that could not be made or
#: that the server ended: one per connection and attempt while the database is away.
POOL_OUTAGE_WARNINGS = frozenset(
    {
        "error connecting in %r: %s",
        "reconnection attempt in pool %r failed after %s sec",
        "discarding closed connection: %s",
        "discarding broken connection: %s",
    }
)
#: The logger psycopg_pool writes to.
POOL_LOGGER = "psycopg.pool"


class PoolWarnings(logging.Filter):
    """A filter on psycopg_pool's logger while a worker runs: its :data:`POOL_OUTAGE_WARNINGS`
    become INFO records (dropped unless the logger is enabled for INFO: psycopg sets the
    ``psycopg`` logger to WARNING, even under ``pgqueue -v``), and the last connection error
    of the worker's pool (``pool_name``) is kept as :attr:`cause`, which the outage's first
    line names. Its other warnings stay warnings.

    Not only during a known outage: the pool warns from the first failed connection, seconds
    before the producer's claims run out of retries, and a connection the server ends while the
    database accepts new ones is no outage (tests/worker/test_kill_storm.py).
    """

    def __init__(self, pool_name: str) -> None:
        super().__init__()
        self.pool_name = pool_name
        #: the first line of the pool's last connection error (None: none since the last claim)
        self.cause: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or record.msg not in POOL_OUTAGE_WARNINGS:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        connecting = record.msg == "error connecting in %r: %s" and len(args) == 2
        if connecting and args[0] == self.pool_name:
            error = args[1]
            self.cause = first_line(error) if isinstance(error, BaseException) else str(error)
        record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)

    def install(self) -> None:
        """Put this filter on psycopg_pool's logger (until :meth:`remove`)."""
        logging.getLogger(POOL_LOGGER).addFilter(self)

    def remove(self) -> None:
        """Take this filter off psycopg_pool's logger."""
        logging.getLogger(POOL_LOGGER).removeFilter(self)


class OutageLog:
    """A worker's record of an outage of its database: one warning when it starts (naming the
    pool's last connection error, from ``pool``), one every :data:`OUTAGE_REPORT_SECONDS`
    while it goes on, one (INFO) when a statement succeeds again. Any of the worker's loops
    may start it and end it: the producer's claims (:meth:`failed`), the heartbeat, the
    rescuer and the upkeep loops (:meth:`covers`, :meth:`answered`, through
    :func:`upkeep_failed` and :func:`upkeep_answered`). The outage is timed from the start of
    the first statement that failed (monotonic seconds).

    Args:
        pool: the filter on the pool's warnings, which keeps its last connection error.
        running: how many jobs the worker runs (for the first line).
    """

    def __init__(
        self, pool: PoolWarnings | None = None, running: Callable[[], int] = lambda: 0
    ) -> None:
        self._since: float | None = None
        self._reported = 0.0
        self._pool = pool
        self._running = running

    @property
    def known(self) -> bool:
        """Whether the worker knows its database unavailable (an outage has been reported)."""
        return self._since is not None

    def failed(self, tried: float, error: BaseException) -> None:
        """A claim that started at ``tried`` failed past its retries with ``error``."""
        now = time.monotonic()
        if self._since is None:
            self._since, self._reported = tried, now
            said = first_line(error)
            cause = None if self._pool is None else self._pool.cause
            if cause and cause not in said:
                said = f"{said}; last connection error: {cause}"
            log.warning(
                "database unavailable (%s): %d job(s) keep running; claiming again when it answers",
                said,
                self._running(),
            )
        elif now - self._reported >= OUTAGE_REPORT_SECONDS:
            self._reported = now
            log.warning("database unavailable for %.0f s; still trying", now - self._since)

    def covers(self, error: BaseException) -> bool:
        """Whether the failure ``error`` of a loop other than the producer's is this outage's
        (then the outage's lines say it, not the loop): a lost connection or a connection
        not had while the outage is known; or one not had from the pool (``PoolTimeout``)
        while the pool's last attempt to connect failed, which starts the outage. A database
        that still accepts connections (its sessions ended one by one) starts none
        (tests/worker/test_kill_storm.py)."""
        if not _lost_connection(error):
            return False
        if self._since is None:
            if not isinstance(error, PoolTimeout) or self._pool is None or not self._pool.cause:
                return False
            self.failed(time.monotonic() - UPKEEP_CONNECTION_WAIT_SECONDS, error)
        return True

    def answered(self) -> None:
        """A statement succeeded: ends the outage, if there was one."""
        if self._pool is not None:
            self._pool.cause = None
        if self._since is not None:
            log.info("database available again after %.0f s", time.monotonic() - self._since)
            self._since = None


def _lost_connection(error: BaseException) -> bool:
    """Whether ``error`` is a transient error of the connection (not a deadlock or a
    serialization failure, which a database that answers raises)."""
    conflict = psycopg.errors.DeadlockDetected | psycopg.errors.SerializationFailure
    return is_transient(error) and not isinstance(error, conflict)


def upkeep_failed(pool: Any, what: str, error: BaseException) -> None:
    """Say that the upkeep statement ``what`` failed with ``error`` and will be retried: a
    warning, unless the outage of the worker whose pool is ``pool`` (its ``outage``
    attribute, :class:`~pgqueue.worker.connections.WorkerPool`) covers it. Found by a tester:
    an idle worker logged 15 lines through a 95 s outage, 10 of them "… failed (couldn't get
    a connection after 30.00 sec); will retry" of its upkeep loops."""
    outage = getattr(pool, "outage", None)
    if isinstance(outage, OutageLog) and outage.covers(error):
        return
    log.warning("%s failed (%s); will retry", what, error)


def upkeep_answered(pool: Any) -> None:
    """An upkeep statement on ``pool`` succeeded: it ends the outage of the pool's worker."""
    outage = getattr(pool, "outage", None)
    if isinstance(outage, OutageLog):
        outage.answered()


#: How long the producer waits before claiming again while a ``pgqueue.*`` setting is malformed.
BAD_SETTING_PAUSE_SECONDS = 5.0


class BadSettingLog:
    """The producer's record of claims refused for a malformed ``pgqueue.*`` setting
    (:class:`~pgqueue.errors.InvalidSetting`): one error line when it starts, naming the
    setting, its range and the value, one every :data:`OUTAGE_REPORT_SECONDS` while it goes on
    (or at once when the message changes), one when a claim succeeds again. The worker stays
    up and its running jobs go on (found in issue 28: the claim failed with a cast's error and
    the worker exited, to be restarted into the same error)."""

    def __init__(self) -> None:
        self._said: str | None = None
        self._reported = 0.0

    def failed(self, error: BaseException) -> None:
        now = time.monotonic()
        said = str(error)
        if said != self._said or now - self._reported >= OUTAGE_REPORT_SECONDS:
            log.error("claims paused: %s; fix or RESET it (workers reconnect to read it)", said)
            self._said, self._reported = said, now

    def answered(self) -> None:
        if self._said is not None:
            log.info("claims resumed: the pgqueue settings are valid again")
            self._said = None
