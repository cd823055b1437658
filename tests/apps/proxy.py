"""A TCP proxy for fault tests: forwards connections to Postgres, and on :meth:`Proxy.freeze`
stops forwarding on the connections it has without closing them (a half-open peer, as a
dropped NAT entry or a dead host leaves it), while new connections are forwarded as usual."""

from __future__ import annotations

import asyncio
import contextlib

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class Proxy:
    """Run it in the test's event loop: ``proxy = await Proxy.start(dsn)``, then connect to
    ``proxy.dsn``; ``await proxy.close()`` at the end."""

    def __init__(self, target_dsn: str) -> None:
        params = conninfo_to_dict(target_dsn)
        self._host = str(params.get("host") or "127.0.0.1")
        self._port = int(params.get("port") or 5432)
        self._target_dsn = target_dsn
        self._server: asyncio.Server | None = None
        self._pipes: list[tuple[asyncio.Task[None], asyncio.Task[None]]] = []
        self._writers: list[asyncio.StreamWriter] = []
        self.dsn = ""

    @classmethod
    async def start(cls, target_dsn: str) -> Proxy:
        proxy = cls(target_dsn)
        proxy._server = await asyncio.start_server(proxy._accept, "127.0.0.1", 0)
        port = proxy._server.sockets[0].getsockname()[1]
        proxy.dsn = make_conninfo(target_dsn, host="127.0.0.1", port=str(port))
        return proxy

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
        self._writers += [writer, up_writer]
        self._pipes.append(
            (
                asyncio.create_task(_pipe(reader, up_writer)),
                asyncio.create_task(_pipe(up_reader, writer)),
            )
        )

    def freeze(self) -> int:
        """Stop forwarding on every connection made so far, leaving their sockets open;
        returns how many were frozen."""
        frozen = 0
        for pair in self._pipes:
            for task in pair:
                task.cancel()
            frozen += 1
        self._pipes.clear()
        return frozen

    async def close(self) -> None:
        self.freeze()
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    # (the end of a pipe that was not frozen: close its other end, as a proxy does)
    writer.close()
