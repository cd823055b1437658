"""`pgqueue cancel`: cancels a job, says what it found, and refuses unknown jobs in one line."""

from __future__ import annotations

import psycopg
from typer.testing import CliRunner

import pgqueue
from pgqueue.cli import app

runner = CliRunner()
PAYLOAD = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def run(*args: str):
    result = runner.invoke(app, list(args))
    assert "Traceback" not in (result.stdout + result.stderr)
    return result


def test_cancel_from_the_command_line(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        job_id = pgqueue.enqueue(conn, tenant_id="acme", origin="batch_job", payload=PAYLOAD)
    result = run("cancel", str(job_id), "--reason", "duplicate", "--dsn", db_dsn)
    assert result.exit_code == 0, result.stderr
    assert f"job {job_id} cancelled" in result.stdout

    result = run("cancel", str(job_id), "--tenant", "globex", "--dsn", db_dsn)
    assert result.exit_code == 2
    assert result.stderr.strip() == f"UnknownJob: no job {job_id} of tenant 'globex'"

    result = run("cancel", "0", "--dsn", db_dsn)
    assert result.exit_code == 2
    assert result.stderr.startswith("InvalidArgument: job_id must be an integer")

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT state::text, last_error FROM pgqueue.jobs WHERE id = %s", (job_id,)
        ).fetchone()
    assert row == ("cancelled", "cancelled: duplicate")


def test_a_finished_job_is_reported_not_changed(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        job_id = pgqueue.enqueue(conn, tenant_id="acme", origin="batch_job", payload=PAYLOAD)
        conn.execute(
            "UPDATE pgqueue.jobs SET state = 'failed', finished_at = now() WHERE id = %s",
            (job_id,),
        )
    result = run("cancel", str(job_id), "--dsn", db_dsn)
    assert result.exit_code == 0
    assert f"job {job_id} had already failed; left as it is" in result.stdout


def test_cancel_a_tenants_backlog_from_the_command_line(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.enqueue_many(conn, [pgqueue.JobSpec("[acme]", "batch_job", PAYLOAD)] * 3)
        kept = pgqueue.enqueue(conn, tenant_id="other", origin="batch_job", payload=PAYLOAD)
    result = run("cancel", "--all-queued", "--tenant", "[acme]", "--tier", "batch", "--dsn", db_dsn)
    assert result.exit_code == 0, result.stderr
    assert "cancelled 3 queued job(s) of tenant '[acme]'" in result.stdout
    for args in (["cancel", "--all-queued"], ["cancel"], ["cancel", "5", "--tier", "batch"]):
        result = run(*args, "--dsn", db_dsn)
        assert result.exit_code == 2
        assert result.stderr.startswith("InvalidArgument: ")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        states = conn.execute("SELECT tenant_id, state::text FROM pgqueue.jobs").fetchall()
    assert sorted(states) == [("[acme]", "cancelled")] * 3 + [("other", "queued")]
    assert kept is not None


def test_names_with_emoji_codes_are_shown_as_they_are(db_dsn: str) -> None:
    """Found by a tester: rich turned ':smile:' in a tenant id into an emoji."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.enqueue(conn, tenant_id=":smile:", origin="batch_job", payload=PAYLOAD)
    result = run("cancel", "--all-queued", "--tenant", ":smile:", "--dsn", db_dsn)
    assert result.exit_code == 0, result.stderr
    assert "cancelled 1 queued job(s) of tenant ':smile:'" in result.stdout
    result = run("cancel", "999999", "--tenant", ":+1:", "--dsn", db_dsn)
    assert result.stderr.strip() == "UnknownJob: no job 999999 of tenant ':+1:'"


def test_a_producer_cancels_from_the_command_line_with_tenant(db_dsn: str) -> None:
    """Found by a tester: as a pgqueue_producer role, `pgqueue cancel ID --tenant T` failed
    with "a producer session must set pgqueue.tenant_id"; --tenant now sets that scope unless
    the session has one."""
    import uuid

    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    from pgqueue.db import queries

    name = f"pq_cli_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        queries.run(conn, "security_grant")
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE pgqueue_producer").format(sql.Identifier(name))
        )
        job = pgqueue.enqueue(conn, tenant_id="acme", origin="batch_job", payload=PAYLOAD)
        pgqueue.enqueue(conn, tenant_id="acme", origin="batch_job", payload=PAYLOAD)
    try:
        producer = make_conninfo(db_dsn, user=name)
        result = run("cancel", str(job), "--tenant", "acme", "--dsn", producer)
        assert result.exit_code == 0, result.stderr
        result = run("cancel", "--all-queued", "--tenant", "acme", "--dsn", producer)
        assert result.exit_code == 0, result.stderr
        assert "cancelled 1 queued job(s)" in result.stdout
        result = run("cancel", str(job), "--dsn", producer)  # no scope: bad input, one line
        assert result.exit_code == 2
        assert result.stderr.strip() == (
            "InvalidArgument: this role cancels only its tenant's jobs: give --tenant TENANT"
        )
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
