"""``pgqueue demo``: embedded Postgres + sandbox API + a slice of a real trace + workers.

Replays the first requests of the Azure LLM inference trace 2023 (CC-BY 4.0, Patel et al.,
"Splitwise", ISCA 2024) across eight tenants, one of them a runaway, against the local sandbox
with rate limits scaled up (``rate_scale`` × the defaults 50 RPM / 40k ITPM / 8k OTPM) so that
the demo finishes in well under two minutes, and prints latency per tier and work per tenant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from pydantic import SecretStr

from pgqueue.db import migrate, queries
from pgqueue.observability.report import collect_run_report
from pgqueue.replay import ReplayStats, replay_plan
from pgqueue.sandbox import SandboxConfig, running_sandbox
from pgqueue.settings import Settings
from pgqueue.trace import load_trace, plan_replay
from pgqueue.worker.runtime import Worker

log = logging.getLogger("pgqueue.demo")


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """Size of the demo: ``requests`` from the trace, replayed ``speedup`` × faster, with
    ``concurrency`` jobs in flight and sandbox limits ``rate_scale`` × the defaults; each
    output token takes ``seconds_per_output_token`` to "generate"."""

    requests: int = 400
    speedup: float = 10.0
    concurrency: int = 16
    rate_scale: float = 10.0
    seconds_per_output_token: float = 0.002
    tenants: int = 8
    seed: int = 0


async def _run(dsn: str, settings: Settings, options: DemoOptions, since: datetime) -> ReplayStats:
    plan = plan_replay(
        load_trace(limit=options.requests),
        tenants=options.tenants,
        speedup=options.speedup,
        seed=options.seed,
    )
    worker = Worker(dsn, settings, concurrency=options.concurrency, seed=options.seed)
    work = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        stats = await replay_plan(dsn, plan, settings)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            while True:
                row = await queries.arun(conn, "report_unfinished_since", {"since": since})
                if row["unfinished"] == 0 or work.done():
                    break
                await asyncio.sleep(0.25)
    finally:
        worker.request_stop()
        with contextlib.suppress(asyncio.CancelledError):
            await work
    return stats


#: The demo's own database, recreated on every run next to the user's.
DEMO_DATABASE = "pgqueue_demo"


def demo_database(dsn: str) -> str:
    """Drop and recreate :data:`DEMO_DATABASE` on the server of ``dsn``; return its DSN.

    The demo never touches the user's own queue. Raises ``psycopg.Error`` when the role may
    not create databases.
    """
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    with psycopg.connect(dsn, autocommit=True) as conn:
        name = sql.Identifier(DEMO_DATABASE)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(name))
    return make_conninfo(dsn, dbname=DEMO_DATABASE)


def run_demo(
    server_dsn: str, settings: Settings, options: DemoOptions | None = None
) -> dict[str, Any]:
    """Create the demo database, migrate, start the sandbox, replay, work; return the report.

    Raises:
        psycopg.Error: the database failed; EmbeddedPostgresError is raised earlier by the
            caller resolving the DSN.
    """
    opts = options or DemoOptions()
    dsn = demo_database(server_dsn)
    migrate.upgrade(dsn)
    scale = opts.rate_scale
    sandbox = SandboxConfig(
        requests_per_minute=round(50 * scale),
        input_tokens_per_minute=round(40_000 * scale),
        output_tokens_per_minute=round(8_000 * scale),
        seconds_per_output_token=opts.seconds_per_output_token,
        seed=opts.seed,
    )
    with running_sandbox(sandbox) as base_url:
        demo_settings = settings.model_copy(
            update={
                "anthropic_base_url": base_url,
                "anthropic_api_key": SecretStr("sandbox-key"),
                "poll_interval_seconds": min(settings.poll_interval_seconds, 0.5),
            }
        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            since = queries.run(conn, "db_now")["now"]
        replay_stats = asyncio.run(_run(dsn, demo_settings, opts, since))
        with psycopg.connect(dsn, autocommit=True) as conn:
            report = collect_run_report(conn, since)
    report["replay"] = {
        "jobs": replay_stats.jobs,
        "elapsed_seconds": replay_stats.elapsed_seconds,
        "speedup": opts.speedup,
    }
    return report
