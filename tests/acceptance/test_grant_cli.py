"""`pgqueue grant --restrict-advisory-locks`: producers lose Postgres' advisory locks in the
database (issue 32: a producer holding the scheduler's key stopped every claim)."""

from __future__ import annotations

import psycopg
from typer.testing import CliRunner

from pgqueue.cli import app

runner = CliRunner()
CAN_LOCK = "SELECT has_function_privilege(%s, 'pg_advisory_lock(bigint)', 'EXECUTE')"


def test_grant_restricts_advisory_locks_only_when_asked(db_dsn: str) -> None:
    result = runner.invoke(app, ["grant", "--dsn", db_dsn])
    assert result.exit_code == 0, result.stdout + result.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute(CAN_LOCK, ("pgqueue_producer",)).fetchone() == (True,)
    result = runner.invoke(app, ["grant", "--dsn", db_dsn, "--restrict-advisory-locks"])
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "advisory locks restricted" in result.stdout
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert [
            conn.execute(CAN_LOCK, (role,)).fetchone()[0]
            for role in ("pgqueue_producer", "pgqueue_worker", "pgqueue_admin")
        ] == [False, True, True]
