"""`pgqueue sandbox` and `pgqueue dashboard` under a process supervisor: SIGTERM shuts the
server down and the command exits 0 (found by a tester: the sandbox exited 143, as uvicorn
raises the signal again once it has shut down)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx2
import pytest


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("command", "path"), [("sandbox", "/_sandbox/stats"), ("dashboard", "/")])
def test_sigterm_stops_the_server_with_exit_0(request, command, path):
    port = _free_port()
    args = [sys.executable, "-m", "pgqueue", command, "--port", str(port)]
    if command == "dashboard":
        args += ["--dsn", request.getfixturevalue("db_dsn")]
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:  # until it answers
            try:
                httpx2.get(f"http://127.0.0.1:{port}{path}", timeout=2).raise_for_status()
                break
            except httpx2.TransportError:
                assert server.poll() is None, "exited before it served"
                assert time.monotonic() < deadline, "did not start in 30 s"
                time.sleep(0.05)
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
    finally:
        server.kill()
        _, err = server.communicate()
    assert code == 0, err
    assert "Traceback" not in err, err
