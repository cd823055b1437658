"""What a worker logs through an outage of its own database (``ALTER DATABASE … ALLOW_CONNECTIONS
false``, its sessions terminated): one line as it starts and one as it ends, whichever of its
loops sees it, busy (every slot running) or idle."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

import pgqueue
from pgqueue import JobSpec
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker
from tests.apps.noop_app import registry as test_registry

#: Longer than the pool's default wait for a connection (30 s), after which each upkeep loop
#: of a worker used to warn.
OUTAGE_SECONDS = 35.0


def _allow_connections(dsn: str, server_dsn: str, allow: bool) -> None:
    """``ALTER DATABASE … ALLOW_CONNECTIONS``; when forbidding, end its sessions too."""
    name = conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(
                sql.Identifier(name), sql.Literal(allow)
            )
        )
        if not allow:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )


def _states(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT state::text, count(*) FROM pgqueue.jobs GROUP BY 1")
        return {str(state): int(n) for state, n in rows.fetchall()}


async def _until(probe: object, what: str, seconds: float = 60.0) -> None:
    assert callable(probe)
    for _ in range(int(seconds / 0.1)):
        if await asyncio.to_thread(probe):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {what} in {seconds} s")


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("busy", [True, False], ids=["busy", "idle"])
async def test_an_outage_is_one_line_as_it_starts_and_one_as_it_ends(
    db_dsn: str, server_dsn: str, caplog: pytest.LogCaptureFixture, busy: bool
) -> None:
    """Found by a tester: through a 95 s outage an idle worker logged each upkeep loop's
    failure ("ANALYZE of pgqueue.jobs failed (couldn't get a connection after 30.00 sec); will
    retry", and heartbeat, rescue, vacuum, compaction, pruning), 10 of its 15 lines; a busy
    one (every slot running, so no claims) reported no outage and no end."""
    caplog.set_level(logging.WARNING)
    caplog.set_level(logging.INFO, logger="pgqueue.worker")
    if busy:
        with psycopg.connect(db_dsn) as conn:
            specs = [JobSpec("t", "scheduled", {"seconds": 10}, kind="test.slow")] * 2
            pgqueue.enqueue_many(conn, specs)
            conn.commit()
    every_2_s = {
        "heartbeat_seconds": 2.0,
        "rescue_interval_seconds": 2.0,
        "counters_compact_interval_seconds": 2.0,
        "hot_tables_vacuum_interval_seconds": 2.0,
    }
    settings = Settings(poll_interval_seconds=0.2, **every_2_s)
    worker = Worker(db_dsn, settings, test_registry, concurrency=2)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        if busy:
            await _until(lambda: _states(db_dsn).get("running") == 2, "2 jobs running")
        await asyncio.sleep(2.5)  # every loop has run once
        await asyncio.to_thread(_allow_connections, db_dsn, server_dsn, False)
        await asyncio.sleep(OUTAGE_SECONDS)
        await asyncio.to_thread(_allow_connections, db_dsn, server_dsn, True)
        await _until(lambda: "available again" in caplog.text, "end of the outage", 30)
        if busy:  # their outcomes were written once the database came back
            await _until(lambda: _states(db_dsn) == {"succeeded": 2}, "jobs succeeded")
    finally:
        await asyncio.to_thread(_allow_connections, db_dsn, server_dsn, True)
        worker.request_stop()
        await asyncio.wait_for(task, 60)
    said = [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name.startswith(("pgqueue", "psycopg"))
        and "API key" not in r.getMessage()  # no key in tests
        and "LISTEN connection lost" not in r.getMessage()  # its own connection, one line
        and not r.getMessage().startswith("stopping")
    ]
    assert len(said) == 2, said
    assert said[0][0] == "WARNING" and said[0][1].startswith("database unavailable ("), said
    assert "is not currently accepting connections" in said[0][1]
    assert said[1][0] == "INFO" and said[1][1].startswith("database available again after ")
