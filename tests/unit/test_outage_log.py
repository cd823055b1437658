"""What a worker logs while the database is away (found by a tester: psycopg_pool's warnings,
one per connection and attempt, some 30 in 25 s, around the worker's own line): one line as
the outage starts, naming the pool's last connection error, one as it ends; the pool's
warnings of that kind are INFO while the worker runs."""

from __future__ import annotations

import logging

import psycopg
from psycopg_pool import PoolTimeout

from pgqueue.worker.outage import OutageLog, PoolWarnings
from pgqueue.worker.transient import first_line

POOL = logging.getLogger("psycopg.pool")
REFUSED = psycopg.OperationalError(
    'connection is bad: connection to server on socket "/tmp/.s.PGSQL.5432" failed: No such '
    "file or directory\n\tIs the server running locally and accepting connections?"
)


def _pool_warnings() -> None:
    """What psycopg_pool logs while the database is away (its own format strings)."""
    POOL.warning("discarding closed connection: %s", "<psycopg.AsyncConnection [BAD]>")
    for _ in range(5):
        POOL.warning("error connecting in %r: %s", "pool-7", REFUSED)
        POOL.warning("error connecting in %r: %s", "pool-other", psycopg.OperationalError("x"))
    POOL.warning("reconnection attempt in pool %r failed after %s sec", "pool-7", 10.0)


def test_an_outage_is_one_line_as_it_starts_and_one_as_it_ends(caplog):
    caplog.set_level(logging.WARNING)
    caplog.set_level(logging.INFO, logger="pgqueue.worker")
    quiet = PoolWarnings("pool-7")
    quiet.install()
    try:
        outage = OutageLog(quiet, running=lambda: 2)
        _pool_warnings()
        for _ in range(3):  # claims fail past their retries, again and again
            outage.failed(0.0, TimeoutError("couldn't get a connection after 5.00 sec"))
            _pool_warnings()
        outage.answered()
        POOL.warning("rolling back returned connection: %s", "<conn>")  # not an outage's
    finally:
        quiet.remove()
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "pgqueue.worker",
            "WARNING",
            "database unavailable (couldn't get a connection after 5.00 sec; last connection "
            f"error: {first_line(REFUSED)}): 2 job(s) keep running; claiming again when it "
            "answers",
        ),
        ("pgqueue.worker", "INFO", caplog.records[1].getMessage()),  # good news
        ("psycopg.pool", "WARNING", "rolling back returned connection: <conn>"),
    ]
    assert caplog.records[1].getMessage().startswith("database available again after ")
    assert quiet.cause is None  # reset by the claim that succeeded


def test_with_psycopg_logging_at_info_the_pool_warnings_show_as_info(caplog):
    caplog.set_level(logging.INFO, logger="psycopg")
    quiet = PoolWarnings("pool-7")
    quiet.install()
    try:
        _pool_warnings()
    finally:
        quiet.remove()
    pool = [r for r in caplog.records if r.name == "psycopg.pool"]
    assert len(pool) == 12 and {r.levelname for r in pool} == {"INFO"}


def test_without_a_worker_the_pool_warns_as_before(caplog):
    caplog.set_level(logging.WARNING)
    _pool_warnings()
    assert len(caplog.records) == 12
    assert {r.levelname for r in caplog.records} == {"WARNING"}


def test_another_loop_starts_the_outage_only_when_the_pool_cannot_connect(caplog):
    """The heartbeat, the rescuer and the upkeep loops report to the same outage: a connection
    not had from the pool while its last attempt to connect failed starts it (found by a
    tester: a busy worker, which claims nothing, reported no outage), and their failures
    during it are not logged apart (an idle worker logged each upkeep loop's). A pool merely
    busy, a session ended while the database accepts new ones, or a deadlock start none
    (tests/worker/test_kill_storm.py)."""
    caplog.set_level(logging.INFO, logger="pgqueue.worker")
    quiet = PoolWarnings("pool-7")
    outage = OutageLog(quiet, running=lambda: 3)
    waited = PoolTimeout("couldn't get a connection after 5.00 sec")
    ended = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    assert not outage.covers(waited)  # the pool is busy, nothing failed to connect
    assert not outage.covers(ended)
    assert not outage.covers(psycopg.errors.DeadlockDetected("deadlock detected"))
    assert not outage.known and not caplog.records
    quiet.install()
    try:
        POOL.warning("error connecting in %r: %s", "pool-7", REFUSED)
    finally:
        quiet.remove()
    assert outage.covers(waited)  # starts it
    assert outage.known
    assert outage.covers(ended) and outage.covers(waited)  # during it: said already
    assert not outage.covers(psycopg.errors.DeadlockDetected("deadlock detected"))
    outage.answered()
    outage.answered()
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [
        (
            "WARNING",
            "database unavailable (couldn't get a connection after 5.00 sec; last connection "
            f"error: {first_line(REFUSED)}): 3 job(s) keep running; claiming again when it "
            "answers",
        ),
        ("INFO", said[1][1]),
    ]
    assert said[1][1].startswith("database available again after ")
