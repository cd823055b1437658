"""Burst mode (`pgqueue work --burst`): exit when nothing is left to run, and not before."""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg
import pytest

import pgqueue
from pgqueue import JobSpec
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker


@pytest.mark.timeout(120)
async def test_a_burst_worker_runs_jobs_whose_lease_expired_before_exiting(db_dsn: str) -> None:
    """Jobs left running by a dead worker, with their leases expired, were rescued by the burst
    worker's background rescuer after it had decided that nothing was left: it exited and left
    them queued. Now it rescues once more before exiting."""
    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue_many(
            conn, [JobSpec("t", "scheduled", {"n": i}, kind="pgqueue.noop") for i in range(4)]
        )
        conn.execute(  # a worker claimed them and died: leases expired
            "UPDATE pgqueue.jobs SET state = 'running', attempts = 1, worker_id = 'dead',"
            " lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second'"
        )
        conn.commit()
    # the background rescuer would only run after the worker had exited
    settings = Settings(poll_interval_seconds=0.1, rescue_interval_seconds=3600)
    worker = Worker(db_dsn, settings, concurrency=4, burst=True)
    worker._leases.rescue_loop = _never  # type: ignore[method-assign]
    stats = await worker.run(install_signal_handlers=False)

    assert stats.rescued == 4 and stats.outcomes["succeeded"] == 4
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute(
            "SELECT state::text, count(*) FROM pgqueue.jobs GROUP BY 1"
        ).fetchall() == [("succeeded", 4)]


@pytest.mark.timeout(120)
async def test_a_burst_worker_waits_for_the_leases_of_a_dead_worker(db_dsn: str) -> None:
    """Found by a tester: with a 10 s lease, `work --burst` started right after a worker was
    SIGKILLed said "nothing left to run; exiting" while the dead worker's jobs were still
    running under leases that ended 8 s later, inside the burst horizon. A lease ending within
    the horizon counts as a job due then: the burst worker waits, rescues and runs them."""
    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue_many(
            conn, [JobSpec("t", "scheduled", {"n": i}, kind="pgqueue.noop") for i in range(4)]
        )
        conn.execute(  # a worker claimed them and died: leases end in 2 s
            "UPDATE pgqueue.jobs SET state = 'running', attempts = 1, worker_id = 'dead',"
            " lease_token = gen_random_uuid(), lease_expires_at = now() + interval '2 seconds'"
        )
        conn.commit()
    settings = Settings(poll_interval_seconds=0.2, rescue_interval_seconds=3600)
    worker = Worker(db_dsn, settings, concurrency=4, burst=True)
    worker._leases.rescue_loop = _never  # type: ignore[method-assign]
    started = time.monotonic()
    stats = await worker.run(install_signal_handlers=False)

    assert stats.rescued == 4 and stats.outcomes["succeeded"] == 4
    assert 1.5 < time.monotonic() - started < 30
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute(
            "SELECT state::text, count(*) FROM pgqueue.jobs GROUP BY 1"
        ).fetchall() == [("succeeded", 4)]


@pytest.mark.timeout(120)
async def test_a_burst_worker_waits_for_a_live_workers_leases_at_most_the_horizon(
    db_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A live worker's heartbeat moves its leases on, so they always end within the horizon:
    the burst worker waits for them at most the horizon in all, then exits and says how many
    jobs run on under other leases."""
    caplog.set_level(logging.INFO, logger="pgqueue.worker")
    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue_many(conn, [JobSpec("t", "scheduled", {}, kind="pgqueue.noop")])
        conn.execute(
            "UPDATE pgqueue.jobs SET state = 'running', attempts = 1, worker_id = 'alive',"
            " lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 second'"
        )
        conn.commit()

    async def heartbeat() -> None:
        async with await psycopg.AsyncConnection.connect(db_dsn, autocommit=True) as conn:
            while True:
                await conn.execute(
                    "UPDATE pgqueue.jobs SET lease_expires_at = now() + interval '1 second'"
                )
                await asyncio.sleep(0.2)

    beating = asyncio.create_task(heartbeat())
    settings = Settings(poll_interval_seconds=0.2, burst_horizon_seconds=2)
    worker = Worker(db_dsn, settings, concurrency=2, burst=True)
    started = time.monotonic()
    try:
        stats = await worker.run(install_signal_handlers=False)
    finally:
        beating.cancel()
    assert 1.8 < time.monotonic() - started < 20
    assert stats.claimed == 0
    assert "burst: left 1 job(s) running under other workers' leases" in caplog.text


async def _never(_pool: object) -> None:
    """A background rescuer that never gets to run."""


@pytest.mark.timeout(120)
async def test_a_burst_worker_leaves_the_jobs_it_cannot_run_and_exits(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a tester following the README without an API key: the anthropic.messages jobs
    went back to the queue for 60 s, inside the burst horizon (60 s), and `--burst` claimed them
    again every minute, forever. Now a burst worker does not wait for jobs of kinds it cannot
    run (no API key, no handler): it runs the others and exits, and those stay queued."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("PGQUEUE_ANTHROPIC_API_KEY_FILE", raising=False)
    payload = {
        "model": "claude-haiku-4-5",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
    }
    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue_many(
            conn,
            [
                JobSpec("t", "scheduled", payload),
                JobSpec("t", "scheduled", {"n": 1}, kind="pgqueue.noop"),
                JobSpec("t", "scheduled", {"n": 2}, kind="no.such.kind"),
            ],
        )
        conn.commit()
    worker = Worker(db_dsn, Settings(poll_interval_seconds=0.1), concurrency=4, burst=True)
    # before the fix the worker never returned: the wait bounds the test, not its speed
    stats = await asyncio.wait_for(worker.run(install_signal_handlers=False), 50)

    assert stats.outcomes["succeeded"] == 1
    with psycopg.connect(db_dsn) as conn:
        rows = conn.execute("SELECT kind, state::text FROM pgqueue.jobs ORDER BY id").fetchall()
    assert rows == [
        ("anthropic.messages", "queued"),
        ("pgqueue.noop", "succeeded"),
        ("no.such.kind", "queued"),
    ]
    with psycopg.connect(db_dsn) as conn:
        # the Messages API job was never claimed (no key: its lane is left to other workers,
        # its key and place kept); the job of a kind with no handler was, once, and put back
        claimed = conn.execute(
            "SELECT kind, started_at IS NOT NULL, key_round IS NOT NULL FROM pgqueue.jobs"
            " WHERE state = 'queued' ORDER BY id"
        ).fetchall()
    assert claimed == [("anthropic.messages", False, True), ("no.such.kind", True, False)]


@pytest.mark.timeout(120)
async def test_the_burst_exit_names_only_the_kinds_left_queued(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by a tester: a burst worker without an API key always warned at exit that
    anthropic.messages jobs "stay queued", with none queued. It names the kinds still queued,
    and says nothing when none is."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("PGQUEUE_ANTHROPIC_API_KEY_FILE", raising=False)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.enqueue_many(conn, [JobSpec("t", "scheduled", {"n": 1}, kind="pgqueue.noop")])
    caplog.set_level(logging.WARNING, logger="pgqueue.worker")
    worker = Worker(db_dsn, Settings(poll_interval_seconds=0.1), concurrency=2, burst=True)
    await asyncio.wait_for(worker.run(install_signal_handlers=False), 50)
    assert not [r for r in caplog.records if "stay queued" in r.getMessage()]

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.enqueue_many(conn, [JobSpec("t", "scheduled", {"n": 2}, kind="no.such.kind")])
    caplog.clear()
    worker = Worker(db_dsn, Settings(poll_interval_seconds=0.1), concurrency=2, burst=True)
    await asyncio.wait_for(worker.run(install_signal_handlers=False), 50)
    said = [r.getMessage() for r in caplog.records if "stay queued" in r.getMessage()]
    assert len(said) == 1 and "no.such.kind" in said[0] and "anthropic" not in said[0], said


@pytest.mark.timeout(120)
async def test_a_burst_worker_does_not_wait_for_jobs_it_has_no_handler_for(
    db_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by a tester: a first `work --burst` put an `x.unknown` job back for 60 s (no
    handler); a second waited those 60 s in silence, claimed it, put it back again and exited.
    Now a burst worker learns the queued kinds it has no handler for before it would wait for
    them, and says what it leaves; it still waits for the jobs it can run (one due in 2 s)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.enqueue_many(
            conn,
            [
                JobSpec("t", "scheduled", {"n": 1}, kind="x.unknown"),
                JobSpec("t", "scheduled", {"n": 2}, kind="pgqueue.noop"),
            ],
        )
        # as an earlier burst run left them: put back for 60 s; and a job it can run, soon
        conn.execute("UPDATE pgqueue.jobs SET run_at = now() + interval '60 seconds'")
        conn.execute(
            "UPDATE pgqueue.jobs SET run_at = now() + interval '2 seconds'"
            " WHERE kind = 'pgqueue.noop'"
        )
    caplog.set_level(logging.WARNING, logger="pgqueue.worker")
    worker = Worker(db_dsn, Settings(poll_interval_seconds=0.1), concurrency=2, burst=True)
    loop = asyncio.get_running_loop()
    began = loop.time()
    stats = await asyncio.wait_for(worker.run(install_signal_handlers=False), 50)
    took = loop.time() - began

    assert stats.claimed == 1 and stats.outcomes == {"succeeded": 1}
    assert 2 <= took < 30, took  # waited for the noop job, not for the x.unknown one (60 s)
    said = [r.getMessage() for r in caplog.records if "burst: left" in r.getMessage()]
    assert said == [
        "burst: left 1 queued job of kinds without a handler: x.unknown; they stay queued "
        "for a worker that can run them"
    ]
    with psycopg.connect(db_dsn) as conn:
        rows = conn.execute("SELECT kind, state::text, attempts FROM pgqueue.jobs ORDER BY id")
        assert rows.fetchall() == [("x.unknown", "queued", 0), ("pgqueue.noop", "succeeded", 1)]
