"""`pgqueue bench` runs end to end at tiny sizes (a smoke test, not a measurement)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import bench
from pgqueue.cli import app

runner = CliRunner()


def test_percentile_nearest_rank() -> None:
    values = [float(x) for x in range(1, 101)]
    assert bench.percentile(values, 50) == 50.0
    assert bench.percentile(values, 99) == 99.0
    assert bench.percentile([3.0], 99) == 3.0


def test_bad_options_exit_2() -> None:
    result = runner.invoke(app, ["bench", "--procs", "1,x"])
    assert result.exit_code == 2
    result = runner.invoke(app, ["bench", "--only", "enqueue,nope"])
    assert result.exit_code == 2
    result = runner.invoke(app, ["bench", "--peer", "procrastinate"])
    assert result.exit_code == 2
    result = runner.invoke(app, ["bench", "--procs", "1,,1"])  # was read as 1,1
    assert result.exit_code == 2
    # pgqueuer's own rule: its cap on jobs in flight is at least twice its batch
    result = runner.invoke(
        app,
        ["bench", "--peer", "pgqueuer", "--peer-batch", "10", "--peer-max-in-flight", "15"],
    )
    assert result.exit_code == 2 and "twice" in result.output
    # found by a tester: without a peer it was ignored (or refused by the peer's rule)
    result = runner.invoke(app, ["bench", "--peer-max-in-flight", "40"])
    assert result.exit_code == 2 and "needs --peer" in result.output
    # found by a tester: the whole run came first, then exit 2 and the results were lost
    result = runner.invoke(app, ["bench", "--json-out", "/nonexistent/dir/x.json"])
    assert result.exit_code == 2 and "does not exist" in result.output


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_bench_tiny_run(server_dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = runner.invoke(
        app,
        [
            "bench",
            "--dsn",
            server_dsn,
            "--jobs",
            "60",
            "--procs",
            "1,2",
            "--repeats",
            "1",
            "--single-jobs",
            "20",
            "--bulk-jobs",
            "50",
            "--batch",
            "20",
            "--wake-samples",
            "5",
            "--claim-batch",
            "3",
            "--json-out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["meta"]["systems"] == ["pgqueue", "plain"]
    assert report["meta"]["options"]["claim_batch"] == 3
    assert "at most 3 per claim" in result.output
    for mode in ("single", "bulk"):
        row = report["enqueue"][mode]
        assert row["pgqueue_jobs_per_s"] > 0 and row["plain_jobs_per_s"] > 0
        assert row["ratio_vs_plain"] > 0
    assert [r["procs"] for r in report["consume"]] == [1, 2]
    for row in report["consume"]:
        assert row["pgqueue_jobs_per_s"] > 0 and row["plain_jobs_per_s"] > 0
    assert report["wakeup"]["samples"] == 5
    assert 0 < report["wakeup"]["p50_ms"] <= report["wakeup"]["p99_ms"]
    # every scratch database is gone
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE starts_with(datname, %s)",
            (report["meta"]["scratch_prefix"],),
        ).fetchall()
    assert left == []


def test_help_shows_the_install_extra() -> None:
    """Rich markup ate ``[bench]`` from the help: it told users to ``pip install 'pgqueue'``."""
    result = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "pip install -e '.[bench]'" in result.output


def test_workers_do_not_inherit_the_callers_pgqueue_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Found by a tester: PGQUEUE_CLAIM_BATCH_MAX=1 in the shell reached the benchmark's
    workers, which then ran another shape than the report said."""
    from pgqueue.bench.measure import _spawn

    monkeypatch.setenv("PGQUEUE_CLAIM_BATCH_MAX", "1")
    monkeypatch.setenv("PGQUEUE_TEST_MARKER", "x")
    code = "import os, sys; sys.stderr.write(repr(sorted(k for k in os.environ if 'PGQUEUE' in k)))"
    with (tmp_path / "log").open("w+b") as log:
        assert _spawn([sys.executable, "-c", code], log).wait(timeout=60) == 0
        log.seek(0)
        assert log.read().decode() == "[]"
