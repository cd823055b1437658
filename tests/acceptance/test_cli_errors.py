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
        (["--payload", f"@{tmp_path / 'missing.json'}"], "cannot read payload file"),
        (["--payload", f"@{tmp_path}"], "cannot read payload file"),
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


# Found by a new user (docs/bench.md, "Seen, not fixed"): five CLI errors, each now one typed line.


def _lines(result) -> list[str]:
    return result.stderr.strip().splitlines()


def test_non_finite_numbers_are_refused_as_such(db_dsn):
    """`tenants set --quantum nan` was refused with typer's message for a too-large value
    ("Input should be less than or equal to 1000000000"; -inf got the too-small one), NaN
    passing no comparison; the same for `limits set --rpm/--itpm/--otpm`."""
    cases = [
        (["tenants", "set", "x", "--quantum"], "--quantum", "0.001 and 1e9"),
        (["limits", "set", "m", "--rpm"], "--rpm", "1 and 1e9"),
        (["limits", "set", "m", "--itpm"], "--itpm", "1 and 1e12"),
        (["limits", "set", "m", "--otpm"], "--otpm", "1 and 1e12"),
    ]
    for command, option, bounds in cases:
        for value in ("nan", "inf", "-inf", "1e13"):
            result = run(*command, value, "--dsn", db_dsn)
            assert result.exit_code == 2, (command, value, result.stderr)
            got = repr(float(value))
            assert _lines(result) == [
                f"InvalidArgument: {option} must be a finite number between {bounds}, got {got}"
            ], (command, value)
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pgqueue.tenants").fetchone()[0] == 0
        assert (
            conn.execute("SELECT count(*) FROM pgqueue.rate_limits WHERE model = 'm'").fetchone()[0]
            == 0
        )
    assert run("tenants", "set", "x", "--quantum", "0.001", "--dsn", db_dsn).exit_code == 0
    assert run("limits", "set", "m", "--rpm", "1e9", "--dsn", db_dsn).exit_code == 0


def test_an_unknown_plan_is_refused_with_the_known_ones(db_dsn):
    """Plan names were free-form: `--plan platinum` (a typo) was stored and meant quantum ×1."""
    result = run("tenants", "set", "acme", "--plan", "platinum", "--dsn", db_dsn)
    assert result.exit_code == 2
    assert _lines(result) == ["InvalidArgument: unknown plan 'platinum'; known plans: free, pro"]
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pgqueue.tenants").fetchone()[0] == 0
    assert run("tenants", "set", "acme", "--plan", "PRO", "--dsn", db_dsn).exit_code == 0
    assert run("tenants", "set", "beta", "--plan", "free", "--dsn", db_dsn).exit_code == 0
    with psycopg.connect(db_dsn) as conn:
        rows = conn.execute("SELECT tenant_id, plan FROM pgqueue.tenants ORDER BY 1").fetchall()
    assert rows == [("acme", "pro"), ("beta", "free")]
    # The Python function behind the check raises the same error.
    from pgqueue.errors import InvalidArgument
    from pgqueue.validation import check_plan

    with pytest.raises(InvalidArgument, match=r"unknown plan 'platinum'; known plans: free, pro"):
        check_plan("platinum")
    with pytest.raises(InvalidArgument, match=r"unknown plan 'p{40}'…;"):
        check_plan("p" * 500)
    assert check_plan(" Pro ") == "pro"


def test_a_too_long_tenant_id_is_shown_shortened(db_dsn):
    """A 200-character tenant id was cut off in the message: the code kept the first 80
    characters of its repr (an opening quote and 79 t's), no length, no sign of the cut."""
    tenant = "t" * 200
    expected = [
        "InvalidTenant: tenant_id must be a string of 1 to 128 characters, got one of 200 "
        f"characters: '{'t' * 40}'…"
    ]
    for command in (["enqueue", tenant, "--prompt", "x"], ["tenants", "set", tenant]):
        result = run(*command, "--dsn", db_dsn)
        assert result.exit_code == 2, (command[0], result.stderr)
        assert _lines(result) == expected, command[0]
    assert _jobs(db_dsn) == 0


def test_an_unreadable_payload_file_is_one_line(db_dsn, tmp_path):
    """`--payload @missing.json` printed Python's FileNotFoundError, and a file that is not
    UTF-8 a traceback (UnicodeDecodeError)."""
    import os

    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'{"model": "caf\xe9"}')
    cases = [
        ("missing.json", "No such file or directory"),
        (str(tmp_path), "Is a directory"),
        (str(bad), "not UTF-8 text (invalid continuation byte at offset 14)"),
    ]
    if os.geteuid() != 0:  # root reads any file
        locked = tmp_path / "locked.json"
        locked.write_text("{}", encoding="utf-8")
        locked.chmod(0)
        cases.append((str(locked), "Permission denied"))
    for name, reason in cases:
        result = run("enqueue", "acme", "--payload", f"@{name}", "--dsn", db_dsn)
        assert result.exit_code == 2, (name, result.stderr)
        assert _lines(result) == [f"InvalidArgument: cannot read payload file {name!r}: {reason}"]
    assert _jobs(db_dsn) == 0


def test_a_missing_database_is_the_environment(server_dsn, monkeypatch):
    """`pgqueue simulate` reported a database that does not exist as "invalid DSN or query",
    exit 2: the server's 3D000 from a statement (`CREATE DATABASE ... TEMPLATE` of a template
    dropped under the run) is a psycopg ProgrammingError. Now exit 1 like `pgqueue status`
    against a database that does not exist (an OperationalError at connect), with the
    server's message."""
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from pgqueue import simulate

    missing = make_conninfo(server_dsn, dbname="no_such_db")
    for command in (["status"], ["simulate", "--json", "--duration", "1"]):
        result = run(*command, "--dsn", missing)
        assert result.exit_code == 1, (command, result.stderr)
        assert 'database "no_such_db" does not exist' in result.stderr, command
        assert len(_lines(result)) == 1

    dropped: list[str] = []

    def drop_the_template(dsn: str) -> None:  # as another run did to a shared template
        name = conninfo_to_dict(dsn)["dbname"]
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
        dropped.append(name)

    monkeypatch.setattr(simulate.migrate, "upgrade", drop_the_template)
    result = run(
        "simulate",
        "--json",
        "--duration",
        "1",
        "--strategies",
        "fifo",
        "--policies",
        "drop",
        "--dsn",
        server_dsn,
    )
    assert result.exit_code == 1, result.stderr
    assert _lines(result) == [f'database error: template database "{dropped[0]}" does not exist']
