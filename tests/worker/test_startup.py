"""What a worker process pays before its first claim."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pgqueue.settings import Settings


def test_worker_start_does_not_import_the_sdk() -> None:
    """The Anthropic SDK costs ~1.7 s of CPU to import; the worker takes it on first use only.

    Importing it eagerly made every ``pgqueue work`` start take ~2.3 s, including workers that
    never run an ``anthropic.messages`` job.
    """
    code = (
        "import sys\n"
        "import pgqueue.cli\n"
        "import pgqueue.worker.runtime\n"
        "from pgqueue.worker.runtime import builtin_registry\n"
        "from pgqueue.settings import Settings\n"
        "builtin_registry(Settings())\n"
        "print('anthropic' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def test_an_optional_interval_is_switched_off_by_none_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/operations.md tells a role that cannot VACUUM to set the interval to ``none``."""
    monkeypatch.setenv("PGQUEUE_HOT_TABLES_VACUUM_INTERVAL_SECONDS", "none")
    monkeypatch.setenv("PGQUEUE_RETENTION_SECONDS", " None ")
    monkeypatch.setenv("PGQUEUE_COUNTERS_COMPACT_INTERVAL_SECONDS", "2.5")
    settings = Settings()
    assert settings.hot_tables_vacuum_interval_seconds is None
    assert settings.retention_seconds is None
    assert settings.counters_compact_interval_seconds == 2.5


def test_none_does_not_select_the_embedded_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a tester: with `none` parsed as None for every setting, `PGQUEUE_DSN=none`
    silently selected the embedded Postgres (None's meaning there)."""
    monkeypatch.setenv("PGQUEUE_DSN", "none")
    monkeypatch.setenv("PGQUEUE_ANTHROPIC_BASE_URL", "none")
    settings = Settings()
    assert settings.dsn == "none"  # refused later as an invalid DSN, never taken as "unset"
    assert settings.anthropic_base_url == "none"


_PROBE = """
import asyncio, sys
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker

seen = []
worker = Worker(sys.argv[1], Settings(), burst=True, listen=False)
real_claim = worker._claim

async def claim(limit):
    seen.append("anthropic" in sys.modules)
    return await real_claim(limit)

worker._claim = claim
asyncio.run(worker.run(install_signal_handlers=False))
print(seen[0], "anthropic" in sys.modules)
"""


@pytest.mark.parametrize(("key", "expected"), [("sandbox-key", "True True"), ("", "False False")])
def test_a_worker_with_an_api_key_loads_the_sdk_before_its_first_claim(
    db_dsn: str, key: str, expected: str
) -> None:
    """Found by the suite under load: with the SDK imported at the first job, a request the
    rate limiter had admitted at claim time waited ~2 s for the import, reached the provider
    late and out of order, and drew 429s. A worker without a key never imports it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "PGQUEUE_"))}
    if key:
        env["ANTHROPIC_API_KEY"] = key
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, db_dsn], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.strip() == expected


_SIGTERM_WHILE_STARTING = """
import asyncio, os, signal, sys, time
from pgqueue.handlers.anthropic import AnthropicMessagesHandler
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker

def load_sdk(self):  # a SIGTERM arrives while the SDK loads (~2 s on a real start)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)

AnthropicMessagesHandler.load_sdk = load_sdk
worker = Worker(sys.argv[1], Settings(), listen=False)
claims = []

async def claim(limit):
    claims.append(limit)
    return 0

worker._claim = claim
stats = asyncio.run(worker.run())
print(stats.claimed, len(claims))
"""


def test_sigterm_while_starting_stops_cleanly_before_any_claim(db_dsn: str) -> None:
    """Found by a tester: a SIGTERM in the first seconds of `pgqueue work` (schema check, SDK
    load) killed the process (exit 143): the signal handlers went in only after start-up."""
    done = _run_script(_SIGTERM_WHILE_STARTING, db_dsn, ANTHROPIC_API_KEY="sandbox-key")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0 0"


def _run_script(script: str, dsn: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (argv[1] = ``dsn``) in a fresh interpreter, without the caller's
    ``ANTHROPIC_*`` and ``PGQUEUE_*`` settings (plus ``env``)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "PGQUEUE_"))}
    return subprocess.run(
        [sys.executable, "-c", script, dsn],
        check=False,
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=60,
    )


_LATE_SIGNAL = """
import asyncio, os, signal, sys
from pgqueue.cli.run import work_until_stopped
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker

worker = Worker(sys.argv[1], Settings(), burst=True)
stats = asyncio.run(work_until_stopped(worker))
os.kill(os.getpid(), signal.SIGTERM)  # a signal after the worker has stopped
os.kill(os.getpid(), signal.SIGINT)
print("alive", stats.claimed)
"""


def test_a_signal_after_the_worker_stopped_does_not_kill_the_process(db_dsn: str) -> None:
    """Found by a tester: `pgqueue work` removed its signal handlers when the worker returned,
    so a second SIGTERM or SIGINT arriving while the process exited killed it (143 or 130),
    at times before it printed its summary."""
    done = _run_script(_LATE_SIGNAL, db_dsn)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "alive 0"


_USER_APP = """
import pgqueue

registry = pgqueue.Registry()


@registry.handler("myapp.echo")
async def echo(job):
    return {"echo": job.payload["n"]}
"""


@pytest.mark.timeout(120)
def test_work_app_is_found_in_the_current_directory_and_the_worker_says_it_started(
    db_dsn: str, tmp_path
) -> None:
    """The README's `pgqueue work --app myapp.jobs:registry`, run by the console script from
    the folder that holds `myapp/`: it failed with "No module named 'myapp'" (the script's own
    folder is on the path, the current one is not). Off a terminal the worker prints one line
    per phase: a start-up line, then its summary."""
    from pathlib import Path

    import psycopg

    import pgqueue
    from pgqueue import JobSpec
    from tests.apps.harness import cli_env

    package = tmp_path / "myapp_29"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text(_USER_APP)
    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue_many(
            conn, [JobSpec("t", "scheduled", {"n": i}, kind="myapp.echo") for i in range(3)]
        )
        conn.commit()
    script = Path(sys.executable).parent / "pgqueue"
    if not script.exists():
        pytest.skip("the pgqueue console script is not installed next to this Python")
    env = cli_env({"PGQUEUE_POLL_INTERVAL_SECONDS": "0.2"})
    env.pop("PYTHONPATH")  # as a user's shell: nothing but the current folder to find myapp_29
    done = subprocess.run(
        [str(script), "work", "--burst", "--app", "myapp_29.jobs:registry", "--dsn", db_dsn],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # the rest of stderr is log records (here: no API key for anthropic.messages jobs)
    lines = [line for line in done.stderr.splitlines() if " pgqueue." not in line]
    assert len(lines) == 1 and lines[0].startswith("worker "), done.stderr
    assert "started: 10 slots" in lines[0] and "burst" in lines[0]
    assert "succeeded 3" in done.stdout


def test_a_worker_before_migrate_fails_without_saying_it_started(empty_db_dsn: str) -> None:
    """Found by a tester: `pgqueue work` on a database without the schema printed "worker …
    started: 10 slots…", then failed with SchemaOutOfDate. It checks the schema first: one
    error line naming `pgqueue migrate`, exit 1, and no start-up line."""
    from tests.apps.harness import run_cli

    done = run_cli("work", "--burst", "--dsn", empty_db_dsn, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "pgqueue migrate" in done.stderr
    assert "started" not in done.stderr + done.stdout
