"""Behind PgBouncer in transaction mode (issue 32, defect 10): a worker that prepares
statements is told what to set, not "invalid DSN or query"; with --listen it warns that it
only polls; with ``PGQUEUE_PREPARE_THRESHOLD=none`` it works. Skipped without ``pgbouncer``."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgqueue
from pgqueue.cli import prepared_statements_advice
from tests.apps.harness import NOOP_APP, count_by_state, run_cli, start_cli, wait_until

PGBOUNCER = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
)


def _reachable_by_others(folder: Path) -> bool:
    """Whether a user other than the owner may enter ``folder`` and every folder above it."""
    return all(path.stat().st_mode & stat.S_IXOTH for path in (folder, *folder.parents))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def bouncer_dsn(db_dsn: str) -> Iterator[str]:
    """``db_dsn`` through a PgBouncer of this test's own, transaction pooling, one server
    connection (so that two clients' statements always meet on it)."""
    if PGBOUNCER is None:
        pytest.skip("pgbouncer is not installed")
    params = conninfo_to_dict(db_dsn)
    host, port = str(params.get("host") or "127.0.0.1"), str(params.get("port") or 5432)
    if os.geteuid() == 0 and host.startswith("/") and not _reachable_by_others(Path(host)):
        # found by a fresh tester: as root PgBouncer runs as nobody, which cannot reach the
        # embedded server's socket in its private data folder (the README's test command)
        pytest.skip("pgbouncer (run as nobody) cannot reach the server's Unix socket")
    user, dbname = str(params.get("user") or "postgres"), str(params["dbname"])
    folder = Path(tempfile.mkdtemp(prefix="pgqueue-bouncer-", dir="/tmp"))
    folder.chmod(0o777)
    listen = _free_port()
    ini = folder / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"{dbname} = host={host} port={port} dbname={dbname} user={user}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {folder / 'users.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 1\nmax_client_conn = 100\n"
        f"logfile = {folder / 'pgbouncer.log'}\n"
        "ignore_startup_parameters = extra_float_digits,options\n",
        encoding="utf-8",
    )
    (folder / "users.txt").write_text(f'"{user}" ""\n', encoding="utf-8")
    argv = [PGBOUNCER, str(ini)]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        argv[1:1] = ["-u", "nobody"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    dsn = make_conninfo(db_dsn, host="127.0.0.1", port=str(listen))

    def up() -> bool:
        if proc.poll() is not None:
            log = folder / "pgbouncer.log"
            raise AssertionError(f"pgbouncer exited: {log.read_text() if log.exists() else ''}")
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.OperationalError:
            return False
        return True

    try:
        wait_until(up, timeout=20, interval=0.1, what="pgbouncer")
        yield dsn
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def _enqueue(dsn: str, n: int) -> None:
    with psycopg.connect(dsn) as conn:
        for i in range(n):
            pgqueue.enqueue(
                conn, tenant_id="t", origin="scheduled", payload={"i": i}, kind="pgqueue.noop"
            )
        conn.commit()


def test_the_advice_names_the_setting() -> None:
    exc = psycopg.errors.DuplicatePreparedStatement('prepared statement "_pg3_0" already exists')
    advice = prepared_statements_advice(exc)
    assert advice.startswith('prepared statement "_pg3_0" already exists: ')
    assert "PGQUEUE_PREPARE_THRESHOLD=none" in advice
    assert "max_prepared_statements" in advice


@pytest.mark.timeout(120)
def test_a_worker_behind_transaction_pooling_says_what_to_set(
    db_dsn: str, bouncer_dsn: str
) -> None:
    _enqueue(db_dsn, 40)
    prepared = run_cli(
        "work",
        "--burst",
        "--no-listen",
        "--concurrency",
        "8",
        "--dsn",
        bouncer_dsn,
        timeout=90,
        env={"PGQUEUE_PREPARE_THRESHOLD": "0", "PGQUEUE_POLL_INTERVAL_SECONDS": "0.1"},
    )
    assert prepared.returncode == 2, prepared.stderr
    assert "invalid DSN or query" not in prepared.stderr
    assert "PGQUEUE_PREPARE_THRESHOLD=none" in prepared.stderr


@pytest.mark.timeout(120)
def test_listen_behind_transaction_pooling_warns_and_unprepared_work_runs(
    db_dsn: str, bouncer_dsn: str, tmp_path: Path
) -> None:
    _enqueue(db_dsn, 40)
    worker = start_cli(
        "work",
        "--concurrency",
        "4",
        "--app",
        NOOP_APP,
        "--dsn",
        bouncer_dsn,
        log_dir=tmp_path,
        env={"PGQUEUE_PREPARE_THRESHOLD": "none", "PGQUEUE_POLL_INTERVAL_SECONDS": "0.1"},
    )
    try:
        wait_until(
            lambda: "test NOTIFY did not come back" in worker.stderr(),
            timeout=60,
            what="the warning that LISTEN delivers nothing",
        )
        wait_until(lambda: count_by_state(db_dsn) == {"succeeded": 40}, timeout=60, what="the jobs")
        worker.popen.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.stderr()
    finally:
        worker.kill()
    assert "--no-listen" in worker.stderr()
