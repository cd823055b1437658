"""The embedded Postgres: concurrent first starts on a fresh folder, and stopping it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgqueue.db import embedded

# Imports everything first, says "ready", waits for the go line, then calls embedded_dsn: the
# processes reach the start-up together, as pytest-xdist's workers do.
_CHILD = """
import sys
from pathlib import Path
import pgqueue.db.embedded as embedded
embedded._import_quietly()
print("ready", flush=True)
sys.stdin.readline()
try:
    print("ok", embedded.embedded_dsn(Path(sys.argv[1])), flush=True)
except Exception as exc:
    print("error", exc, flush=True)
    sys.exit(1)
"""


@pytest.fixture
def fresh_base() -> Iterator[Path]:
    """A data folder that does not exist yet (its parent does), stopped and removed after."""
    parent = Path(tempfile.mkdtemp(prefix="pgqueue-embedded-", dir="/tmp"))
    parent.chmod(0o755)
    base = parent / "data"
    try:
        yield base
    finally:
        embedded.stop(base)
        shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_concurrent_first_starts_on_a_fresh_folder_all_get_the_database(fresh_base: Path):
    """Four processes start the embedded server on a folder that does not exist yet: each gets
    the same DSN and the database exists once (the old code created the folder, ran initdb and
    checked-then-created the database without a lock: DuplicateDatabase, FileExistsError)."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(fresh_base)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for child in children:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    outputs = [child.communicate(timeout=150) for child in children]
    results = [out.strip().splitlines()[-1] if out.strip() else err for out, err in outputs]
    assert all(line.startswith("ok ") for line in results), results
    dsns = {line.split(" ", 1)[1] for line in results}
    assert len(dsns) == 1
    with psycopg.connect(dsns.pop()) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
    assert row == (embedded.EMBEDDED_DATABASE,)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_embedded_stop_stops_the_server_and_its_test_sibling(fresh_base: Path):
    """`pgqueue embedded status | stop` cover the commands' folder and the suite's `-test` one
    (the old code had no such command; the README advised `pkill -f`, which stopped every
    checkout's server)."""
    import json

    from tests.apps.harness import run_cli

    suite = embedded.suite_data_dir(fresh_base)
    assert suite == fresh_base.with_name("data-test")
    try:
        embedded.embedded_dsn(fresh_base)
        embedded.embedded_dsn(suite)
        env = {"PGQUEUE_EMBEDDED_DATA_DIR": str(fresh_base)}
        shown = run_cli("embedded", "status", "--json", timeout=60, env=env)
        assert shown.returncode == 0, shown.stderr
        rows = json.loads(shown.stdout)
        assert [r["data_dir"] for r in rows] == [str(fresh_base), str(suite)]
        assert all(r["pid"] for r in rows), rows
        with psycopg.connect(rows[0]["dsn"]) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)

        stopped = run_cli("embedded", "stop", timeout=90, env=env)
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.count(": stopped") == 2, stopped.stdout
        assert not embedded.server_status(fresh_base).running
        assert not embedded.server_status(suite).running
        again = run_cli("embedded", "stop", timeout=60, env=env)
        assert again.stdout.count(": not running") == 2, again.stdout
    finally:
        embedded.stop(suite)
