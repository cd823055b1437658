"""``pgqueue replay --against-sandbox``: a slice of a real trace through one queue, a worker and
the sandbox API, measured at the provider's limits. (``pgqueue demo``, the FIFO-vs-pgqueue
comparison, is :mod:`pgqueue.demo_compare`.)

Replays the first requests of the Azure LLM inference trace 2023 (CC-BY 4.0, Patel et al.,
"Splitwise", ISCA 2024) across eight tenants, one of them a runaway, against the local sandbox
with rate limits scaled up (``rate_scale`` × the defaults 50 RPM / 40k ITPM / 8k OTPM) so that
the demo finishes in well under two minutes, and prints latency per tier and work per tenant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from pydantic import SecretStr
from rich.console import Console

from pgqueue.db import migrate, queries
from pgqueue.models import Tier
from pgqueue.observability.report import collect_run_report
from pgqueue.progress import Phases
from pgqueue.replay import ReplayStats, replay_plan
from pgqueue.sandbox import SandboxConfig, running_sandbox
from pgqueue.scheduling.tiers import classify
from pgqueue.settings import Settings
from pgqueue.trace import PlannedJob, load_trace, plan_replay
from pgqueue.worker.runtime import Worker

log = logging.getLogger("pgqueue.demo")


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """Size of the demo: ``requests`` from the trace (``trace``: a CSV path, None for the
    bundled one), replayed ``speedup`` × faster, with ``concurrency`` jobs in flight and the
    provider's limits (sandbox and shared limiter alike) at ``rate_scale`` × the defaults
    50 RPM / 40k ITPM / 8k OTPM; each output token takes ``seconds_per_output_token``. The
    run works in a database of its own on the given server, ``database`` or by default
    ``pgqueue_replay_<random>``, dropped at the end (two runs on one server never meet)."""

    requests: int = 400
    speedup: float = 10.0
    concurrency: int = 16
    rate_scale: float = 10.0
    seconds_per_output_token: float = 0.002
    tenants: int = 8
    seed: int = 0
    trace: Path | None = None
    model: str = "claude-haiku-4-5"
    database: str | None = None


def offered_load(
    plan: list[PlannedJob], limits: tuple[int, int, int]
) -> dict[str, dict[str, float]]:
    """Per tier, what its jobs asked for while they arrived, as shares of the per-minute
    ``limits`` (requests, input, output tokens): ``{tier: {"requests", "input_tokens",
    "output_tokens"}}``, over the span of the arrivals (at least one second). A tier above 1.0
    on a limit cannot meet its SLO under any schedule: its own jobs queue behind each other."""
    minutes = max(plan[-1].at_seconds if plan else 0.0, 1.0) / 60.0
    offered: dict[str, dict[str, float]] = {}
    for job in plan:
        tier = classify(job.origin, job.sla_seconds, demoted=False).value
        row = offered.setdefault(tier, {"requests": 0.0, "input_tokens": 0.0, "output_tokens": 0.0})
        row["requests"] += 1 / minutes / limits[0]
        row["input_tokens"] += job.input_tokens / minutes / limits[1]
        row["output_tokens"] += job.output_tokens / minutes / limits[2]
    return {tier.value: offered[tier.value] for tier in Tier if tier.value in offered}


def _plan(options: DemoOptions) -> list[PlannedJob]:
    return plan_replay(
        load_trace(options.trace, limit=options.requests),
        tenants=options.tenants,
        speedup=options.speedup,
        seed=options.seed,
        model=options.model,
    )


async def _run(
    dsn: str,
    settings: Settings,
    options: DemoOptions,
    since: datetime,
    phases: Phases,
    *,
    plan: list[PlannedJob],
) -> ReplayStats:
    worker = Worker(dsn, settings, concurrency=options.concurrency, seed=options.seed)
    work = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        phases.phase(f"replaying {len(plan)} requests at {options.speedup:g}×", total=len(plan))
        stats = await replay_plan(
            dsn, plan, settings, on_batch=lambda n: phases.update(n, f"{n} enqueued")
        )
        phases.phase("waiting for the worker to finish them", total=len(plan))
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            while True:
                row = await queries.arun(conn, "report_unfinished_since", {"since": since})
                phases.update(len(plan) - int(row["unfinished"]))
                if row["unfinished"] == 0 or work.done():
                    break
                await asyncio.sleep(0.25)
    finally:
        worker.request_stop()
        with contextlib.suppress(asyncio.CancelledError):
            await work
    return stats


def scaled_limits(rate_scale: float) -> tuple[int, int, int]:
    """The provider's limits at ``rate_scale`` × the defaults (50 requests, 40,000 input and
    8,000 output tokens per minute), rounded, each at least 1: the sandbox takes whole
    positive numbers (found by a tester: the documented minimum scale, 0.01, gave 0 requests
    per minute and a traceback)."""
    return (
        max(1, round(50 * rate_scale)),
        max(1, round(40_000 * rate_scale)),
        max(1, round(8_000 * rate_scale)),
    )


def demo_database(dsn: str, database: str) -> str:
    """Drop and recreate ``database`` on the server of ``dsn``; return its DSN.

    The demo never touches the user's own queue. Raises ``psycopg.Error`` when the role may
    not create databases.
    """
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    with psycopg.connect(dsn, autocommit=True) as conn:
        name = sql.Identifier(database)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(name))
    return make_conninfo(dsn, dbname=database)


def quota_use(
    sends: list[tuple[float, float, float]], limits: tuple[float, float, float]
) -> dict[str, Any]:
    """How much of the provider's quota a backlogged run used.

    ``sends`` are (time in seconds, input tokens, output tokens) of the requests the provider
    admitted, ``limits`` the per-minute limits (requests, input tokens, output tokens). Over
    the window from the first to the last send (T seconds), a token bucket admits at most
    ``capacity + capacity / 60 × T`` (a full bucket, then its refill), so use = sent / that;
    1.0 means not a token of quota was left unused. Returns the window and the use per
    quantity; the binding quantity is the largest.
    """
    if len(sends) < 2:
        return {
            "window_seconds": 0.0,
            "requests": None,
            "input_tokens": None,
            "output_tokens": None,
        }
    times = sorted(t for t, _i, _o in sends)
    window = times[-1] - times[0]
    sent = (float(len(sends)), sum(i for _t, i, _o in sends), sum(o for _t, _i, o in sends))
    use = [s / (cap + cap / 60.0 * window) for s, cap in zip(sent, limits, strict=True)]
    return {
        "window_seconds": window,
        "requests": use[0],
        "input_tokens": use[1],
        "output_tokens": use[2],
    }


def _backpressure(
    conn: psycopg.Connection[Any],
    since: datetime,
    stats: dict[str, Any],
    limits: tuple[float, float, float],
) -> dict[str, Any]:
    rows = queries.run(conn, "report_backpressure_jobs", {"since": since})
    retried = sum(r["throttle_retries"] for r in rows)
    again = sum(max(0, r["throttle_retries"] - 1) for r in rows)
    sends = [
        (float(r["started_epoch"]), float(r["input_tokens"] or 0), float(r["output_tokens"] or 0))
        for r in rows
        if r["state"] == "succeeded"
    ]
    requests = int(stats.get("requests", 0))
    throttled = int(stats.get("429", 0)) + int(stats.get("529", 0))
    return {
        "requests": requests,
        "http_429": int(stats.get("429", 0)),
        "http_529": int(stats.get("529", 0)),
        "share_429": (throttled / requests) if requests else 0.0,
        "reoccurrence": (again / retried) if retried else 0.0,
        "quota_use": quota_use(sends, limits),
    }


def _sandbox_stats(base_url: str) -> dict[str, Any]:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{base_url}/_sandbox/stats", timeout=10) as answer:
        data: dict[str, Any] = json.loads(answer.read())
    return data


def run_demo(
    server_dsn: str,
    settings: Settings,
    options: DemoOptions | None = None,
    phases: Phases | None = None,
) -> dict[str, Any]:
    """Create the demo database, migrate, start the sandbox, replay, work; return the report:
    per tier latency, per tenant work, and backpressure (requests, 429 share, re-occurrence,
    quota use). ``phases`` shows the progress (none by default).

    Raises:
        psycopg.Error: the database failed; EmbeddedPostgresError is raised earlier by the
            caller resolving the DSN.
    """
    opts = options or DemoOptions()
    database = opts.database or f"pgqueue_replay_{uuid.uuid4().hex[:10]}"
    shown = phases or Phases(Console(quiet=True))
    shown.phase(f"creating the database {database} and migrating it")
    dsn = demo_database(server_dsn, database)
    try:
        return _run_in(dsn, settings, opts, shown)
    finally:
        _drop(server_dsn, database)


def _drop(server_dsn: str, database: str) -> None:
    from psycopg import sql

    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )


def _run_in(dsn: str, settings: Settings, opts: DemoOptions, phases: Phases) -> dict[str, Any]:
    migrate.upgrade(dsn)
    limits = scaled_limits(opts.rate_scale)
    sandbox = SandboxConfig(
        requests_per_minute=limits[0],
        input_tokens_per_minute=limits[1],
        output_tokens_per_minute=limits[2],
        seconds_per_output_token=opts.seconds_per_output_token,
        seed=opts.seed,
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        since = queries.run(conn, "db_now")["now"]
        queries.run(
            conn,
            "ratelimit_set",
            {"model": opts.model, "rpm": limits[0], "itpm": limits[1], "otpm": limits[2]},
        )
    with running_sandbox(sandbox) as base_url:
        demo_settings = settings.model_copy(
            update={
                "anthropic_base_url": base_url,
                "anthropic_api_key": SecretStr("sandbox-key"),
                "poll_interval_seconds": min(settings.poll_interval_seconds, 0.5),
            }
        )
        plan = _plan(opts)
        replay_stats = asyncio.run(_run(dsn, demo_settings, opts, since, phases, plan=plan))
        phases.phase("collecting the report")
        stats = _sandbox_stats(base_url)
        with psycopg.connect(dsn, autocommit=True) as conn:
            report = collect_run_report(conn, since)
            report["backpressure"] = _backpressure(conn, since, stats, limits)
    report["offered"] = offered_load(plan, limits)
    report["replay"] = {
        "jobs": replay_stats.jobs,
        "elapsed_seconds": replay_stats.elapsed_seconds,
        "speedup": opts.speedup,
        "limits_per_minute": {
            "requests": limits[0],
            "input_tokens": limits[1],
            "output_tokens": limits[2],
        },
    }
    return report
