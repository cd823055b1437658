"""Run the sandbox app under uvicorn: blocking (``serve``) or in a background thread.

One job: process plumbing. ``serve`` is for the CLI / a terminal; ``running_sandbox`` is for
tests, the demo and benchmarks — it binds 127.0.0.1 on a free port, starts uvicorn in a
daemon thread, yields the base URL to hand to ``anthropic.Anthropic(base_url=...)`` and
stops the server on exit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette

from pgqueue.sandbox.app import SandboxConfig, create_app
from pgqueue.serving import (
    GRACEFUL_STOP_SECONDS,
    StoppingServer,
    serve_until_stopped,
    serving_in_thread,
)

__all__ = ["running_sandbox", "serve"]

#: Seconds ``running_sandbox`` waits for uvicorn to start, and again for it to stop.
STARTUP_TIMEOUT_SECONDS = 10.0


def _uvicorn_config(
    app: Starlette, host: str, port: int, *, configure_logging: bool = True
) -> uvicorn.Config:
    """uvicorn settings; ``configure_logging=False`` leaves the process's logging config alone."""
    logging_kwargs: dict[str, Any] = {} if configure_logging else {"log_config": None}
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http="h11",
        ws="none",
        lifespan="off",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=GRACEFUL_STOP_SECONDS,
        **logging_kwargs,
    )


def serve(config: SandboxConfig, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the sandbox on ``host:port`` until stopped (blocks): SIGTERM shuts it down and
    returns (requests in flight are answered 503 at once), Ctrl-C shuts it down and raises
    KeyboardInterrupt (:func:`serve_until_stopped`).

    Raises:
        SystemExit: uvicorn's, if it cannot bind the address (it logs why).
        KeyboardInterrupt: after Ctrl-C.
    """
    app = create_app(config)
    serve_until_stopped(_server(_uvicorn_config(app, host=host, port=port)))


def _server(config: uvicorn.Config) -> StoppingServer:
    """A server of the sandbox app ``config.app``: as it stops, the simulated latency of the
    requests in flight ends (they are answered 503)."""
    app = config.app
    assert isinstance(app, Starlette)

    async def stop() -> None:
        app.state.stopping.set()

    return StoppingServer(config, on_stop=stop)


@contextmanager
def running_sandbox(
    config: SandboxConfig | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
) -> Iterator[str]:
    """Run the sandbox in a background thread; yield its base URL, e.g. ``http://127.0.0.1:54321``.

    The socket is bound to 127.0.0.1 port 0 before uvicorn starts, so the port is free and
    known without races. On exit the server is asked to stop and the thread joined.

    Args:
        config: sandbox behaviour; defaults to ``SandboxConfig()``.
        clock: monotonic clock in seconds for the rate limiter.
        wall_clock: epoch seconds for reset headers and stats.

    Raises:
        RuntimeError: if uvicorn does not start within ``STARTUP_TIMEOUT_SECONDS``.
    """
    app = create_app(config, clock=clock, wall_clock=wall_clock)
    with serving_in_thread(
        lambda port: _server(
            _uvicorn_config(app, host="127.0.0.1", port=port, configure_logging=False)
        ),
        "sandbox server",
        STARTUP_TIMEOUT_SECONDS,
    ) as url:
        yield url
