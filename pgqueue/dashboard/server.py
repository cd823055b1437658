"""Run the dashboard under uvicorn: blocking (``serve``, for ``pgqueue dashboard``) or in a
background thread on a free port of 127.0.0.1 (``running_dashboard``, for tests and bench)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from pgqueue.dashboard.app import DashboardConfig, create_app

#: Seconds ``running_dashboard`` waits for uvicorn to start, and again for it to stop.
STARTUP_TIMEOUT_SECONDS = 15.0


def _config(config: DashboardConfig, host: str, port: int, *, quiet: bool) -> uvicorn.Config:
    # quiet: leave the process's logging config alone (tests, bench)
    logging_kwargs: dict[str, Any] = {"log_config": None} if quiet else {}
    return uvicorn.Config(
        create_app(config),
        host=host,
        port=port,
        http="h11",
        ws="none",
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=2,
        **logging_kwargs,
    )


def serve(config: DashboardConfig, host: str = "127.0.0.1", port: int = 8780) -> None:
    """Serve the dashboard on ``host:port`` until interrupted (blocks; Ctrl-C stops it).

    Raises:
        SystemExit: uvicorn could not bind the address or open the database pool.
    """
    uvicorn.Server(_config(config, host, port, quiet=False)).run()


@contextmanager
def running_dashboard(config: DashboardConfig) -> Iterator[str]:
    """Run the dashboard in a daemon thread; yield its base URL (``http://127.0.0.1:PORT``),
    stop it on exit. The socket is bound before uvicorn starts, so the port is known.

    Raises:
        RuntimeError: uvicorn did not start within :data:`STARTUP_TIMEOUT_SECONDS`.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    server = uvicorn.Server(_config(config, "127.0.0.1", port, quiet=True))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # reported to the caller below
            errors.append(exc)

    thread = threading.Thread(target=run, name=f"pgqueue-dashboard-{port}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while not server.started:
            if errors or not thread.is_alive():
                raise RuntimeError(f"dashboard failed to start: {errors!r}")
            if time.monotonic() > deadline:
                raise RuntimeError("dashboard did not start in time")
            time.sleep(0.005)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(STARTUP_TIMEOUT_SECONDS)
        if thread.is_alive():
            server.force_exit = True
            thread.join(STARTUP_TIMEOUT_SECONDS)
        sock.close()
