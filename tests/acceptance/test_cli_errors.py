"""User errors at the command line: one line on stderr, exit 2 (input) or 1 (environment),
never a traceback; and nothing stored changes."""

from __future__ import annotations

import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue.cli import app

runner = CliRunner()


def run(*args: str):
    result = runner.invoke(app, list(args))
    assert "Traceback" not in (result.stdout + result.stderr)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def _jobs(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()[0]


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["migrate"],
        ["tenants", "list"],
        ["enqueue", "a", "--prompt", "x"],
        ["retry", "--all"],
    ],
)
def test_unreachable_database(command):
    result = run(*command, "--dsn", "postgresql://nobody@127.0.0.1:1/postgres")
    assert result.exit_code == 1
    assert "cannot reach Postgres" in result.stderr


def test_malformed_dsn():
    result = run("status", "--dsn", "not a dsn")
    assert result.exit_code == 2


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["status", "--json"],
        ["tenants", "list"],
        ["retry", "--all"],
        ["enqueue", "a", "--prompt", "x"],
    ],
)
def test_schema_missing(empty_db_dsn, command):
    result = run(*command, "--dsn", empty_db_dsn)
    assert result.exit_code == 1
    assert "pgqueue migrate" in result.stderr


def test_schema_changed_under_a_worker(db_dsn):
    """Found by a tester: a downgrade under running workers made their claims fail with an
    undefined column, reported as "invalid DSN or query" and exit 2 (bad input). It is the
    environment: exit 1, and the message says to run migrate."""
    import pgqueue

    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue(conn, tenant_id="t", origin="user_action", payload={}, kind="pgqueue.noop")
        conn.execute("ALTER TABLE pgqueue.queue_counts DROP COLUMN claim_stripe")
    result = run("work", "--burst", "--dsn", db_dsn)
    assert result.exit_code == 1, result.stderr
    assert "SchemaOutOfDate" in result.stderr
    assert "claim_stripe" in result.stderr
    assert "pgqueue migrate" in result.stderr


def test_bad_enqueue_input_writes_nothing(db_dsn, tmp_path):
    cases = [
        (["--payload", f"@{tmp_path / 'missing.json'}"], "FileNotFoundError"),
        (["--payload", f"@{tmp_path}"], "Error"),
        (["--payload", "{not json"], "InvalidPayload"),
        (["--prompt", "x", "--payload", "{}"], "exactly one"),
        ([], "exactly one"),
        (["--prompt", "x", "--origin", "urgent"], "UnknownOrigin"),
        (["--prompt", "x", "--sla-seconds", "-1"], "InvalidSla"),
        (["--payload", '{"model": "m", "max_tokens": 0, "messages": [1]}'], "InvalidPayload"),
    ]
    for extra, message in cases:
        result = run("enqueue", "acme", *extra, "--dsn", db_dsn)
        assert result.exit_code == 2, (extra, result.stderr)
        assert message in result.stderr, (extra, result.stderr)
    assert _jobs(db_dsn) == 0
    assert run("enqueue", "", "--prompt", "x", "--dsn", db_dsn).exit_code == 2
    assert (
        run(
            "enqueue", "acme", "--prompt", "x", "--max-tokens", "99999999999", "--dsn", db_dsn
        ).exit_code
        == 2
    )


def test_option_ranges(db_dsn):
    assert run("demo", "--speedup", "0").exit_code == 2
    assert run("sandbox", "--port", "99999").exit_code == 2
    assert run("tenants", "list", "--limit", "-1", "--dsn", db_dsn).exit_code == 2
    assert run("tenants", "set", "x", "--quantum", "inf", "--dsn", db_dsn).exit_code == 2
    assert (
        run(
            "tenants", "set", "x", "--daily-budget", "99999999999999999999", "--dsn", db_dsn
        ).exit_code
        == 2
    )
    assert run("tenants", "set", "x", "--plan", "p\x01", "--dsn", db_dsn).exit_code == 2
    assert run("work", "--concurrency", "0", "--dsn", db_dsn).exit_code == 2
    assert run("retry", "--dsn", db_dsn).exit_code == 2  # no filter and no --all
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pgqueue.tenants").fetchone()[0] == 0


def test_tenants_set_and_list(db_dsn):
    assert (
        run(
            "tenants",
            "set",
            "acme",
            "--plan",
            "pro",
            "--quantum",
            "15",
            "--daily-budget",
            "200000",
            "--dsn",
            db_dsn,
        ).exit_code
        == 0
    )
    listed = run("tenants", "list", "--dsn", db_dsn)
    assert listed.exit_code == 0 and "acme" in listed.stdout and "pro" in listed.stdout


def test_work_with_an_unknown_app(db_dsn):
    result = run("work", "--burst", "--app", "no_such_module:registry", "--dsn", db_dsn)
    assert result.exit_code == 2
    assert "cannot import" in result.stderr


def test_schema_newer_than_this_pgqueue(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.alembic_version SET version_num = '9999'")
    for command in (["migrate"], ["work", "--burst"]):
        result = run(*command, "--dsn", db_dsn)
        assert result.exit_code == 1
        assert "newer than this pgqueue" in result.stderr


def test_status_json_has_every_tier(db_dsn):
    import json

    result = run("status", "--json", "--dsn", db_dsn)
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["depth"] == {
        t: {"queued": 0, "running": 0} for t in ("critical", "standard", "batch")
    }
    assert data["demotions"] == []


def test_dsn_masks_a_password(monkeypatch):
    monkeypatch.setenv("PGQUEUE_DSN", "postgresql://app:s3cret@db.internal:5432/app")
    result = run("dsn")
    assert result.exit_code == 0
    assert "s3cret" not in result.stdout and "****" in result.stdout


def test_limits_set_and_list(db_dsn):
    assert (
        run(
            "limits",
            "set",
            "claude-x",
            "--rpm",
            "60",
            "--itpm",
            "1000",
            "--otpm",
            "500",
            "--dsn",
            db_dsn,
        ).exit_code
        == 0
    )
    listed = run("limits", "list", "--dsn", db_dsn)
    assert listed.exit_code == 0 and "claude-x" in listed.stdout and "60 / 60" in listed.stdout
    assert run("limits", "set", "claude-x", "--rpm", "0", "--dsn", db_dsn).exit_code == 2


def test_a_failing_migration_is_one_line(empty_db_dsn):
    """Found by a tester: a migration statement that failed printed alembic's and SQLAlchemy's
    80-line traceback (the error comes wrapped in sqlalchemy's DBAPIError)."""
    from pgqueue.db import migrate

    migrate.upgrade(empty_db_dsn, "0014")
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:  # in the way of revision 0015
        conn.execute("ALTER TABLE pgqueue.jobs ADD CONSTRAINT jobs_run_at_range CHECK (true)")
    result = run("migrate", "--dsn", empty_db_dsn)
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        'database error: constraint "jobs_run_at_range" for relation "jobs" already exists'
    ]
