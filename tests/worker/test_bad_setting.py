"""A malformed ``pgqueue.*`` setting (issue 28's loose end): the claim failed with a cast's
error ("invalid input syntax for type integer") and the worker exited, to be restarted into the
same error. Now the claim raises PQ012 (:class:`~pgqueue.errors.InvalidSetting`); a worker logs
one line naming the setting, keeps running, and claims again once the setting is fixed (its
pooled connections are replaced, so an ``ALTER DATABASE`` fix is read); a burst worker stops
with the error."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest
from psycopg import sql

import pgqueue
from pgqueue import JobSpec
from pgqueue.errors import InvalidSetting
from pgqueue.settings import Settings
from pgqueue.worker import producer
from pgqueue.worker.runtime import Worker

MESSAGE = "pgqueue.stamp_horizon_rounds must be an integer from 0 to 1000, got 'abc'"


def _set_horizon(dsn: str, value: str | None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        name = sql.Identifier(conn.info.dbname)
        if value is None:
            conn.execute(
                sql.SQL("ALTER DATABASE {} RESET pgqueue.stamp_horizon_rounds").format(name)
            )
        else:
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET pgqueue.stamp_horizon_rounds = {}").format(
                    name, sql.Literal(value)
                )
            )


def _states(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT state::text FROM pgqueue.jobs ORDER BY id")]


@pytest.mark.timeout(120)
async def test_a_worker_names_the_setting_and_resumes_once_fixed(
    db_dsn: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(producer, "BAD_SETTING_PAUSE_SECONDS", 0.2)
    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue_many(conn, [JobSpec("t", "scheduled", {}, kind="pgqueue.noop")])
        conn.commit()
    _set_horizon(db_dsn, "abc")
    worker = Worker(db_dsn, Settings(poll_interval_seconds=0.1), concurrency=2)
    caplog.set_level(logging.INFO, logger="pgqueue.worker")
    run = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        await asyncio.sleep(2.0)
        assert not run.done()  # still up
        assert _states(db_dsn) == ["queued"]
        paused = [r for r in caplog.records if "claims paused" in r.getMessage()]
        assert len(paused) == 1  # one line, not one per try
        assert paused[0].levelno == logging.ERROR
        assert MESSAGE in paused[0].getMessage()
        assert "Traceback" not in caplog.text

        _set_horizon(db_dsn, None)  # read by the connections the worker opens from now on
        for _ in range(100):
            if _states(db_dsn) == ["succeeded"]:
                break
            await asyncio.sleep(0.1)
        assert _states(db_dsn) == ["succeeded"]
        assert any("claims resumed" in r.getMessage() for r in caplog.records)
    finally:
        worker.request_stop()
        stats = await asyncio.wait_for(run, 30)
    assert stats.outcomes["succeeded"] == 1


@pytest.mark.timeout(120)
async def test_a_burst_worker_stops_with_the_error(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue_many(conn, [JobSpec("t", "scheduled", {}, kind="pgqueue.noop")])
        conn.commit()
    _set_horizon(db_dsn, "abc")
    worker = Worker(db_dsn, Settings(poll_interval_seconds=0.1), concurrency=2, burst=True)
    with pytest.raises(InvalidSetting, match="stamp_horizon_rounds must be an integer"):
        await asyncio.wait_for(worker.run(install_signal_handlers=False), 60)
    assert _states(db_dsn) == ["queued"]


@pytest.mark.timeout(120)
async def test_a_setting_read_only_at_completion_stops_the_claims(db_dsn: str) -> None:
    """pgqueue.demotion_throttle_threshold is read only where an outcome is written: before
    pgqueue.settings_check the job was claimed and sent, its outcome could not be written, and
    each rescue sent the request again (found by a tester). Now nothing is claimed."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.enqueue_many(conn, [JobSpec("t", "scheduled", {}, kind="pgqueue.noop")])
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET pgqueue.demotion_throttle_threshold = 0").format(
                sql.Identifier(conn.info.dbname)
            )
        )
    worker = Worker(db_dsn, Settings(poll_interval_seconds=0.1), concurrency=2, burst=True)
    with pytest.raises(InvalidSetting, match="demotion_throttle_threshold must be an integer"):
        await asyncio.wait_for(worker.run(install_signal_handlers=False), 60)
    assert _states(db_dsn) == ["queued"]
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT attempts FROM pgqueue.jobs").fetchone() == (0,)
