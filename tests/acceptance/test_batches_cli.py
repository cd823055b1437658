"""`pgqueue batches on|off|list`: the lane's switch per tenant and for all, and its batches."""

from __future__ import annotations

import re

import psycopg
from typer.testing import CliRunner

from pgqueue.cli import app

runner = CliRunner()


def test_on_off_per_tenant_and_list(db_dsn: str) -> None:
    on = runner.invoke(app, ["batches", "on", "--dsn", db_dsn])
    assert on.exit_code == 0, on.output
    assert on.stdout.strip() == "batches lane on for every tenant without its own setting"
    off = runner.invoke(app, ["batches", "off", "--tenant", "acme", "--dsn", db_dsn])
    assert off.exit_code == 0, off.output
    with psycopg.connect(db_dsn) as conn:
        lanes = conn.execute(
            "SELECT tenant_id, enabled FROM pgqueue.batch_lane ORDER BY tenant_id"
        ).fetchall()
        takes = conn.execute(
            "SELECT pgqueue.batch_lane_takes(1, 'acme', 'batch', 'anthropic.messages'),"
            " pgqueue.batch_lane_takes(1, 'other', 'batch', 'anthropic.messages'),"
            " pgqueue.batch_lane_takes(1, 'other', 'standard', 'anthropic.messages'),"
            " pgqueue.batch_lane_takes(1, 'other', 'batch', 'noop')"
        ).fetchone()
        conn.execute("INSERT INTO pgqueue.batches (requests) VALUES (3)")
    assert lanes == [("", True), ("acme", False)]
    assert takes == (False, True, False, False)
    listed = runner.invoke(app, ["batches", "list", "--dsn", db_dsn])
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.splitlines()[0] == "lane: (every tenant) on, acme off"
    assert re.search(r"│ 1 +│ coll", listed.stdout), listed.stdout  # the console's width varies


def test_a_bad_tenant_is_one_line_and_exit_2(db_dsn: str) -> None:
    bad = runner.invoke(app, ["batches", "on", "--tenant", "", "--dsn", db_dsn])
    assert bad.exit_code == 2
    assert "tenant" in bad.output
