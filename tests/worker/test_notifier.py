"""The LISTEN connection: a connection whose LISTEN fails is closed before the next try."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from pgqueue.worker.notifier import Notifier


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
    notifier = Notifier(db_dsn, stop.set)  # the first wake-up (after LISTEN) stops it
    await asyncio.wait_for(notifier.run(stop), timeout=30)

    assert notifier.connects == 1
    assert len(opened) == 2
    assert all(conn.closed for conn in opened)
