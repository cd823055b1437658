"""LISTEN for enqueue wake-ups on a dedicated connection, re-established when it dies.

NOTIFY is a hint, never the truth: after every (re)connect the notifier wakes the producer once
so that it polls and catches up on anything it missed while deaf. The connection is
health-checked every ``health_check_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg
from tenacity import AsyncRetrying, retry_if_exception_type, wait_random_exponential

log = logging.getLogger("pgqueue.worker")

#: The channel the ``jobs_after_insert`` trigger notifies.
CHANNEL = "pgqueue_jobs"
#: ``application_name`` of the LISTEN connection (find it in ``pg_stat_activity``).
APPLICATION_NAME = "pgqueue-listen"


class Notifier:
    """Calls ``on_wake`` for every notification on :data:`CHANNEL` and after each reconnect."""

    def __init__(
        self, dsn: str, on_wake: Callable[[], None], *, health_check_seconds: float = 5.0
    ) -> None:
        self._dsn = dsn
        self._on_wake = on_wake
        self._health_check_seconds = health_check_seconds
        self.connects = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Listen until ``stop`` is set, reconnecting with jittered exponential backoff."""
        while not stop.is_set():
            try:
                conn = await self._connect(stop)
            except asyncio.CancelledError:
                raise
            if conn is None:
                return
            try:
                await self._listen(conn, stop)
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                log.warning("LISTEN connection lost (%s); reconnecting", exc)
            finally:
                await conn.close()

    async def _connect(self, stop: asyncio.Event) -> psycopg.AsyncConnection[object] | None:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type((psycopg.OperationalError, OSError)),
            wait=wait_random_exponential(multiplier=0.1, max=5.0),
        ):
            with attempt:
                if stop.is_set():
                    return None
                conn = await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True, application_name=APPLICATION_NAME
                )
                try:
                    await conn.execute("LISTEN pgqueue_jobs")  # == CHANNEL
                except BaseException:  # (found by a tester: the connection was left open)
                    await conn.close()
                    raise
                self.connects += 1
                self._on_wake()  # catch up on anything missed while not listening
                return conn
        return None  # pragma: no cover - AsyncRetrying retries until it returns

    async def _listen(self, conn: psycopg.AsyncConnection[object], stop: asyncio.Event) -> None:
        while not stop.is_set():
            async for _notify in conn.notifies(timeout=self._health_check_seconds):
                self._on_wake()
                if stop.is_set():
                    return
            await conn.execute("SELECT 1")  # health check: raises if the connection is gone
