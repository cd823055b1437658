"""`pgqueue sandbox` and `pgqueue dashboard` under a process supervisor: SIGTERM shuts the
server down and the command exits 0 (found by a tester: the sandbox exited 143, as uvicorn
raises the signal again once it has shut down), within a few seconds even with a request in
flight, which is answered (503), without a traceback; and a SIGTERM while the command still
loads is a clean stop too."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import pytest

from pgqueue.serving import GRACEFUL_STOP_SECONDS
from tests.apps.harness import REPO_ROOT, cli_env, pgqueue_cmd, wait_until


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_serving(server: subprocess.Popen[str], url: str) -> None:
    deadline = time.monotonic() + 30
    while True:  # until it answers
        try:
            httpx2.get(url, timeout=2).raise_for_status()
            return
        except httpx2.TransportError:
            assert server.poll() is None, "exited before it served"
            assert time.monotonic() < deadline, "did not start in 30 s"
            time.sleep(0.05)


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        pgqueue_cmd(*args),
        cwd=REPO_ROOT,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("command", "path"), [("sandbox", "/_sandbox/stats"), ("dashboard", "/")])
def test_sigterm_stops_the_server_with_exit_0(request, command, path):
    port = _free_port()
    args = [sys.executable, "-m", "pgqueue", command, "--port", str(port)]
    if command == "dashboard":
        args += ["--dsn", request.getfixturevalue("db_dsn")]
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_serving(server, f"http://127.0.0.1:{port}{path}")
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
    finally:
        server.kill()
        _, err = server.communicate()
    assert code == 0, err
    assert "Traceback" not in err, err


def _stop_with_a_request_in_flight(
    server: subprocess.Popen[str], send: Any, under_way: Any
) -> tuple[int, float, httpx2.Response, str]:
    """Send a request (``send()``) in a thread, SIGTERM the server once ``under_way()``; the
    exit code, the seconds from the signal to the exit, the answer and stderr."""
    answers: list[httpx2.Response] = []
    client = threading.Thread(target=lambda: answers.append(send()))
    client.start()
    try:
        wait_until(under_way, timeout=30, interval=0.05, what="the request under way")
        signalled = time.monotonic()
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=60)
        took = time.monotonic() - signalled
        client.join(10)
    finally:
        server.kill()
        _, err = server.communicate()
    assert answers, "no answer"
    return code, took, answers[0], err


@pytest.mark.timeout(120)
def test_sigterm_answers_the_sandbox_request_in_flight():
    """Found by a tester: SIGTERM 1.5 s into a 30 s answer (300 tokens at 0.1 s each): after
    uvicorn's grace the request was cancelled, the client got 500 and stderr an "Exception in
    ASGI application" traceback."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = _start(
        "sandbox", "--port", str(port), "--seconds-per-output-token", "0.1", "--otpm", "100000"
    )
    _wait_serving(server, f"{url}/_sandbox/stats")
    body = {"model": "m", "max_tokens": 300, "messages": [{"role": "user", "content": "hi"}]}

    def send() -> httpx2.Response:
        return httpx2.post(f"{url}/v1/messages", json=body, headers={"x-api-key": "k"}, timeout=60)

    def under_way() -> bool:
        return bool(httpx2.get(f"{url}/_sandbox/stats", timeout=5).json()["requests"] == 1)

    code, took, answer, err = _stop_with_a_request_in_flight(server, send, under_way)
    assert code == 0, err
    assert took < GRACEFUL_STOP_SECONDS + 5, took
    assert answer.status_code == 503, answer.text
    assert "shutting down" in answer.json()["error"]["message"]
    assert "Traceback" not in err and "ERROR" not in err, err


@pytest.mark.timeout(120)
def test_sigterm_cancels_the_dashboard_query_waiting_for_a_lock(db_dsn):
    """Found by a tester: with pgqueue.tenants locked by another session, a SIGTERM during
    GET /tenants waited for the lock (60 s), then printed "Cancel 1 running task(s)" and a
    CancelledError traceback."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = _start("dashboard", "--port", str(port), "--dsn", db_dsn)
    _wait_serving(server, f"{url}/")
    with psycopg.connect(db_dsn) as locker, psycopg.connect(db_dsn, autocommit=True) as watch:
        locker.execute("LOCK TABLE pgqueue.tenants IN ACCESS EXCLUSIVE MODE")

        def under_way() -> bool:
            row = watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                "'pgqueue-dashboard' AND wait_event_type = 'Lock'"
            ).fetchone()
            return row is not None and row[0] > 0

        code, took, answer, err = _stop_with_a_request_in_flight(
            server, lambda: httpx2.get(f"{url}/tenants", timeout=60), under_way
        )
        locker.rollback()
    assert code == 0, err
    assert took < GRACEFUL_STOP_SECONDS + 5, took
    assert answer.status_code == 503, answer.text
    assert "canceling statement" in answer.text
    assert "Traceback" not in err and "ERROR" not in err, err


def _catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM (Linux: its SigCgt mask)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


@pytest.mark.timeout(90)
@pytest.mark.parametrize("command", ["sandbox", "dashboard"])
def test_sigterm_while_the_command_loads_exits_0(request, command):
    """Found by a tester: a SIGTERM in the first 1-3 s (the command line loading) killed the
    server commands, exit 143. The launcher takes SIGTERM first; signalled as soon as it has,
    the command stops cleanly before it serves."""
    args = [command, "--port", str(_free_port())]
    if command == "dashboard":
        args += ["--dsn", request.getfixturevalue("db_dsn")]
    server = _start(*args)
    try:
        wait_until(lambda: _catches_sigterm(server.pid), timeout=30, interval=0.005, what="it")
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
    finally:
        server.kill()
        _, err = server.communicate()
    assert code == 0, err
    assert "Traceback" not in err, err
