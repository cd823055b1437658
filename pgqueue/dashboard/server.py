"""Run the dashboard under uvicorn: blocking (``serve``, for ``pgqueue dashboard``) or in a
background thread on a free port of 127.0.0.1 (``running_dashboard``, for tests and bench)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from pgqueue.dashboard.app import Dashboard, DashboardConfig, create_app
from pgqueue.serving import (
    GRACEFUL_STOP_SECONDS,
    StoppingServer,
    serve_until_stopped,
    serving_in_thread,
)

#: Seconds ``running_dashboard`` waits for uvicorn to start, and again for it to stop.
STARTUP_TIMEOUT_SECONDS = 15.0


def _server(config: DashboardConfig, host: str, port: int, *, quiet: bool) -> StoppingServer:
    """A server of the dashboard: as it stops, the statements of the pages under way are
    cancelled (:meth:`Dashboard.cancel_statements`)."""
    app = create_app(config)
    board: Dashboard = app.state.dashboard
    # quiet: leave the process's logging config alone (tests, bench)
    logging_kwargs: dict[str, Any] = {"log_config": None} if quiet else {}
    settings = uvicorn.Config(
        app,
        host=host,
        port=port,
        http="h11",
        ws="none",
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=GRACEFUL_STOP_SECONDS,
        **logging_kwargs,
    )

    async def stop() -> None:
        await asyncio.to_thread(board.cancel_statements)

    return StoppingServer(settings, on_stop=stop)


def serve(config: DashboardConfig, host: str = "127.0.0.1", port: int = 8780) -> None:
    """Serve the dashboard on ``host:port`` until stopped (blocks): SIGTERM shuts it down and
    returns (the statements of pages under way are cancelled: they answer 503), Ctrl-C shuts
    it down and raises KeyboardInterrupt (:func:`serve_until_stopped`).

    Raises:
        SystemExit: uvicorn's, if it could not bind the address or open the database pool.
        KeyboardInterrupt: after Ctrl-C.
    """
    serve_until_stopped(_server(config, host, port, quiet=False))


@contextmanager
def running_dashboard(config: DashboardConfig) -> Iterator[str]:
    """Run the dashboard in a daemon thread; yield its base URL (``http://127.0.0.1:PORT``),
    stop it on exit. The socket is bound before uvicorn starts, so the port is known.

    Raises:
        RuntimeError: uvicorn did not start within :data:`STARTUP_TIMEOUT_SECONDS`.
    """
    with serving_in_thread(
        lambda port: _server(config, "127.0.0.1", port, quiet=True),
        "dashboard",
        STARTUP_TIMEOUT_SECONDS,
    ) as url:
        yield url
