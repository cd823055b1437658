"""`pgqueue status --json`: per-tier p50/p99 and the SLO verdict (2 s / 6 s / 120 s)."""

from __future__ import annotations

import json

import psycopg
from typer.testing import CliRunner

from pgqueue.cli import app

runner = CliRunner()


def _finish_jobs(dsn: str, tier: str, latencies: list[float]) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO pgqueue.tenants (tenant_id) VALUES ('t') ON CONFLICT DO NOTHING")
        for seconds in latencies:
            conn.execute(
                "INSERT INTO pgqueue.jobs (tenant_id, origin, priority, state, payload,"
                " enqueued_at, started_at, finished_at)"
                " VALUES ('t', 'user_action', %s::pgqueue.tier, 'succeeded', '{}',"
                " now() - make_interval(secs => %s), now(), now())",
                (tier, seconds),
            )
        conn.commit()


def _status(dsn: str) -> dict:
    result = runner.invoke(app, ["status", "--json", "--dsn", dsn])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_a_run_that_meets_the_slo(db_dsn):
    _finish_jobs(db_dsn, "critical", [0.2, 0.5, 0.8, 1.0, 1.5])
    _finish_jobs(db_dsn, "batch", [30.0, 90.0])
    data = _status(db_dsn)
    critical = data["latency"]["critical"]
    assert critical["finished"] == 5
    assert critical["p50_seconds"] == 0.8
    assert 1.4 < critical["p99_seconds"] <= 1.5
    assert critical["slo_p99_seconds"] == 2
    assert critical["meets_slo"] is True
    assert data["latency"]["batch"]["meets_slo"] is True
    assert data["latency"]["standard"]["meets_slo"] is None  # no data is not a pass


def test_a_run_that_misses_the_slo(db_dsn):
    _finish_jobs(db_dsn, "critical", [0.5] * 98 + [3.0, 9.0])
    _finish_jobs(db_dsn, "standard", [1.0, 7.5])
    data = _status(db_dsn)
    assert data["latency"]["critical"]["meets_slo"] is False
    assert data["latency"]["critical"]["p50_seconds"] == 0.5
    assert data["latency"]["critical"]["p99_seconds"] > 2
    assert data["latency"]["standard"]["meets_slo"] is False
    table = runner.invoke(app, ["status", "--dsn", db_dsn])
    assert "misses" in table.stdout


def test_the_slo_is_a_setting(db_dsn):
    _finish_jobs(db_dsn, "critical", [3.0])
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SELECT set_config('pgqueue.slo_p99_critical_seconds', '5', false)")
        row = conn.execute(
            "SELECT meets_slo FROM pgqueue.latency_slo"
            " WHERE window_name = '5m' AND tier = 'critical'"
        ).fetchone()
    assert row == (True,)


def test_watch_into_a_pipe_prints_each_refresh(db_dsn, tmp_path):
    """Found by a tester: `pgqueue status --watch 2 | cat` printed nothing (rich's Live only
    redraws a terminal). Into a pipe, every refresh is printed in full under a time line."""
    import signal

    from tests.apps.harness import start_cli, wait_until

    _finish_jobs(db_dsn, "critical", [0.5])
    watcher = start_cli("status", "--watch", "0.5", "--dsn", db_dsn, log_dir=tmp_path)
    try:
        wait_until(
            lambda: watcher.stdout().count("Queue depth") >= 2,
            timeout=30,
            what="two refreshes in the pipe",
        )
        watcher.popen.send_signal(signal.SIGINT)
        assert watcher.wait(30) == 0, watcher.stderr()
    finally:
        watcher.kill()
    assert watcher.stdout().count("--- ") >= 2


def test_status_shows_the_batches_lane_per_tenant(db_dsn):
    from tests.db.test_batch_lane_service import batch_jobs

    batch_jobs(
        db_dsn,
        [
            ("acme", "succeeded", 1_000_000, 100_000),
            ("globex", "succeeded", 2_000_000, 0),
            ("globex", "errored", 0, 0),
        ],
    )
    tenants = {t["tenant_id"]: t for t in _status(db_dsn)["batches"]["tenants"]}
    assert [t for t in tenants] == ["globex", "acme"]  # most tokens first
    assert tenants["acme"]["input_tokens"] == 1_000_000
    assert tenants["acme"]["output_tokens"] == 100_000
    # 50 % of $3 per million input and $15 per million output tokens (the default settings)
    assert tenants["acme"]["cost_saved_usd"] == 0.5 * (3.0 + 0.1 * 15)
    assert tenants["globex"]["requests"] == 2
    assert tenants["globex"]["cost_saved_usd"] == 3.0
    table = runner.invoke(app, ["status", "--dsn", db_dsn])
    assert "Batches lane per tenant" in table.stdout


def test_watch_into_a_pipe_that_closes_exits_0_quietly(db_dsn):
    """Found by a tester (issue 29): `pgqueue status --watch 1 | head -1` exited 1 (rich's own
    answer to a broken pipe). The reader going away is not an error: exit 0, stderr empty."""
    import subprocess

    from tests.apps.harness import REPO_ROOT, cli_env, pgqueue_cmd

    with subprocess.Popen(
        pgqueue_cmd("status", "--watch", "0.5", "--dsn", db_dsn),
        cwd=REPO_ROOT,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as watcher:
        try:
            assert watcher.stdout is not None and watcher.stderr is not None
            assert watcher.stdout.readline().startswith(b"--- ")  # `head -1`, then it leaves
            watcher.stdout.close()
            assert watcher.wait(60) == 0
            assert watcher.stderr.read() == b""
        finally:
            if watcher.poll() is None:
                watcher.kill()


def test_tables_in_a_pipe_are_not_cut(db_dsn):
    """Found by a tester (issue 29): into a pipe, rich fitted every table to 80 columns, so
    `pgqueue jobs list | grep` saw long tenant ids cut with "…". Off a terminal (no terminal
    on any of stdin, stdout, stderr, no COLUMNS) status, jobs list and tenants list print
    whole rows."""
    import subprocess

    import pgqueue
    from tests.apps.harness import REPO_ROOT, cli_env, pgqueue_cmd

    tenant = "tenant-" + "x" * 110 + "-end"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pgqueue.enqueue(conn, tenant_id=tenant, origin="user_action", payload={}, kind="k")
    env = cli_env()
    env.pop("COLUMNS")
    for command in (["status"], ["jobs", "list"], ["tenants", "list"]):
        done = subprocess.run(
            pgqueue_cmd(*command, "--dsn", db_dsn),
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "…" not in done.stdout, command
        assert [line for line in done.stdout.splitlines() if tenant in line], command
