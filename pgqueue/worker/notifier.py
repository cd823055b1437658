"""LISTEN for enqueue wake-ups on a dedicated connection, re-established when it dies.

NOTIFY is a hint, never the truth: after every (re)connect the notifier wakes the producer once
so that it polls and catches up on anything it missed while deaf. The connection is
health-checked every ``health_check_seconds``, and a check that gets no answer within
``health_timeout_seconds`` ends it (with TCP keepalives as a second net): found by a fault run,
a LISTEN connection that stopped forwarding without closing (half-open) hung its ``SELECT 1``
for over 4 minutes, and wake-ups came only at the poll interval.

Once, after the first connect, a NOTIFY sent from another connection must come back within
``probe_seconds``: behind PgBouncer in transaction (or statement) pooling, LISTEN "works" but
no notification is ever delivered, and the worker silently polls. It says so instead.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

import psycopg
from psycopg import sql
from tenacity import AsyncRetrying, retry_if_exception_type, wait_random_exponential

from pgqueue.worker.connections import CONNECTION_OPTIONS
from pgqueue.worker.transient import first_line

log = logging.getLogger("pgqueue.worker")

#: The channel the ``jobs_after_insert`` trigger notifies.
CHANNEL = "pgqueue_jobs"
#: ``application_name`` of the LISTEN connection (find it in ``pg_stat_activity``).
APPLICATION_NAME = "pgqueue-listen"


class ListenUnanswered(psycopg.OperationalError):
    """The LISTEN connection did not answer its health check in time (half-open)."""


class Notifier:
    """Calls ``on_wake`` for every notification on :data:`CHANNEL` and after each reconnect.

    Args:
        dsn: the database to LISTEN on.
        on_wake: called for every wake-up (no arguments; cheap, never blocks).
        health_check_seconds: a ``SELECT 1`` after this long without a notification.
        health_timeout_seconds: how long that check may take before the connection is judged
            dead and replaced.
        probe_seconds: how long the first connection waits for its own test NOTIFY before
            warning that notifications do not arrive (None: no probe).
        probe_dsn: where the test NOTIFY is sent from (default ``dsn``).
    """

    def __init__(
        self,
        dsn: str,
        on_wake: Callable[[], None],
        *,
        health_check_seconds: float = 5.0,
        health_timeout_seconds: float = 5.0,
        probe_seconds: float | None = 5.0,
        probe_dsn: str | None = None,
        poll_interval_seconds: float | None = None,
    ) -> None:
        self._dsn = dsn
        self._on_wake = on_wake
        self._health_check_seconds = health_check_seconds
        self._health_timeout_seconds = health_timeout_seconds
        self._probe_seconds = probe_seconds
        self._probe_dsn = probe_dsn or dsn
        self._poll_interval_seconds = poll_interval_seconds
        self.connects = 0
        #: whether the probe got its notification back (None: not run yet, or no probe)
        self.delivers: bool | None = None

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
                if self.delivers is None and self._probe_seconds is not None:
                    try:
                        async with asyncio.timeout(
                            self._probe_seconds + self._health_timeout_seconds
                        ):
                            await self._probe(conn, self._probe_seconds)
                    except TimeoutError:
                        raise ListenUnanswered("no answer while probing LISTEN") from None
                await self._listen(conn, stop)
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                # one line: libpq's message spans three ("server closed the connection ...")
                log.warning("LISTEN connection lost (%s); reconnecting", first_line(exc))
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
                    self._dsn,
                    autocommit=True,
                    application_name=APPLICATION_NAME,
                    **CONNECTION_OPTIONS,
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

    async def _probe(self, conn: psycopg.AsyncConnection[object], seconds: float) -> None:
        """Send a NOTIFY on a channel of this connection's own from another connection and
        wait for it; warn when it does not come (a pooler that does not forward them)."""
        channel = f"pgqueue_probe_{uuid.uuid4().hex[:12]}"
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        async with await psycopg.AsyncConnection.connect(
            self._probe_dsn, autocommit=True, **CONNECTION_OPTIONS
        ) as sender:
            await sender.execute(sql.SQL("NOTIFY {}").format(sql.Identifier(channel)))
        delivered = False
        async for notify in conn.notifies(timeout=seconds):
            if notify.channel == channel:
                delivered = True
                break
            self._on_wake()
        await conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel)))
        self.delivers = delivered
        if not delivered:
            polling = (
                f"every {self._poll_interval_seconds:g} s"
                if self._poll_interval_seconds is not None
                else "at the poll interval"
            )
            log.warning(
                "--listen: a test NOTIFY did not come back within %g s, so this worker will "
                "find new jobs only by polling (%s). A connection pooler in transaction or "
                "statement mode (PgBouncer) does not deliver notifications: point the worker "
                "at Postgres or a session-mode pool, or run it with --no-listen",
                seconds,
                polling,
            )

    async def _listen(self, conn: psycopg.AsyncConnection[object], stop: asyncio.Event) -> None:
        while not stop.is_set():
            async for _notify in conn.notifies(timeout=self._health_check_seconds):
                self._on_wake()
                if stop.is_set():
                    return
            await self._health_check(conn)

    async def _health_check(self, conn: psycopg.AsyncConnection[object]) -> None:
        """``SELECT 1`` within ``health_timeout_seconds``.

        Raises:
            ListenUnanswered: no answer in time (psycopg then cancels the query and, if that
                gets no answer either, closes the connection: at most ~10 s more).
            psycopg.OperationalError: the connection is gone.
        """
        try:
            async with asyncio.timeout(self._health_timeout_seconds):
                await conn.execute("SELECT 1")
        except TimeoutError:
            raise ListenUnanswered(
                f"no answer to a health check within {self._health_timeout_seconds:g} s"
            ) from None
