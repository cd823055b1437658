"""One way to run an ASGI app under uvicorn in a background thread, for tests, the demo and
benchmarks: the sandbox's and the dashboard's ``running_*`` context managers share it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import uvicorn


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
