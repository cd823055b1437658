"""Helpers for tests that run ``pgqueue`` as real processes against a real database."""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

#: The repository root: ``tests.apps.noop_app`` is importable from here.
REPO_ROOT = Path(__file__).resolve().parents[2]

#: ``--app`` value of the test handlers.
NOOP_APP = "tests.apps.noop_app:registry"

T = TypeVar("T")
_serial = itertools.count()


def pgqueue_cmd(*args: str) -> list[str]:
    """argv running the ``pgqueue`` CLI (the console script's entry point) with this Python."""
    return [sys.executable, "-c", "from _pgqueue_launcher import main; main()", *args]


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A hermetic environment for a CLI subprocess.

    Drops inherited ``PGQUEUE_*`` / ``ANTHROPIC_*`` / ``PGAPPNAME`` (tests set what they need),
    puts the repository root on ``PYTHONPATH`` (for ``--app tests.apps...``) and widens rich's
    console so that messages are not wrapped.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PGQUEUE_", "ANTHROPIC_")) and k != "PGAPPNAME"
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["COLUMNS"] = "250"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@dataclass
class CliProcess:
    """A running ``pgqueue`` subprocess whose stdout/stderr go to files."""

    popen: subprocess.Popen[bytes]
    out_path: Path
    err_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait(self, timeout: float) -> int:
        """Exit code; on timeout the process is killed and AssertionError raised with its log."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"pgqueue (pid {self.pid}) did not exit within {timeout} s\n{self.stderr()}"
            ) from None

    def kill(self) -> None:
        """SIGKILL the process (if it still runs) and reap it."""
        if self.popen.poll() is None:
            self.popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)

    def stdout(self) -> str:
        return self.out_path.read_text(encoding="utf-8", errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(encoding="utf-8", errors="replace")


def start_cli(
    *args: str,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    wrap: Callable[[list[str]], list[str]] | None = None,
) -> CliProcess:
    """Start ``pgqueue *args`` from the repository root with :func:`cli_env` (plus ``env``);
    ``wrap`` turns the argv into the one to run (e.g. inside a simulated host)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    n = next(_serial)
    out_path, err_path = log_dir / f"pgqueue{n}.out", log_dir / f"pgqueue{n}.err"
    argv = pgqueue_cmd(*args)
    with out_path.open("wb") as out, err_path.open("wb") as err:
        popen = subprocess.Popen(
            wrap(argv) if wrap else argv, cwd=REPO_ROOT, env=cli_env(env), stdout=out, stderr=err
        )
    return CliProcess(popen, out_path, err_path)


def run_cli(
    *args: str, timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``pgqueue *args`` to completion and capture its output."""
    return subprocess.run(
        pgqueue_cmd(*args),
        cwd=REPO_ROOT,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_until(
    probe: Callable[[], T], *, timeout: float, interval: float = 0.02, what: str = "a condition"
) -> T:
    """Poll ``probe`` until it returns something truthy; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def jobs(dsn: str, where: str = "TRUE", params: Any = None) -> list[dict[str, Any]]:
    """Rows of ``pgqueue.jobs`` (state and priority as text), ordered by id."""
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT *, state::text AS state, priority::text AS priority FROM pgqueue.jobs "
            f"WHERE {where} ORDER BY id",
            params,
        ).fetchall()


def count_by_state(dsn: str) -> dict[str, int]:
    """Number of jobs per state."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT state::text, count(*) FROM pgqueue.jobs GROUP BY 1").fetchall()
    return {state: int(n) for state, n in rows}


def workers_ready(dsn: str, procs: Sequence[CliProcess], app_prefix: str) -> bool:
    """Whether every process is in its claim loop: its pool (min_size 1) and its LISTEN
    connection are open, seen by ``application_name`` (``PGAPPNAME=<app_prefix><i>``).
    Raises AssertionError, with its log, for a process that already exited."""
    for proc in procs:
        if proc.popen.poll() is not None:
            raise AssertionError(f"worker {proc.pid} exited early:\n{proc.stderr()}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE %s GROUP BY 1",
            (app_prefix + "%",),
        ).fetchall()
    return len(rows) == len(procs) and all(n >= 2 for _name, n in rows)


def run_held_burst_workers(
    dsn: str,
    worker_dsns: Sequence[str],
    *,
    log_dir: Path,
    record_base: Path,
    app_prefix: str,
    concurrency: int = 8,
    wraps: Sequence[Callable[[list[str]], list[str]] | None] | None = None,
    timeout: float = 120,
) -> tuple[list[CliProcess], list[int]]:
    """Start one ``pgqueue work --burst --app NOOP_APP`` per DSN in ``worker_dsns`` (each
    recording what it runs under ``record_base``), wait until all are connected, then make
    every job due and wake them (the caller enqueued the jobs due later, so that all start on
    equal terms), and wait for them to exit. Returns the processes and their exit codes."""
    procs = [
        start_cli(
            "work",
            "--burst",
            "--concurrency",
            str(concurrency),
            "--app",
            NOOP_APP,
            "--dsn",
            worker_dsn,
            log_dir=log_dir,
            env={"PGQUEUE_TEST_RECORD_FILE": str(record_base), "PGAPPNAME": f"{app_prefix}{i}"},
            wrap=wraps[i] if wraps else None,
        )
        for i, worker_dsn in enumerate(worker_dsns)
    ]
    try:
        wait_until(
            lambda: (
                workers_ready(dsn, procs, app_prefix)
                # and past their start-up (found in a full run: a host connected but still
                # starting took no job while the others drained them all)
                and all(" started: " in proc.stderr() for proc in procs)
            ),
            timeout=60,
            interval=0.05,
            what=f"{len(procs)} workers connected and started",
        )
        with psycopg.connect(dsn) as conn:  # release all jobs and wake the listeners
            conn.execute("UPDATE pgqueue.jobs SET run_at = now()")
            conn.execute("NOTIFY pgqueue_jobs, 'standard'")
        codes = [proc.wait(timeout=timeout) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    return procs, codes


def records_by_pid(record_base: Path) -> dict[int, list[int]]:
    """What each worker process ran: pid -> job ids, from the files ``<record_base>.<pid>``
    that ``tests.apps.noop_app`` writes."""
    ran_by: dict[int, list[int]] = {}
    for path in record_base.parent.glob(f"{record_base.name}.*"):
        pid = int(path.suffix.lstrip("."))
        ran_by[pid] = [int(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return ran_by


def dispatch_turns(dsn: str, *, by: str = "claim") -> list[tuple[str, int]]:
    """The dispatch order as runs of one tenant: ``[(tenant, length), ...]``. With backlogged
    tenants of equal weight and jobs of cost 1, one DRR schedule gives runs of exactly one
    quantum, the tenants in one cyclic order. Jobs of one lane and tier (their keys compare).

    ``by="claim"``: the order the claims took them, ``started_at`` (the claim's transaction
    start, the same for every job of one claim), then the DRR key the job keeps when claimed
    (scheduler v2); exact for one worker, whose claims follow each other. ``by="key"``: the DRR
    keys alone, the one schedule every claimer takes from (concurrent claims' ``started_at``
    need not follow their keys: a claim that began first may take later keys)."""
    queries = {
        "claim": "SELECT tenant_id FROM pgqueue.jobs "
        "ORDER BY started_at, key_round, key_place, key_seq, id",
        "key": "SELECT tenant_id FROM pgqueue.jobs ORDER BY key_round, key_place, key_seq, id",
    }
    turns: list[tuple[str, int]] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(queries[by])
        for (tenant,) in rows:
            if turns and turns[-1][0] == tenant:
                turns[-1] = (tenant, turns[-1][1] + 1)
            else:
                turns.append((tenant, 1))
    return turns
