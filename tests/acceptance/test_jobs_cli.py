"""`pgqueue jobs list` (filters, --json, pages) and `pgqueue jobs show ID`, and the checks of
`pgqueue dashboard` before it serves."""

from __future__ import annotations

import json

import psycopg
from typer.testing import CliRunner

import pgqueue
from pgqueue.cli import app

runner = CliRunner()
PAYLOAD = {
    "model": "claude-haiku-4-5",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "[bold]x[/bold] <script>"}],
}


def _seed(dsn: str) -> dict[str, list[int]]:
    ids: dict[str, list[int]] = {"acme": [], "globex": []}
    with psycopg.connect(dsn) as conn:
        for i in range(6):
            tenant = "acme" if i % 2 == 0 else "globex"
            origin = "user_action" if i < 3 else "batch_job"
            job = pgqueue.enqueue(conn, tenant_id=tenant, origin=origin, payload=PAYLOAD)
            assert job is not None
            ids[tenant].append(job)
        conn.execute(
            "UPDATE pgqueue.jobs SET state = 'failed', last_error = 'boom', finished_at = now()"
            " WHERE id = %s",
            (ids["acme"][0],),
        )
        conn.commit()
    return ids


def _list(dsn: str, *args: str) -> list[dict]:
    result = runner.invoke(app, ["jobs", "list", "--json", "--dsn", dsn, *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_list_filters_and_pages(db_dsn):
    ids = _seed(db_dsn)
    everything = _list(db_dsn)
    assert [r["id"] for r in everything] == sorted(ids["acme"] + ids["globex"], reverse=True)
    acme = _list(db_dsn, "--tenant", "acme")
    assert {r["tenant_id"] for r in acme} == {"acme"} and len(acme) == 3
    failed = _list(db_dsn, "--state", "FAILED")
    assert [(r["id"], r["last_error"]) for r in failed] == [(ids["acme"][0], "boom")]
    batch = _list(db_dsn, "--tier", "batch", "--tenant", "globex")
    assert [r["id"] for r in batch] == [ids["globex"][2], ids["globex"][1]]
    assert _list(db_dsn, "--kind", "pgqueue.noop") == []
    page = _list(db_dsn, "--limit", "2")
    older = _list(db_dsn, "--limit", "2", "--before", str(page[-1]["id"]))
    assert [r["id"] for r in page + older] == [r["id"] for r in everything[:4]]
    table = runner.invoke(app, ["jobs", "list", "--dsn", db_dsn, "--state", "failed"])
    assert table.exit_code == 0 and "boom" in table.stdout


def test_bad_filters_exit_2(db_dsn):
    for args in (["--state", "done"], ["--tier", "urgent"], ["--limit", "0"], ["--tenant", ""]):
        result = runner.invoke(app, ["jobs", "list", "--dsn", db_dsn, *args])
        assert result.exit_code == 2, (args, result.output)


def test_show_one_job(db_dsn):
    ids = _seed(db_dsn)
    job_id = ids["acme"][0]
    result = runner.invoke(app, ["jobs", "show", str(job_id), "--json", "--dsn", db_dsn])
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)
    assert (job["id"], job["state"], job["tenant_id"], job["tier"]) == (
        job_id,
        "failed",
        "acme",
        "critical",
    )
    assert job["payload"] == PAYLOAD
    assert [e["event"] for e in job["timeline"]] == ["enqueued", "failed"]
    shown = runner.invoke(app, ["jobs", "show", str(job_id), "--dsn", db_dsn])
    assert shown.exit_code == 0
    assert "[bold]x[/bold] <script>" in shown.stdout  # stored text, not rich markup
    missing = runner.invoke(app, ["jobs", "show", "999999", "--dsn", db_dsn])
    assert missing.exit_code == 2 and "no job 999999" in missing.stderr


def test_dashboard_refuses_a_short_token_before_serving(db_dsn):
    result = runner.invoke(app, ["dashboard", "--dsn", db_dsn, "--token", "short"])
    assert result.exit_code == 2
    assert "at least 16 characters" in result.stderr
    assert "short" not in result.stderr.replace("at least", "")
    result = runner.invoke(app, ["dashboard", "--dsn", db_dsn, "--port", "0"])
    assert result.exit_code == 2


def test_dashboard_command_serves_read_only_on_loopback(db_dsn):
    """`pgqueue dashboard` end to end: it says where it serves, answers there, is read-only
    without a token, and stops on SIGINT."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "PGQUEUE_DASHBOARD_TOKEN"}
    argv = ["dashboard", "--dsn", db_dsn, "--port", str(port), "--refresh-seconds", "0"]
    with subprocess.Popen(
        [sys.executable, "-c", "from pgqueue.cli import app; app()", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert f"http://127.0.0.1:{port}/ (read-only (no admin token))" in line
            deadline = time.monotonic() + 20
            while True:  # uvicorn binds just after that line
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
                        page = answer.read().decode()
                    break
                except OSError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            assert 'id="mode">read-only' in page
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=20)
