"""The LISTEN connection: a connection whose LISTEN fails is closed before the next try; a
half-open one is found and replaced; one that delivers nothing is reported."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgqueue.worker.notifier import Notifier
from tests.apps.harness import wait_until
from tests.apps.proxy import Proxy


@pytest.mark.timeout(60)
async def test_a_connection_whose_listen_failed_is_closed(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a tester (a ResourceWarning under ``python -X dev``): when LISTEN failed right
    after connecting (the backend terminated), the connection was left open and a new one
    made for the next try."""
    opened: list[psycopg.AsyncConnection[Any]] = []
    connect = psycopg.AsyncConnection.connect
    execute = psycopg.AsyncConnection.execute

    async def recording_connect(*args: Any, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
        conn = await connect(*args, **kwargs)
        opened.append(conn)
        return conn

    async def listen_fails_once(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if query == "LISTEN pgqueue_jobs" and len(opened) == 1:
            raise psycopg.OperationalError("terminating connection due to administrator command")
        return await execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", recording_connect)
    monkeypatch.setattr(psycopg.AsyncConnection, "execute", listen_fails_once)
    stop = asyncio.Event()
    # the first wake-up (after LISTEN) stops it; no probe (a connection of its own)
    notifier = Notifier(db_dsn, stop.set, probe_seconds=None)
    await asyncio.wait_for(notifier.run(stop), timeout=30)

    assert notifier.connects == 1
    assert len(opened) == 2
    assert all(conn.closed for conn in opened)


async def _until(probe: Callable[[], bool], seconds: float, what: str) -> None:
    await asyncio.to_thread(wait_until, probe, timeout=seconds, what=what)


@pytest.mark.timeout(60)
async def test_a_half_open_listen_connection_is_found_and_replaced(db_dsn: str) -> None:
    """Issue 32, defect 6: when the LISTEN connection stopped forwarding without closing, its
    health check (``SELECT 1``, no timeout) hung for minutes and no NOTIFY woke the worker."""
    proxy = await Proxy.start(db_dsn)
    wakes: list[int] = []
    stop = asyncio.Event()
    notifier = Notifier(
        proxy.dsn,
        lambda: wakes.append(1),
        health_check_seconds=0.2,
        health_timeout_seconds=0.5,
        probe_seconds=None,
    )
    task = asyncio.create_task(notifier.run(stop))
    try:
        await _until(lambda: notifier.connects == 1, 20, "the first LISTEN")
        assert proxy.freeze() == 1  # half-open: nothing forwarded, nothing closed
        await _until(lambda: notifier.connects == 2, 30, "a new LISTEN connection")
        before = len(wakes)
        async with await psycopg.AsyncConnection.connect(db_dsn, autocommit=True) as conn:
            await conn.execute("NOTIFY pgqueue_jobs, 'standard'")
        await _until(lambda: len(wakes) > before, 20, "a wake-up through the new connection")
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await proxy.close()


@pytest.mark.timeout(60)
async def test_listen_that_delivers_nothing_is_reported(
    db_dsn: str, server_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 32, defect 10: behind PgBouncer in transaction mode LISTEN succeeds but nothing is
    ever delivered, and the worker silently polled. The probe's NOTIFY is sent here to another
    database, where this LISTEN cannot hear it, as through such a pooler."""
    for probe_dsn, delivers in ((None, True), (server_dsn, False)):
        stop = asyncio.Event()
        notifier = Notifier(
            db_dsn,
            lambda: None,
            health_check_seconds=0.2,
            probe_seconds=1.0,
            probe_dsn=probe_dsn,
            poll_interval_seconds=2,
        )
        task = asyncio.create_task(notifier.run(stop))
        with caplog.at_level(logging.WARNING, logger="pgqueue.worker"):
            await _until(lambda: notifier.delivers is not None, 20, "the probe")  # noqa: B023
        stop.set()
        await asyncio.wait_for(task, 30)
        assert notifier.delivers is delivers
        warned = [r.message for r in caplog.records if "test NOTIFY did not come back" in r.message]
        assert len(warned) == (0 if delivers else 1)
        if warned:
            assert "polling (every 2 s)" in warned[0]
            assert "--no-listen" in warned[0]
