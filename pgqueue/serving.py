"""Running an ASGI app under uvicorn: in the foreground until a signal (:func:`serve_until_stopped`,
the `sandbox` and `dashboard` commands), or in a background thread for tests, the demo and
benchmarks (:func:`serving_in_thread`, the sandbox's and the dashboard's ``running_*``)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import uvicorn

#: Seconds a stopping server gives the requests in flight (uvicorn's
#: ``timeout_graceful_shutdown``): the apps end their long waits as the stop begins
#: (:class:`StoppingServer`), so this is only a bound, past which uvicorn cancels them.
GRACEFUL_STOP_SECONDS = 3


class StoppingServer(uvicorn.Server):
    """A uvicorn server that, as its shutdown begins (a signal, or ``should_exit``), first
    awaits ``on_stop``: the app's cue to end its long waits (the sandbox's simulated latency,
    the dashboard's queries), so that the requests in flight are answered within
    :data:`GRACEFUL_STOP_SECONDS`. Found by testers: uvicorn cancelled them after its grace
    ("Cancel 1 running task(s)", a CancelledError traceback, the client got 500), and a page
    whose query waited for a lock held the dashboard's stop for as long as the lock."""

    def __init__(
        self, config: uvicorn.Config, on_stop: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        super().__init__(config)
        self._on_stop = on_stop

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._on_stop is not None:
            await self._on_stop()
        await super().shutdown(sockets)


def serve_until_stopped(server: uvicorn.Server) -> None:
    """Run ``server`` in this (the main) thread until SIGTERM or Ctrl-C, then return once it
    has shut down gracefully: a SIGTERM is a normal end (the command exits 0, as a stopped
    server does), Ctrl-C raises KeyboardInterrupt (the command line's 130).

    uvicorn answers either signal by shutting down, then raises it again under the handler
    that was there before it started (so that the process "dies of it"): for SIGTERM, the
    default one killed the process, exit 143 (found by a tester, `pgqueue sandbox` under a
    process supervisor). Here that handler only asks the server to stop (one that comes before
    uvicorn takes the signal over stops it as it starts). It raises nothing: found by a tester,
    a ``SystemExit`` raised from it ran inside the event loop, in a request's task.

    Raises:
        SystemExit: uvicorn's, when it cannot bind the address.
        KeyboardInterrupt: after a Ctrl-C (SIGINT), once the server has shut down.
    """

    def terminated(signum: int, frame: object) -> None:
        server.should_exit = True

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def serving_in_thread(
    make_server: Callable[[int], uvicorn.Server], name: str, timeout_seconds: float
) -> Iterator[str]:
    """Bind 127.0.0.1 on a free port, run ``make_server(port)`` in a daemon thread, and yield
    the base URL (``http://127.0.0.1:PORT``); on exit ask the server to stop, then force it
    after ``timeout_seconds``, and close the socket. The socket is bound before uvicorn
    starts, so the port is known without races.

    Args:
        make_server: the uvicorn server for a port (its config must use that port).
        name: what to call the server in the thread's name and in errors.
        timeout_seconds: how long to wait for uvicorn to start, and again to stop.

    Raises:
        RuntimeError: uvicorn failed, or did not start within ``timeout_seconds``.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    server = make_server(port)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # reported to the caller below
            errors.append(exc)

    thread = threading.Thread(target=run, name=f"pgqueue-{name}-{port}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + timeout_seconds
        while not server.started:
            if errors or not thread.is_alive():
                raise RuntimeError(f"{name} failed to start: {errors!r}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start in time")
            time.sleep(0.005)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout_seconds)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout_seconds)
        sock.close()
