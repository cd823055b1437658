"""User errors at the command line: one line on stderr, exit 2 (input) or 1 (environment),
never a traceback; and nothing stored changes."""

from __future__ import annotations

import inspect
import re
import socket

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


def _callbacks(typer_app):
    """Every command function of a typer app and its groups, unwrapped."""
    for command in typer_app.registered_commands:
        yield inspect.unwrap(command.callback)
    for group in typer_app.registered_groups:
        yield from _callbacks(group.typer_instance)


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
        ["metrics", "--port", "19471"],  # found by a tester: it served an empty queue
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
        ["metrics", "--port", "19472"],
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
        # found by a tester: queued, though the Messages API refuses empty text content
        (["--prompt", ""], "--prompt must hold text"),
        (["--prompt", " \n"], "--prompt must hold text"),
    ]
    for extra, message in cases:
        result = run("enqueue", "acme", *extra, "--dsn", db_dsn)
        assert result.exit_code == 2, (extra, result.stderr)
        assert message in result.stderr, (extra, result.stderr)
    assert _jobs(db_dsn) == 0
    assert run("enqueue", "", "--prompt", "x", "--dsn", db_dsn).exit_code == 2
    blank = run("enqueue", " ", "--prompt", "x", "--dsn", db_dsn)  # found by a tester: queued
    assert blank.exit_code == 2 and "InvalidTenant" in blank.stderr, blank.stderr
    assert _jobs(db_dsn) == 0
    assert (
        run(
            "enqueue", "acme", "--prompt", "x", "--max-tokens", "99999999999", "--dsn", db_dsn
        ).exit_code
        == 2
    )


def test_origin_in_any_case(db_dsn):
    """Found by a tester: `--origin USER_ACTION` was an unknown origin, while `--tier` takes any
    case. The origin is matched as tiers are; an unknown one is still refused."""
    result = run("enqueue", "acme", "--prompt", "x", "--origin", " User_Action ", "--dsn", db_dsn)
    assert result.exit_code == 0, result.stderr
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute("SELECT origin::text, priority::text FROM pgqueue.jobs").fetchone()
    assert row == ("user_action", "critical")
    result = run("enqueue", "acme", "--prompt", "x", "--origin", "URGENT", "--dsn", db_dsn)
    assert result.exit_code == 2 and "UnknownOrigin" in result.stderr


def test_a_busy_metrics_port_is_named(db_dsn):
    """Found by a tester: `pgqueue metrics --port` on a port in use gave a bare OSError (and
    `work --metrics-port` the same); now one line names the address, as the sandbox's does."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = run("metrics", "--port", port, "--dsn", db_dsn)
        assert result.exit_code == 2
        assert _lines(result) == [
            f"InvalidArgument: cannot listen on 127.0.0.1:{port}: Address already in use"
        ]
        result = run("work", "--burst", "--metrics-port", port, "--dsn", db_dsn)
        assert result.exit_code == 2
        assert _lines(result) == [
            f"InvalidArgument: cannot listen on 127.0.0.1:{port}: Address already in use"
        ]
        result = run(
            "work", "--burst", "--metrics-port", port, "--metrics-host", "0.0.0.0", "--dsn", db_dsn
        )
        assert result.exit_code == 2
        assert _lines(result) == [
            f"InvalidArgument: cannot listen on 0.0.0.0:{port}: Address already in use"
        ]


def test_metrics_bind_this_machine_by_default(db_dsn, tmp_path):
    """Found by a tester (issue 29): `pgqueue metrics` served every host (0.0.0.0; its series
    name tenants), where the dashboard and the sandbox bind 127.0.0.1. It binds 127.0.0.1 too,
    unless --host says otherwise: another loopback address (127.0.0.2) can still take its
    port, which a server on 0.0.0.0 would hold."""
    from tests.apps.harness import start_cli, wait_until

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    exporter = start_cli("metrics", "--port", str(port), "--dsn", db_dsn, log_dir=tmp_path)
    try:
        wait_until(
            lambda: f"metrics on http://127.0.0.1:{port}/metrics" in exporter.stderr(),
            timeout=60,
            what="the exporter to serve",
        )
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass
        with socket.socket() as other:
            other.bind(("127.0.0.2", port))  # OSError (in use) when bound to 0.0.0.0
        assert "warning" not in exporter.stderr()
    finally:
        exporter.kill()


def test_worker_metrics_bind_this_machine_by_default(db_dsn, tmp_path):
    """`pgqueue work --metrics-port` served its pgqueue_* series on every address (0.0.0.0),
    where `pgqueue metrics` binds 127.0.0.1: it binds 127.0.0.1 too, unless --metrics-host
    says otherwise (then with a warning), so another loopback address can take its port."""
    from tests.apps.harness import NOOP_APP, start_cli, wait_until

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    args = ("work", "--app", NOOP_APP, "--metrics-port", str(port), "--dsn", db_dsn)
    worker = start_cli(*args, log_dir=tmp_path)
    try:
        wait_until(lambda: "started" in worker.stderr(), timeout=60, what="the worker")
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass
        with socket.socket() as other:
            other.bind(("127.0.0.2", port))  # OSError (in use) when bound to 0.0.0.0
        assert "warning" not in worker.stderr()
    finally:
        worker.kill()
    wide = start_cli(*args, "--metrics-host", "127.0.0.3", log_dir=tmp_path)
    try:
        wait_until(lambda: "started" in wide.stderr(), timeout=60, what="the worker")
        with socket.create_connection(("127.0.0.3", port), timeout=10):
            pass
        assert "warning: serving metrics on 127.0.0.3" in wide.stderr()
    finally:
        wide.kill()


def test_a_busy_dashboard_port_is_named(db_dsn):
    """Found by a fresh tester: a second `pgqueue dashboard` printed its address, then
    uvicorn's error, and exited 3; now one line names the address, exit 2."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = run("dashboard", "--port", port, "--dsn", db_dsn)
        assert result.exit_code == 2
        assert _lines(result) == [
            f"InvalidArgument: cannot listen on 127.0.0.1:{port}: Address already in use"
        ]


def test_the_default_chart_path_is_checked_before_the_demo(db_dsn, monkeypatch):
    """Found by a tester: from a folder that takes no files (`cd /proc`), `pgqueue demo` ran
    to the end, then failed on the default chart path (FileNotFoundError, exit 2)."""
    pytest.importorskip("matplotlib")
    monkeypatch.chdir("/proc")
    result = run("demo", "--requests", "40", "--speedup", "20", "--dsn", db_dsn)
    assert result.exit_code == 2
    said = " ".join(result.output.replace("│", " ").split())
    assert "cannot write to /proc" in said and "--chart" in said, said


def test_option_ranges(db_dsn, tmp_path):
    assert run("demo", "--speedup", "0").exit_code == 2
    # found by a tester: a chart path in no folder failed only after the whole replay
    missing = run("demo", "--chart", str(tmp_path / "nowhere" / "x.png"), "--dsn", db_dsn)
    assert missing.exit_code == 2
    assert "is not a folder" in " ".join(missing.output.replace("│", " ").split())
    assert run("sandbox", "--port", "99999").exit_code == 2
    with socket.socket() as taken:  # found by a tester: uvicorn's error, then exit 3
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = run("sandbox", "--port", port)
        assert result.exit_code == 2
        assert _lines(result) == [
            f"InvalidArgument: cannot listen on 127.0.0.1:{port}: Address already in use"
        ]
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
    for empty in ("", "  "):  # found by a tester: '' matched every failed job
        result = run("retry", "--reason", empty, "--dsn", db_dsn)
        assert result.exit_code == 2
        assert "--reason must not be empty" in result.stderr
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


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("json:dumps", "calling dumps() failed (TypeError: dumps() missing 1 required"),
        ("json:JSONDecoder", "JSONDecoder() returned JSONDecoder;"),
        ("json:no_such_name", "module 'json' has no 'no_such_name';"),
        ("json:__name__", "json:__name__ is str;"),
        ("broken_app_29:registry", "cannot import 'broken_app_29': RuntimeError: no config"),
    ],
)
def test_work_with_an_app_that_is_not_a_registry(db_dsn, tmp_path, monkeypatch, spec, says):
    """Found by a tester: `--app json:dumps` (a factory that raises) gave a raw traceback and
    exit 1. Now: one line naming what was expected, exit 2."""
    (tmp_path / "broken_app_29.py").write_text("raise RuntimeError('no config\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = run("work", "--burst", "--app", spec, "--dsn", db_dsn)
    assert result.exit_code == 2, result.stderr
    assert says in result.stderr
    assert "expected a pgqueue.Registry" in result.stderr or "cannot import" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


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

    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:  # in the baseline's way
        conn.execute("CREATE SCHEMA pgqueue")
        conn.execute("CREATE TABLE pgqueue.tenants (tenant_id text)")
    result = run("migrate", "--dsn", empty_db_dsn)
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        'database error: relation "tenants" already exists'
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


def test_a_payload_file_too_long_or_too_deep_is_one_line(db_dsn, tmp_path, monkeypatch):
    """Found by a tester: `--payload @/dev/zero` read until memory ran out (a MemoryError
    traceback at 1.4 GB), and a payload nested ~1,000 deep printed a RecursionError traceback.
    A file is read up to 4 x the payload cap; the nesting is an InvalidPayload."""
    monkeypatch.setenv("PGQUEUE_MAX_PAYLOAD_BYTES", "100000000000")  # a tester: MemoryError
    small = tmp_path / "small.json"
    small.write_text("{}", encoding="utf-8")
    result = run("enqueue", "acme", "--payload", f"@{small}", "--kind", "pgqueue.noop",
                 "--dsn", db_dsn)  # fmt: skip
    assert result.exit_code == 0, result.stderr  # read without reserving 400 GB first
    monkeypatch.setenv("PGQUEUE_MAX_PAYLOAD_BYTES", "1000")
    deep = tmp_path / "deep.json"
    deep.write_text('{"d": ' + "[" * 1500 + "]" * 1500 + "}", encoding="utf-8")  # 3,007 bytes
    long = tmp_path / "long.json"
    long.write_text('{"a": "' + "x" * 4000 + '"}', encoding="utf-8")  # 4,009 bytes
    fits = tmp_path / "spaces.json"
    fits.write_text("{}" + " " * 3990, encoding="utf-8")  # 3,992 bytes: read, then stored
    cases = [
        (
            "/dev/zero",
            "PayloadTooLarge: payload file '/dev/zero' is over 4000 bytes (4 x the "
            "payload cap of 1000, at most 1073741824)",
        ),
        (
            str(long),
            f"PayloadTooLarge: payload file {str(long)!r} is over 4000 bytes (4 x the "
            "payload cap of 1000, at most 1073741824)",
        ),
        (str(deep), "InvalidPayload: --payload is nested too deeply to parse"),
    ]
    for name, line in cases:
        result = run("enqueue", "acme", "--payload", f"@{name}", "--dsn", db_dsn)
        assert result.exit_code == 2, (name, result.stderr)
        assert _lines(result) == [line]
    assert _jobs(db_dsn) == 1  # the small one
    result = run("enqueue", "acme", "--payload", f"@{fits}", "--kind", "pgqueue.noop",
                 "--dsn", db_dsn)  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert _jobs(db_dsn) == 2


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


def test_simulate_says_where_it_wrote_its_chart(tmp_path, monkeypatch):
    """Found by a tester: `pgqueue simulate --plot F` wrote the chart without saying where
    (`pgqueue demo` prints "chart: F"); it is said on stderr, so `--json` stays clean."""
    from pgqueue import simulate

    drawn: list[str] = []
    monkeypatch.setattr(simulate, "require_matplotlib", lambda: None)
    monkeypatch.setattr(simulate, "run_simulation", lambda dsn, options: [])
    monkeypatch.setattr(
        simulate, "report", lambda options, results: {"verdict": {"tiers_urgent_p95_bound_ms": 1}}
    )
    monkeypatch.setattr(simulate, "plot", lambda results, path, bound: drawn.append(path))
    chart = tmp_path / "p95.png"
    result = run("simulate", "--json", "--plot", str(chart), "--dsn", _UNREACHABLE)
    assert result.exit_code == 0, result.stderr
    assert drawn == [str(chart)]
    assert f"chart: {chart}" in result.stderr
    assert "chart" not in result.stdout


# Found by a tester: the float options of every command took NaN or infinities, or refused
# them in typer's box with the message for another value.

_UNREACHABLE = "postgresql://nobody@127.0.0.1:1/postgres"

#: Every float option of a command without its own check elsewhere: the command, the option,
#: its range as the message gives it, and finite values outside it.
_FLOAT_OPTIONS = [
    (["status"], "--window", "between 1 and 1e9", ["0.5", "2e9"]),
    (["status"], "--watch", "between 0.5 and 1e9", ["0.4", "2e9"]),
    (["prune"], "--older-than", "between 0 and 1e9", ["-1", "2e9"]),
    (["work"], "--poll-interval", "greater than 0 and at most 1e9", ["0", "-1", "2e9"]),
    (["metrics"], "--refresh-seconds", "between 0 and 1e9", ["-1", "2e9"]),
    (["sandbox"], "--overload-rate", "between 0 and 1", ["-0.1", "1.5"]),
    (["sandbox"], "--seconds-per-output-token", "between 0 and 1e9", ["-1", "2e9"]),
    (["sandbox"], "--batch-processing-seconds", "between 0 and 1e9", ["-1", "2e9"]),
    (["replay"], "--speedup", "of at least 0.01", ["0"]),
    (["replay"], "--rate-scale", "between 0.01 and 2e7", ["0", "3e7"]),
    (["demo"], "--speedup", "of at least 0.01", ["0"]),
    (["demo"], "--load", "between 0.1 and 100", ["0.05", "101"]),
    (["simulate"], "--duration", "between 1 and 1e9", ["0.5", "2e9"]),
    (["simulate"], "--rate", "of at least 1", ["0.5"]),
    (["simulate"], "--urgent-share", "greater than 0 and less than 1", ["0", "1"]),
    (["dashboard"], "--refresh-seconds", "between 0 and 3600", ["-1", "3601"]),
    (["dashboard"], "--window", "between 1 and 1e9", ["0.5", "2e9"]),
]


def test_every_float_option_refuses_nan_infinities_and_out_of_range_values(monkeypatch):
    """`status --window inf` read the database (an interval out of range), `simulate
    --duration inf` set out to run forever ("12 scenarios × inf s"), `work --poll-interval nan`
    printed pydantic's four-line error and `sandbox --seconds-per-output-token inf` served;
    typer refused `nan` in its box with the message for a too-small value. Each is now one
    typed line, exit 2, before any connection (the DSN here reaches nothing)."""
    import prometheus_client

    import pgqueue.sandbox

    def must_not_serve(*args, **kwargs):
        raise AssertionError("started serving")

    monkeypatch.setattr(prometheus_client, "start_http_server", must_not_serve)
    monkeypatch.setattr(pgqueue.sandbox, "serve", must_not_serve)
    for command, option, bounds, outside in _FLOAT_OPTIONS:
        dsn = [] if command == ["sandbox"] else ["--dsn", _UNREACHABLE]
        for value in ["nan", "inf", "-inf", *outside]:
            result = run(*command, option, value, *dsn)
            assert result.exit_code == 2, (command, option, value, result.stderr)
            assert _lines(result) == [
                f"InvalidArgument: {option} must be a finite number {bounds}, got {float(value)!r}"
            ], (command, option, value)


def test_no_float_option_is_left_to_typer():
    """Every float option of every command is checked by `finite_in_range` (the list above,
    or test_non_finite_numbers_are_refused_as_such; `enqueue --sla-seconds` by the library's
    InvalidSla), and none has typer's min/max, which answers NaN in its box first."""
    import typing

    checked = {(command[0], option) for command, option, _, _ in _FLOAT_OPTIONS}
    checked |= {
        ("tenants_set", "--quantum"),
        ("limits_set", "--rpm"),
        ("limits_set", "--itpm"),
        ("limits_set", "--otpm"),
        ("enqueue", "--sla-seconds"),
    }

    found = set()
    for fn in _callbacks(app):
        for name, hint in typing.get_type_hints(fn, include_extras=True).items():
            if typing.get_origin(hint) is not typing.Annotated:
                continue
            base, *meta = typing.get_args(hint)
            if float not in (base, *typing.get_args(base)):
                continue
            option = "--" + name.replace("_", "-")
            found.add((fn.__name__, option))
            for info in meta:
                assert (info.min, info.max) == (None, None), (fn.__name__, option)
    assert found == checked


def test_float_options_take_their_bounds(db_dsn):
    for command in (
        ["status", "--json", "--window", "1"],
        ["status", "--json", "--window", "1e9"],
        ["prune", "--older-than", "0"],
        ["prune", "--older-than", "1e9"],
        ["work", "--burst", "--poll-interval", "1e-6"],
    ):
        result = run(*command, "--dsn", db_dsn)
        assert result.exit_code == 0, (command, result.stderr)


def test_a_server_that_refuses_the_connection_was_reached(server_dsn, capsys):
    """A database or role that does not exist read "cannot reach Postgres: connection failed:
    connection to server at ... failed: FATAL:  database "x" does not exist": the server was
    reached, and answered. Still exit 1; an unreachable server keeps its words
    (test_unreachable_database)."""
    import uuid

    import typer
    from psycopg.conninfo import make_conninfo

    from pgqueue.cli import cli_errors

    role = f"pq_no_such_role_{uuid.uuid4().hex[:8]}"
    cases = [
        (make_conninfo(server_dsn, dbname="no_such_db"), 'database "no_such_db" does not exist'),
        (make_conninfo(server_dsn, user=role), f'role "{role}" does not exist'),
    ]
    for dsn, message in cases:
        result = run("status", "--dsn", dsn)
        assert result.exit_code == 1, (dsn, result.stderr)
        assert _lines(result) == [f"cannot connect to Postgres: {message}"]
    result = run("status", "--dsn", _UNREACHABLE)
    assert _lines(result)[0].startswith("cannot reach Postgres: ")

    # A failed password and a missing one (the test server trusts every role).
    prefix = 'connection failed: connection to server at "db", port 5432 failed: '
    failed = 'password authentication failed for user "app"'
    said = [
        (f"FATAL:  {failed}", failed),
        ("fe_sendauth: no password supplied", "no password supplied"),
    ]
    for server_said, shown in said:
        error = prefix + server_said

        @cli_errors
        def connect(error: str = error) -> None:
            raise psycopg.OperationalError(error)

        with pytest.raises(typer.Exit) as exit_:
            connect()
        assert exit_.value.exit_code == 1
        assert capsys.readouterr().err.strip().splitlines() == [
            f"cannot connect to Postgres: {shown}"
        ]


def test_a_timeout_on_a_reached_server_is_a_database_error(db_dsn):
    """An OperationalError the server raised for a statement (here a lock timeout; also a
    statement timeout or a shutdown) read "cannot reach Postgres" too."""
    from psycopg.conninfo import make_conninfo

    impatient = make_conninfo(db_dsn, options="-c lock_timeout=100")
    with psycopg.connect(db_dsn) as conn:
        conn.execute("LOCK TABLE pgqueue.tenants IN ACCESS EXCLUSIVE MODE")
        try:
            result = run("tenants", "list", "--dsn", impatient)
        finally:
            conn.rollback()
    assert result.exit_code == 1, result.stderr
    assert _lines(result) == ["database error: canceling statement due to lock timeout"]


def test_a_missing_privilege_is_the_environment(server_dsn, db_dsn):
    """A role without CREATEDB running `pgqueue simulate` read "invalid DSN or query:
    permission denied to create database", exit 2 (psycopg files 42501 under
    ProgrammingError); so did a role without grants on the pgqueue schema. Now "database
    error", exit 1."""
    import uuid

    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    role = f"pq_plain_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOCREATEDB").format(sql.Identifier(role)))
    try:
        simulate = [
            "simulate",
            "--json",
            "--duration",
            "1",
            "--strategies",
            "fifo",
            "--policies",
            "drop",
        ]
        result = run(*simulate, "--dsn", make_conninfo(server_dsn, user=role))
        assert result.exit_code == 1, result.stderr
        assert _lines(result) == ["database error: permission denied to create database"]
        result = run("status", "--dsn", make_conninfo(db_dsn, user=role))
        assert result.exit_code == 1, result.stderr
        assert _lines(result) == ["database error: permission denied for schema pgqueue"]
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# Found by a fresh tester: rich markup in stored names, text that is not UTF-8 in arguments,
# huge integers, `cancel -5`, and tiers in upper case.


def test_stored_names_are_shown_as_they_are(db_dsn, monkeypatch):
    """Tenant ids, models and demotion reasons are text, not rich markup: a tenant named
    `[/oops]` made `status`, `status --watch` and `tenants list` fail with a MarkupError
    traceback, a model `[/x]` made `limits list` fail, and `[bold]x[/bold]` showed as a bold
    "x"."""
    import time

    from pgqueue.cli import console

    odd = ["[/oops]", "[bold]x[/bold]"]
    for name in odd:
        assert run("tenants", "set", name, "--dsn", db_dsn).exit_code == 0
        assert run("enqueue", name, "--prompt", "hi", "--dsn", db_dsn).exit_code == 0
        assert run("limits", "set", name, "--dsn", db_dsn).exit_code == 0
    with psycopg.connect(db_dsn) as conn:
        conn.execute(
            "INSERT INTO pgqueue.demotions (tenant_id, reason, expires_at)"
            " VALUES ('[/oops]', '[red]over budget[/x]', now() + interval '1 hour')"
        )
        conn.execute(
            "INSERT INTO pgqueue.throttle_events (tenant_id, status_code)"
            " VALUES ('[bold]x[/bold]', 429)"
        )
    monkeypatch.setattr(console, "width", 200)  # no cell cut short

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", interrupt)  # `status --watch`: one frame, then Ctrl-C
    for command in (
        ["status"],
        ["status", "--watch", "1"],
        ["tenants", "list"],
        ["limits", "list"],
    ):
        result = run(*command, "--dsn", db_dsn)
        assert result.exit_code == 0, (command, result.stderr)
        for name in odd:
            assert name in result.stdout, (command, name, result.stdout)
        if command[0] == "status":
            assert "[red]over budget[/x]" in result.stdout, command
            assert "([bold]x[/bold] 1)" in result.stdout, command


#: Any control character (C0, DEL, C1) but the line break that ends a line.
_RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def test_stored_control_characters_are_shown_escaped(db_dsn, monkeypatch):
    """Found by a tester: tenant ids `esc\\e[31mRED\\e[0m` and `\\e]0;pwned\\a` were taken,
    and `status`, `jobs list` and `tenants list` sent the escape sequences to the terminal (rich
    escapes its markup, not control characters); `a\\nb` showed as two rows. New ids are refused
    now; rows stored before (simulated: the rule switched off while they are written), and the
    other stored texts (model, kind, last error, reason, payload), are shown with each control
    character as <U+XXXX>, in every table and line."""
    import time

    import pgqueue.batch
    import pgqueue.validation
    from pgqueue.cli import console

    for module in (pgqueue.validation, pgqueue.batch):
        monkeypatch.setattr(module, "has_control", lambda _text: False)
    with psycopg.connect(db_dsn, autocommit=True) as conn:  # as before revision 0071
        conn.execute("CREATE OR REPLACE FUNCTION pgqueue.has_control(t text) RETURNS boolean"
                     " LANGUAGE sql AS $$ SELECT false $$")  # fmt: skip
    esc, osc, two = "esc\x1b[31mRED\x1b[0m", "\x1b]0;pwned\x07x", "a\nb"
    for tenant in (esc, osc, two):
        assert run("tenants", "set", tenant, "--dsn", db_dsn).exit_code == 0
        result = run("enqueue", tenant, "--kind", "k\x1b[2J", "--payload", '{"x": "\x9b2J"}',
                     "--dsn", db_dsn)  # fmt: skip
        assert result.exit_code == 0, result.stderr
    assert run("limits", "set", "m\x1b[2J", "--dsn", db_dsn).exit_code == 0
    with psycopg.connect(db_dsn) as conn:
        conn.execute("UPDATE pgqueue.jobs SET last_error = %s", ("boom\x1b]0;t\x07\x85",))
        conn.execute(
            "INSERT INTO pgqueue.demotions (tenant_id, reason, expires_at)"
            " VALUES (%s, %s, now() + interval '1 hour')",
            (esc, "over\x1b[5m budget"),
        )
        conn.execute(
            "INSERT INTO pgqueue.throttle_events (tenant_id, status_code) VALUES (%s, 429)",
            (two,),
        )
        job_id = conn.execute("SELECT max(id) FROM pgqueue.jobs").fetchone()[0]
    monkeypatch.setattr(console, "width", 300)  # no cell cut short

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", interrupt)  # `status --watch`: one frame, then Ctrl-C
    for command in (
        ["status"],
        ["status", "--watch", "1"],
        ["tenants", "list"],
        ["limits", "list"],
        ["jobs", "list"],
        ["jobs", "show", str(job_id)],
        ["batches", "list"],
    ):
        result = run(*command, "--dsn", db_dsn)
        assert result.exit_code == 0, (command, result.stderr)
        raw = _RAW_CONTROL.search(result.stdout + result.stderr)
        assert raw is None, (command, raw, result.stdout)
        if command[0] in ("status", "tenants") or command[:2] == ["jobs", "list"]:
            assert "esc<U+001B>[31mRED<U+001B>[0m" in result.stdout, (command, result.stdout)
        if command[0] == "tenants":
            assert "a<U+000A>b" in result.stdout and "<U+001B>]0;pwned<U+0007>x" in result.stdout
    # an error line quoting the id as the database wrote it (PQ007: quote_literal, raw)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {conn.info.dbname} SET pgqueue.require_known_tenant = on")
    result = run("enqueue", "x\x1b[2Jy", "--prompt", "hi", "--dsn", db_dsn)
    assert result.exit_code == 2 and "x<U+001B>[2Jy" in result.stderr, result.stderr
    assert _RAW_CONTROL.search(result.stdout + result.stderr) is None, result.stderr


def test_arguments_that_are_not_utf8_are_one_line(monkeypatch):
    """Bytes that are not UTF-8 on the command line (`--tenant $'\\xff'`) reach Python as lone
    surrogates: `retry --tenant`, `retry --reason`, `limits set MODEL` and any `--dsn` printed
    a UnicodeEncodeError traceback, exit 1. Now one line naming the argument, exit 2, before
    any connection (the DSN here reaches nothing)."""
    bad = "\udcff"
    cases = [
        (["retry", "--tenant", bad], "--tenant"),
        (["retry", "--reason", bad], "--reason"),
        (["limits", "set", bad], "argument model"),
        (["enqueue", bad, "--prompt", "x"], "argument tenant"),
        (["enqueue", "a", "--prompt", bad], "--prompt"),
        (["cancel", "--all-queued", "--tenant", bad], "--tenant"),
    ]
    for command, name in cases:
        result = run(*command, "--dsn", _UNREACHABLE)
        assert result.exit_code == 2, (command, result.stderr)
        assert _lines(result) == [f"InvalidArgument: {name} is not valid UTF-8 text"], command
    for command in (["status"], ["tenants", "list"], ["migrate"], ["retry", "--all"], ["work"]):
        result = run(*command, "--dsn", bad)
        assert result.exit_code == 2, (command, result.stderr)
        assert _lines(result) == ["InvalidArgument: --dsn is not valid UTF-8 text"], command
    # The same bytes from the environment: one line too.
    monkeypatch.setenv("PGQUEUE_DSN", bad)
    result = run("status")
    assert result.exit_code == 2, result.stderr
    assert len(_lines(result)) == 1
    assert _lines(result)[0].startswith("InvalidArgument: text that is not valid UTF-8: ")


#: Every int option: the command, the option, its range as the message gives it, and values
#: outside it. (`--seed`s take any int: they only seed random.Random; `cancel JOB_ID` is
#: checked by pgqueue.cancel, test_cancel_takes_a_negative_id.)
_INT_OPTIONS = [
    (["enqueue", "a", "--prompt", "x"], "--max-tokens", "1 to 2^31-1", ["0", "2147483648"]),
    (["tenants", "list"], "--limit", "1 to 2^63-1", ["0", "9223372036854775808"]),
    (["tenants", "set", "a"], "--daily-budget", f"0 to {2**62}", ["-1", str(2**62 + 1)]),
    (
        ["admission", "set", "standard"],
        "--max-queued",
        "0 to 2^63-1",
        ["-1", "9223372036854775808", "99999999999999999999"],
    ),
    (
        ["admission", "set", "standard"],
        "--tenant-max-queued",
        "0 to 2^63-1",
        ["-1", "9223372036854775808"],
    ),
    (["work"], "--concurrency", "1 to 10000", ["0", "10001", "99999999999"]),
    (["work"], "--metrics-port", "1 to 65535", ["0", "65536"]),
    (["work"], "--claim-batch", "1 to 10000", ["0", "10001"]),
    (["metrics"], "--port", "1 to 65535", ["0", "65536"]),
    (["metrics"], "--top-tenants", "1 to 10000", ["0", "10001"]),
    (["sandbox"], "--port", "1 to 65535", ["0", "65536"]),
    (["sandbox"], "--rpm", "1 to 1000000000", ["0", "1000000001"]),
    (["sandbox"], "--itpm", "1 to 1000000000000", ["0", "1000000000001"]),
    (["sandbox"], "--otpm", "1 to 1000000000000", ["0", "1000000000001"]),
    (["sandbox"], "--fail-first-n", "0 to 1000000", ["-1", "1000001"]),
    (["sandbox"], "--fail-status", "400 to 599", ["399", "600"]),
    (["replay"], "--limit", "1 to 2^63-1", ["0", "9223372036854775808"]),
    (["replay"], "--tenants", "1 to 10000", ["0", "10001"]),
    (["replay"], "--concurrency", "1 to 10000", ["0", "10001"]),
    (["demo"], "--requests", "1 to 2^63-1", ["0", "9223372036854775808"]),
    (["demo"], "--concurrency", "1 to 10000", ["0", "10001"]),
    (["bench"], "--jobs", "1 to 2^31-1", ["0", "2147483648"]),
    (["bench"], "--concurrency", "1 to 10000", ["0", "10001"]),
    (["bench"], "--repeats", "1 to 2^31-1", ["0", "2147483648"]),
    (["bench"], "--single-jobs", "1 to 2^31-1", ["0", "2147483648"]),
    (["bench"], "--bulk-jobs", "1 to 2^31-1", ["0", "2147483648"]),
    (["bench"], "--batch", "1 to 2^31-1", ["0", "2147483648"]),
    (["bench"], "--wake-samples", "1 to 2^31-1", ["0", "2147483648"]),
    (["bench"], "--peer-batch", "1 to 10000", ["0", "10001"]),
    (["bench"], "--claim-batch", "1 to 10000", ["0", "10001"]),
    (["bench"], "--peer-max-in-flight", "1 to 20000", ["0", "20001"]),
    (["simulate"], "--workers", "1 to 10000", ["0", "10001"]),
    (["simulate"], "--normal-cap", "0 to 2^63-1", ["-1", "9223372036854775808"]),
    (["simulate"], "--urgent-cap", "0 to 2^63-1", ["-1", "9223372036854775808"]),
    (["jobs", "list"], "--limit", "1 to 1000", ["0", "1001"]),
    (["jobs", "list"], "--before", "1 to 2^63-1", ["0", "9223372036854775808"]),
    (["dashboard"], "--port", "1 to 65535", ["0", "65536"]),
    (["batches", "list"], "--limit", "1 to 2^63-1", ["0", "9223372036854775808"]),
]


def test_every_int_option_is_bounded_in_one_line(monkeypatch):
    """`admission set --max-queued 99999999999999999999` (or `--tenant-max-queued
    9223372036854775808`) reached the database as numeric and `work --concurrency 99999999999`
    as bigint: no pgqueue function takes those, and the 42883 read "SchemaOutOfDate ... run
    `pgqueue migrate`", exit 1. Every int option now has an upper bound, checked before any
    connection (the DSN here reaches nothing): one typed line, exit 2."""
    import prometheus_client

    import pgqueue.bench
    import pgqueue.sandbox

    def must_not_run(*args, **kwargs):
        raise AssertionError("started")

    monkeypatch.setattr(prometheus_client, "start_http_server", must_not_run)
    monkeypatch.setattr(pgqueue.sandbox, "serve", must_not_run)
    monkeypatch.setattr(pgqueue.bench, "run", must_not_run)
    for command, option, bounds, outside in _INT_OPTIONS:
        dsn = [] if command == ["sandbox"] else ["--dsn", _UNREACHABLE]
        for value in outside:
            result = run(*command, option, value, *dsn)
            assert result.exit_code == 2, (command, option, value, result.stderr)
            assert _lines(result) == [
                f"InvalidArgument: {option} must be an integer from {bounds}, got {value}"
            ], (command, option, value)


def test_no_int_option_is_left_to_typer():
    """Every int option of every command is in the list above (bar the seeds and cancel's job
    id), and none has typer's min/max, which answers in a box of several lines."""
    import typing

    exempt = {
        ("sandbox", "--seed"),
        ("replay", "--seed"),
        ("simulate", "--seed"),
        ("cancel", "--job-id"),
        ("jobs_show", "--job-id"),
    }
    names = {
        "tenants": "tenants_",
        "admission": "admission_",
        "limits": "limits_",
        "jobs": "jobs_",
        "batches": "batches_",
    }
    checked = {
        (names.get(command[0], "") + (command[1] if command[0] in names else command[0]), option)
        for command, option, _, _ in _INT_OPTIONS
    }

    found = set()
    for fn in _callbacks(app):
        for name, hint in typing.get_type_hints(fn, include_extras=True).items():
            base, *meta = (
                typing.get_args(hint) if typing.get_origin(hint) is typing.Annotated else (hint,)
            )
            if int not in (base, *typing.get_args(base)):
                continue
            option = "--" + name.replace("_", "-")
            found.add((fn.__name__, option))
            for info in meta:
                assert (info.min, info.max) == (None, None), (fn.__name__, option)
    assert found - exempt == checked


def test_a_number_beyond_64_bits_is_never_a_missing_schema(db_dsn, capsys):
    """Behind the bounds: an int beyond 64 bits that reaches a pgqueue function anyway is sent
    as numeric, and the 42883 it gets is bad input, not SchemaOutOfDate; the library refuses
    such caps before any statement."""
    import typer

    from pgqueue.admission import set_admission
    from pgqueue.cli import cli_errors
    from pgqueue.errors import InvalidArgument, SchemaOutOfDate, from_sqlstate

    for kwargs in ({"max_queued": 2**63}, {"tenant_max_queued": 10**20}):
        with (
            psycopg.connect(db_dsn) as conn,
            pytest.raises(InvalidArgument, match=r"from 0 to 2\^63-1 or None"),
        ):
            set_admission(conn, "standard", **kwargs)

    @cli_errors
    def huge_cap() -> None:
        with psycopg.connect(db_dsn) as conn:
            conn.execute("SELECT pgqueue.admission_set('standard', %s, NULL, 'reject')", (10**20,))

    with pytest.raises(typer.Exit) as exit_:
        huge_cap()
    assert exit_.value.exit_code == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("InvalidArgument: a number is out of range")
    message = "function pgqueue.admission_set(unknown, numeric, unknown, unknown) does not exist"
    assert isinstance(from_sqlstate("42883", message), InvalidArgument)
    missing = "function pgqueue.admission_set(unknown, bigint, unknown, unknown) does not exist"
    assert isinstance(from_sqlstate("42883", missing), SchemaOutOfDate)
    with psycopg.connect(db_dsn) as conn:
        caps = conn.execute("SELECT max_queued, tenant_max_queued FROM pgqueue.admission")
        assert caps.fetchall() == [(None, None)] * 3


def test_cancel_takes_a_negative_id(db_dsn):
    """`pgqueue cancel -5` said "No such option: -5" in typer's box: click read it as an
    option. It is the job id, refused in one line like 0."""
    for value in ("-5", "0"):
        result = run("cancel", value, "--dsn", db_dsn)
        assert result.exit_code == 2, (value, result.stderr)
        assert _lines(result) == [
            f"InvalidArgument: job_id must be an integer from 1 to 2^63-1, got {value}"
        ]
    # An option still takes a value that starts with "-".
    result = run("cancel", "--all-queued", "--tenant", "a", "--reason", "-5", "--dsn", db_dsn)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "cancelled 0 queued job(s) of tenant 'a'"


def test_tiers_take_any_case_and_retry_checks_the_tenant(db_dsn):
    """`--plan PRO` was taken but `--tier BATCH` refused by `cancel --all-queued` and `retry`
    (and `admission set BATCH`); `retry --tenant ''` matched nothing and said "re-queued 0"
    where `cancel` refuses an empty tenant id."""
    import pgqueue
    from pgqueue.admin import requeue_failed

    with psycopg.connect(db_dsn) as conn:
        for _ in range(3):
            pgqueue.enqueue(conn, tenant_id="a", origin="batch_job", payload={}, kind="k")
        conn.execute(
            "UPDATE pgqueue.jobs SET state = 'failed', finished_at = now()"
            " WHERE id = (SELECT min(id) FROM pgqueue.jobs)"
        )
    result = run("retry", "--tier", "BATCH", "--dsn", db_dsn)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "re-queued 1 failed job(s)"
    result = run("cancel", "--all-queued", "--tenant", "a", "--tier", " Batch ", "--dsn", db_dsn)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "cancelled 3 queued job(s) of tenant 'a'"
    result = run("admission", "set", "BATCH", "--policy", "DROP", "--dsn", db_dsn)
    assert result.exit_code == 0, result.stderr
    with psycopg.connect(db_dsn) as conn:
        assert requeue_failed(conn, tier="STANDARD") == []
        policy = conn.execute("SELECT policy FROM pgqueue.admission WHERE tier = 'batch'")
        assert policy.fetchone() == ("drop",)
    for command in (["retry", "--tier"], ["cancel", "--all-queued", "--tenant", "a", "--tier"]):
        result = run(*command, "urgent", "--dsn", db_dsn)
        assert result.exit_code == 2, (command, result.stderr)
        assert _lines(result) == [
            "InvalidArgument: unknown tier 'urgent'; expected critical, standard or batch"
        ]
    expected = {
        "": "InvalidTenant: tenant_id must be a string of 1 to 128 characters, got ''",
        "t" * 200: "InvalidTenant: tenant_id must be a string of 1 to 128 characters, got one "
        f"of 200 characters: '{'t' * 40}'…",
    }
    for tenant, line in expected.items():
        result = run("retry", "--tenant", tenant, "--dsn", _UNREACHABLE)
        assert result.exit_code == 2, result.stderr
        assert _lines(result) == [line]


def test_invalid_settings_are_one_line(monkeypatch):
    """A bad PGQUEUE_* setting printed pydantic's error: three lines each, and a link."""
    monkeypatch.setenv("PGQUEUE_POLL_INTERVAL_SECONDS", "inf")
    monkeypatch.setenv("PGQUEUE_CONCURRENCY", "many")
    result = run("status", "--dsn", _UNREACHABLE)
    assert result.exit_code == 2, result.stderr
    assert _lines(result) == [
        "invalid settings: concurrency: Input should be a valid integer, unable to parse string "
        "as an integer (got 'many'); poll_interval_seconds: Input should be a finite number "
        "(got 'inf')"
    ]


def test_a_payload_file_whose_name_is_not_utf8_is_read(db_dsn, tmp_path):
    """Found by a tester: the check of non-UTF-8 arguments refused `--payload @<file>` when
    the file's name was not UTF-8, though a file name need not be UTF-8 to be opened."""
    path = tmp_path / "p\udcff.json"  # the bytes b"p\xff.json" on disk
    path.write_text(
        '{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}'
    )
    result = run("enqueue", "acme", "--payload", f"@{path}", "--dsn", db_dsn)
    assert result.exit_code == 0, result.stderr
    assert _jobs(db_dsn) == 1


def test_a_blank_tenant_id_is_refused_by_every_command(db_dsn):
    """Found by a tester: `tenants set "  "` stored a tenant, and `jobs list --tenant "  "`,
    `retry`, `cancel --all-queued` and `batches on` took a blank tenant id that enqueue
    refuses. Each now refuses it with enqueue's error and exit 2; nothing is stored."""
    for tenant, says in (
        ("", "InvalidTenant: tenant_id must be a string of 1 to 128 characters, got ''"),
        ("  ", "InvalidTenant: tenant_id must hold a character other than white space, got '  '"),
        ("\t\u3000", "InvalidTenant: tenant_id must hold a character other than white space"),
        # found by a tester: a zero-width space (and other characters that show nothing)
        ("\u200b", "InvalidTenant: tenant_id must hold a visible character"),
        ("\ufeff\x01", "InvalidTenant: tenant_id must hold a visible character"),
    ):
        for command in (
            ["tenants", "set", tenant],
            ["tenants", "set", tenant, "--plan", "pro"],
            ["jobs", "list", "--tenant", tenant],
            ["retry", "--tenant", tenant],
            ["cancel", "--all-queued", "--tenant", tenant],
            ["batches", "on", "--tenant", tenant],
            ["enqueue", tenant, "--prompt", "x"],
        ):
            result = run(*command, "--dsn", db_dsn)
            assert result.exit_code == 2, (command, result.stdout, result.stderr)
            assert len(_lines(result)) == 1 and _lines(result)[0].startswith(says), (
                command,
                result.stderr,
            )
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pgqueue.tenants").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM pgqueue.batch_lane").fetchone()[0] == 0
    assert _jobs(db_dsn) == 0


def test_an_enqueue_that_waits_for_room_says_so_once(db_dsn, monkeypatch):
    """Found by a tester: `pgqueue enqueue` into a full tier of policy block waited silently
    (up to the block timeout) and looked hung. It says on stderr, once, what is full and how
    long it waits; then the usual QueueFull line and exit 75 when no room came."""
    import pgqueue

    monkeypatch.setenv("PGQUEUE_ADMISSION_BLOCK_TIMEOUT_SECONDS", "0.5")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.set_admission(conn, "standard", max_queued=0, policy="block")
        pgqueue.set_admission(conn, "batch", tenant_max_queued=1, policy="block")
        pgqueue.enqueue(conn, tenant_id="acme", origin="batch_job", payload={}, kind="k")
    for extra, says in (
        (
            ["--sla-seconds", "60"],
            "waiting for room: tier standard holds 0 queued jobs (cap 0, policy block); "
            "giving up after 0.5 s",
        ),
        (
            [],
            "waiting for room: tenant 'acme' in tier batch holds 1 queued jobs (cap 1, policy "
            "block); giving up after 0.5 s",
        ),
    ):
        result = run("enqueue", "acme", "--prompt", "x", *extra, "--dsn", db_dsn)
        assert result.exit_code == 75, result.stderr
        lines = _lines(result)
        assert len(lines) == 2 and lines[0] == says, lines
        assert lines[1].startswith("QueueFull: queue full: ") and "no room after" in lines[1]
    assert _jobs(db_dsn) == 1


@pytest.mark.parametrize(
    "command",
    [["status"], ["status", "--json"], ["metrics", "--port", "19473"]],
)
def test_a_bad_database_setting_is_an_invalid_setting(db_dsn, command):
    """Found by a tester: with `ALTER DATABASE d SET pgqueue.default_quantum = 'abc'`,
    `pgqueue status` said "invalid DSN or query: ..." and exit 2 (bad input), where `pgqueue
    work` says InvalidSetting and exit 1, as the README does: the database's setting is the
    environment."""
    from psycopg import sql

    import pgqueue

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        # a tenant with a queued job: status reads its quantum
        pgqueue.enqueue(conn, tenant_id="t", origin="user_action", payload={}, kind="k")
        name = sql.Identifier(conn.info.dbname)
        conn.execute(sql.SQL("ALTER DATABASE {} SET pgqueue.default_quantum = 'abc'").format(name))
    result = run(*command, "--dsn", db_dsn)
    assert result.exit_code == 1, result.stderr
    assert _lines(result) == [
        "InvalidSetting: pgqueue.default_quantum must be a number from 0.001 to 1000000000, "
        "got 'abc'"
    ]


def test_a_dropped_enqueue_prints_no_id(db_dsn):
    """Found by a tester: into a full tier of policy drop, `pgqueue enqueue` printed
    "dropped (tier full, policy drop)" on stdout and exited 0, so `id=$(pgqueue enqueue ...)`
    held that text. Now nothing on stdout, the notice on stderr, exit 75 (not enqueued, as for
    QueueFull)."""
    import pgqueue

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.set_admission(conn, "standard", max_queued=0, policy="drop")
    result = run("enqueue", "acme", "--prompt", "x", "--sla-seconds", "60", "--dsn", db_dsn)
    assert result.exit_code == 75
    assert result.stdout == ""
    assert _lines(result) == ["dropped (tier full, policy drop): not enqueued"]
    assert _jobs(db_dsn) == 0
    admitted = run("enqueue", "acme", "--prompt", "x", "--dsn", db_dsn)  # batch: not capped
    assert admitted.exit_code == 0 and admitted.stdout.strip().isdigit()
