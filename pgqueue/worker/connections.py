"""The worker's pooled connections: libpq options, and the check a connection passes before
the pool hands it out.

Found by a fault run: with every backend of the database terminated every 0.3-1.0 s, workers
logged "database unavailable" for minutes while the database accepted connections. Idle pooled
connections had been terminated, the pool handed them out one after another, and every claim
and its retries met a dead one. A terminated backend's last words (an error, then EOF) wait
unread on the idle socket: :class:`WorkerPool` looks for them without a round trip, and
discards that connection and hands out another.
"""

from __future__ import annotations

import select
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from pgqueue.worker.outage import OutageLog

#: libpq options for the worker's connections: TCP keepalives (a peer gone without a close is
#: found after about 30 + 3 × 10 s of silence) and a bound on connecting (seconds). libpq
#: ignores the keepalives on a Unix socket.
CONNECTION_OPTIONS: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "connect_timeout": 10,
}


def ended_while_idle(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether ``conn``, idle in the pool, is closed or has something to read: an idle
    connection has nothing to read unless its server ended it (an error message, then EOF).
    One ``select`` on the socket, no round trip."""
    if conn.closed or conn.broken:
        return True
    try:
        readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError, psycopg.OperationalError):
        return True
    return bool(readable)


class WorkerPool(AsyncConnectionPool[Any]):
    """psycopg_pool's pool whose :meth:`getconn` never hands out a connection its server ended
    while it sat idle (:func:`ended_while_idle`): such a connection is closed and given back
    (the pool replaces it) and the next one is taken, at once. (psycopg_pool's own ``check``
    waits 1, 2, 4 … s between failed checks: under a storm of terminations it stalled every
    claim for tens of seconds.)

    ``outage`` is the worker's :class:`~pgqueue.worker.outage.OutageLog`, which the loops
    that run on this pool report their connection failures to (None: they log them)."""

    outage: OutageLog | None = None

    async def getconn(self, timeout: float | None = None) -> Any:  # noqa: ASYNC109 (the base's)
        for _ in range(self.max_size):
            conn = await super().getconn(timeout)
            if not ended_while_idle(conn):
                return conn
            await conn.close()
            await self.putconn(conn)
        return await super().getconn(timeout)
