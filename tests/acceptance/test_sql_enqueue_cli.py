"""Enqueue from plain SQL, then ``pgqueue work`` runs the job against the sandbox API.

Foundation issue, done-when 3: ``SELECT pgqueue.enqueue(...)`` joins the client's transaction —
rolled back, it leaves no job, no tenant and no wake-up; committed, a ``pgqueue work --burst``
process finishes the job with the provider's answer and usage. ``pgqueue work`` on a database
without the schema refuses to start and says to run ``pgqueue migrate``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgqueue.sandbox import running_sandbox
from tests.apps.harness import jobs, run_cli

PAYLOAD = json.dumps(
    {
        "model": "claude-haiku-4-5",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Summarise: it's a test."}],
    }
)


def _enqueue_script(tenant: str, origin: str, end: str) -> str:
    payload = PAYLOAD.replace("'", "''")
    return (
        "BEGIN;\n"
        f"SELECT pgqueue.enqueue(tenant_id => '{tenant}', origin => '{origin}',\n"
        f"    payload => '{payload}', sla_seconds => 300);\n"
        f"{end};\n"
    )


def _psql(dsn: str, script: str) -> list[str]:
    """Run ``script`` with psql, as a user at a terminal would; returns the output lines."""
    done = subprocess.run(
        ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", "-"],
        input=script,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def _psycopg(dsn: str, script: str) -> list[str]:
    """Run ``script`` statement by statement on one autocommit connection (raw SQL)."""
    out: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in filter(None, (s.strip() for s in script.split(";\n"))):
            cur = conn.execute(statement.encode())  # raw text, no parameters
            if cur.description is not None:
                out.extend(str(v) for row in cur.fetchall() for v in row)
    return out


SqlClient = Callable[[str, str], list[str]]
CLIENTS = [
    pytest.param(
        _psql,
        id="psql",
        marks=pytest.mark.skipif(shutil.which("psql") is None, reason="psql not on PATH"),
    ),
    pytest.param(_psycopg, id="psycopg"),
]


def _count(dsn: str, sql: str, *params: Any) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql, params).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("client", CLIENTS)
def test_sql_enqueue_joins_the_transaction(db_dsn: str, client: SqlClient) -> None:
    [rolled_back] = client(db_dsn, _enqueue_script("sql-rollback", "scheduled", "ROLLBACK"))
    assert int(rolled_back) > 0  # the function ran and returned an id ...
    assert _count(db_dsn, "SELECT count(*) FROM pgqueue.jobs") == 0  # ... that was undone
    assert _count(db_dsn, "SELECT count(*) FROM pgqueue.tenants") == 0

    [committed] = client(db_dsn, _enqueue_script("sql-commit", "scheduled", "COMMIT"))
    [row] = jobs(db_dsn)
    assert row["id"] == int(committed)
    assert (row["tenant_id"], row["state"], row["priority"]) == ("sql-commit", "queued", "standard")
    assert row["payload"] == json.loads(PAYLOAD)
    assert _count(db_dsn, "SELECT count(*) FROM pgqueue.tenants WHERE tenant_id = %s", "sql-commit")


@pytest.mark.parametrize("client", CLIENTS)
def test_notify_only_on_commit(db_dsn: str, client: SqlClient) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgqueue_jobs")
        # Different tiers tell the wake-ups apart: user_action → critical, sla 300 → standard.
        client(db_dsn, _enqueue_script("sql-rollback", "user_action", "ROLLBACK"))
        client(db_dsn, _enqueue_script("sql-commit", "scheduled", "COMMIT"))
        with psycopg.connect(db_dsn, autocommit=True) as other:
            other.execute("NOTIFY pgqueue_jobs, 'sentinel'")
        # Notifications arrive in commit order: the rolled-back enqueue sent none.
        got = [n.payload for n in listener.notifies(timeout=20, stop_after=2)]
    assert got == ["standard", "sentinel"]


def _sandbox_stats(base_url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{base_url}/_sandbox/stats", timeout=10) as response:
        stats: dict[str, Any] = json.load(response)
    return stats


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sql_enqueued_job_is_run_by_the_cli_worker(db_dsn: str) -> None:
    client = _psql if shutil.which("psql") else _psycopg
    [job_id] = client(db_dsn, _enqueue_script("sql-cli", "user_action", "COMMIT"))
    with running_sandbox() as base_url:
        done = run_cli(
            "work",
            "--burst",
            "--dsn",
            db_dsn,
            timeout=90,
            env={"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "sandbox-key"},
        )
        stats = _sandbox_stats(base_url)
    assert done.returncode == 0, done.stderr
    assert "claimed 1 (succeeded 1)" in done.stdout
    assert "sandbox-key" not in done.stdout + done.stderr

    [row] = jobs(db_dsn)
    assert row["id"] == int(job_id)
    assert row["state"] == "succeeded"
    assert row["attempts"] == 1
    assert row["input_tokens"] > 0
    assert row["output_tokens"] > 0
    result = row["result"]
    assert result["type"] == "message"
    assert result["content"] and result["content"][0]["type"] == "text"
    assert result["usage"]["input_tokens"] == row["input_tokens"]
    assert result["usage"]["output_tokens"] == row["output_tokens"]
    assert (stats["requests"], stats["ok"]) == (1, 1)
    assert stats["input_tokens"] == row["input_tokens"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_work_without_schema_says_to_migrate(empty_db_dsn: str) -> None:
    done = run_cli("work", "--burst", "--dsn", empty_db_dsn, timeout=90)
    assert done.returncode != 0
    message = " ".join((done.stdout + done.stderr).split())  # rich may wrap lines
    assert "pgqueue migrate" in message
    assert "Traceback" not in done.stderr
    assert _count(empty_db_dsn, "SELECT count(*) FROM pg_namespace WHERE nspname = 'pgqueue'") == 0
