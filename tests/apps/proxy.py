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
        # per pipe pair: the client's first bytes (its startup message names the application)
        self._hello: list[bytearray] = []
        self._writers: list[asyncio.StreamWriter] = []
        self.dsn = ""

    def count(self, application_name: str) -> int:
        """How many live (not frozen) connections named ``application_name`` it forwards."""
        return sum(
            1
            for pair, hello in zip(self._pipes, self._hello, strict=True)
            if application_name.encode() in hello and not pair[0].done()
        )

    @classmethod
    async def start(cls, target_dsn: str) -> Proxy:
        proxy = cls(target_dsn)
        proxy._server = await asyncio.start_server(proxy._accept, "127.0.0.1", 0)
        port = proxy._server.sockets[0].getsockname()[1]
        proxy.dsn = make_conninfo(target_dsn, host="127.0.0.1", port=str(port))
        return proxy

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self._host.startswith("/"):  # a Unix socket folder, as libpq reads it
                up_reader, up_writer = await asyncio.open_unix_connection(
                    f"{self._host}/.s.PGSQL.{self._port}"
                )
            else:
                up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
        except OSError:  # the server is down: refuse as it would
            writer.close()
            return
        self._writers += [writer, up_writer]
        hello = bytearray()
        self._hello.append(hello)
        self._pipes.append(
            (
                asyncio.create_task(_pipe(reader, up_writer, hello)),
                asyncio.create_task(_pipe(up_reader, writer)),
            )
        )

    def freeze(self, application_name: str | None = None) -> int:
        """Stop forwarding on every connection made so far (or only those whose startup
        message names ``application_name``), leaving their sockets open; returns how many were
        frozen."""
        frozen = 0
        kept: list[tuple[asyncio.Task[None], asyncio.Task[None]]] = []
        kept_hello: list[bytearray] = []
        for pair, hello in zip(self._pipes, self._hello, strict=True):
            if application_name is not None and application_name.encode() not in hello:
                kept.append(pair)
                kept_hello.append(hello)
                continue
            for task in pair:
                task.cancel()
            frozen += 1
        self._pipes, self._hello = kept, kept_hello
        return frozen

    async def close(self) -> None:
        self.freeze()
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hello: bytearray | None = None
) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            if hello is not None and len(hello) < 4096:
                hello += data[: 4096 - len(hello)]
            writer.write(data)
            await writer.drain()
    # (the end of a pipe that was not frozen: close its other end, as a proxy does)
    writer.close()
