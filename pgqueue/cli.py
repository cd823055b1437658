"""The ``pgqueue`` command line: thin typer commands that parse, call one function, format."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import psycopg
import typer
from rich.console import Console
from rich.table import Table

from pgqueue.errors import PgqueueError
from pgqueue.settings import Settings, load_settings

app = typer.Typer(
    help="pgqueue: a Postgres-native job queue for rate-limited LLM APIs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
tenants_app = typer.Typer(help="List and configure tenants (plan, quantum, daily budget).")
app.add_typer(tenants_app, name="tenants")
console = Console()
err_console = Console(stderr=True)

DsnOption = Annotated[
    str | None,
    typer.Option("--dsn", help="Postgres DSN; default PGQUEUE_DSN, else the embedded server."),
]


def _settings(**overrides: Any) -> Settings:
    try:
        return load_settings(**overrides)
    except ValueError as exc:
        err_console.print(f"[red]invalid settings:[/red] {exc}")
        raise typer.Exit(2) from None


def _dsn(settings: Settings, dsn: str | None) -> str:
    from pgqueue.db.connect import resolve_dsn

    try:
        return resolve_dsn(settings, dsn)
    except PgqueueError as exc:
        err_console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None


def _fail(exc: Exception, code: int = 1) -> typer.Exit:
    err_console.print(f"[red]{type(exc).__name__}:[/red] {exc}")
    return typer.Exit(code)


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO.")] = False,
) -> None:
    """Configure logging for every command."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@app.command()
def migrate(dsn: DsnOption = None) -> None:
    """Create or upgrade the pgqueue schema (alembic; safe to run concurrently)."""
    from pgqueue.db import migrate as m

    settings = _settings()
    target = _dsn(settings, dsn)
    m.upgrade(target)
    console.print(f"pgqueue schema at revision {m.head_revision()}")


@app.command()
def work(
    dsn: DsnOption = None,
    concurrency: Annotated[int | None, typer.Option(min=1, help="Jobs in flight.")] = None,
    burst: Annotated[bool, typer.Option(help="Exit when nothing is left to run.")] = False,
    app_spec: Annotated[
        str | None, typer.Option("--app", help="module:attribute of a pgqueue.Registry.")
    ] = None,
    poll_interval: Annotated[
        float | None, typer.Option(help="Seconds between polls (NOTIFY wakes sooner).")
    ] = None,
    listen: Annotated[
        bool, typer.Option(help="Use LISTEN/NOTIFY; --no-listen polls only (PgBouncer).")
    ] = True,
) -> None:
    """Run a worker: claim jobs fairly, call the provider, record outcomes."""
    from pgqueue.handlers.registry import Registry, load_app
    from pgqueue.worker.runtime import Worker

    settings = _settings(poll_interval_seconds=poll_interval)
    target = _dsn(settings, dsn)
    try:
        registry = load_app(app_spec) if app_spec else Registry()
        worker = Worker(
            target, settings, registry, concurrency=concurrency, burst=burst, listen=listen
        )
        stats = asyncio.run(worker.run())
    except PgqueueError as exc:
        raise _fail(exc) from None
    done = ", ".join(f"{k} {v}" for k, v in sorted(stats.outcomes.items())) or "nothing"
    console.print(f"worker {worker.worker_id} stopped: claimed {stats.claimed} ({done})")


@app.command()
def enqueue(
    tenant: Annotated[str, typer.Argument(help="Tenant id.")],
    origin: Annotated[str, typer.Option(help="user_action | scheduled | batch_job")] = "scheduled",
    sla_seconds: Annotated[float | None, typer.Option(help="SLA in seconds; none = batch.")] = None,
    prompt: Annotated[str | None, typer.Option(help="User message text.")] = None,
    payload: Annotated[
        str | None, typer.Option(help="Messages API parameters as JSON, or @file.json.")
    ] = None,
    model: Annotated[str, typer.Option(help="Model, with --prompt.")] = "claude-haiku-4-5",
    max_tokens: Annotated[int, typer.Option(help="max_tokens, with --prompt.")] = 256,
    kind: Annotated[str, typer.Option(help="Handler kind.")] = "anthropic.messages",
    dsn: DsnOption = None,
) -> None:
    """Enqueue one job and print its id."""
    import pgqueue

    if payload is not None:
        raw = Path(payload[1:]).read_text(encoding="utf-8") if payload.startswith("@") else payload
        try:
            body: Any = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _fail(pgqueue.InvalidPayload(f"--payload is not JSON: {exc}"), 2) from None
    elif prompt is not None:
        body = {
            "model": model,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": prompt}],
        }
    else:
        err_console.print("give --prompt TEXT or --payload JSON")
        raise typer.Exit(2)
    settings = _settings()
    target = _dsn(settings, dsn)
    try:
        with psycopg.connect(target) as conn:
            job_id = pgqueue.enqueue(
                conn,
                tenant_id=tenant,
                origin=origin,
                payload=body,
                sla_seconds=sla_seconds,
                kind=kind,
                settings=settings,
            )
    except pgqueue.UsageError as exc:
        raise _fail(exc, 2) from None
    console.print(job_id)


@app.command()
def status(
    dsn: DsnOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Queue depth by tier and state, oldest queued age, top tenants."""
    from pgqueue.observability.report import collect_status, render_status

    settings = _settings()
    target = _dsn(settings, dsn)
    with psycopg.connect(target, autocommit=True) as conn:
        data = collect_status(conn)
    if as_json:
        sys.stdout.write(json.dumps(data, default=str) + "\n")
    else:
        render_status(data, console)


@tenants_app.command("list")
def tenants_list(dsn: DsnOption = None, limit: int = 100) -> None:
    """List tenants with plan, quantum, budget, queued jobs and demotion."""
    from pgqueue.db import queries

    settings = _settings()
    with psycopg.connect(_dsn(settings, dsn), autocommit=True) as conn:
        rows = queries.run(conn, "tenant_list", {"limit": limit})
    table = Table(title="Tenants")
    for col in ("tenant", "plan", "quantum", "daily budget", "queued", "demoted"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["tenant_id"],
            r["plan"],
            str(r["quantum"] or "default"),
            str(r["daily_token_budget"] or "default"),
            str(r["queued"]),
            "yes" if r["demoted"] else "",
        )
    console.print(table)


@tenants_app.command("set")
def tenants_set(
    tenant: str,
    plan: Annotated[str | None, typer.Option(help="Plan name, e.g. free or pro.")] = None,
    quantum: Annotated[
        float | None, typer.Option(min=0.001, help="DRR quantum, cost units.")
    ] = None,
    daily_budget: Annotated[
        int | None, typer.Option(min=0, help="Daily input-token budget.")
    ] = None,
    dsn: DsnOption = None,
) -> None:
    """Create or update a tenant."""
    from pgqueue.db import queries
    from pgqueue.validation import MAX_TENANT_ID_CHARS

    if not tenant or len(tenant) > MAX_TENANT_ID_CHARS or "\x00" in tenant:
        err_console.print(f"tenant id must be 1 to {MAX_TENANT_ID_CHARS} characters")
        raise typer.Exit(2)
    settings = _settings()
    with psycopg.connect(_dsn(settings, dsn), autocommit=True) as conn:
        row = queries.run(
            conn,
            "tenant_upsert",
            {
                "tenant_id": tenant,
                "plan": plan,
                "quantum": quantum,
                "daily_token_budget": daily_budget,
            },
        )
    console.print(row)


@app.command()
def retry(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant.")] = None,
    tier: Annotated[str | None, typer.Option(help="critical | standard | batch")] = None,
    reason: Annotated[
        str | None, typer.Option(help="Substring of last_error (case-insensitive).")
    ] = None,
    since: Annotated[
        datetime | None, typer.Option(help="Failed at or after (ISO 8601, UTC if no zone).")
    ] = None,
    until: Annotated[datetime | None, typer.Option(help="Failed before (ISO 8601).")] = None,
    dsn: DsnOption = None,
) -> None:
    """Re-queue failed jobs in bulk, with fresh attempt counters."""
    from pgqueue.admin import requeue_failed

    settings = _settings()
    since_utc = since.replace(tzinfo=UTC) if since and since.tzinfo is None else since
    until_utc = until.replace(tzinfo=UTC) if until and until.tzinfo is None else until
    try:
        with psycopg.connect(_dsn(settings, dsn)) as conn:
            ids = requeue_failed(
                conn, tenant_id=tenant, tier=tier, reason=reason, since=since_utc, until=until_utc
            )
    except PgqueueError as exc:
        raise _fail(exc, 2) from None
    console.print(f"re-queued {len(ids)} failed job(s)")


@app.command()
def sandbox(
    host: str = "127.0.0.1",
    port: int = 8765,
    rpm: Annotated[int, typer.Option(help="Requests per minute.")] = 50,
    itpm: Annotated[int, typer.Option(help="Input tokens per minute.")] = 40_000,
    otpm: Annotated[int, typer.Option(help="Output tokens per minute.")] = 8_000,
    overload_rate: Annotated[float, typer.Option(help="Share of requests answered 529.")] = 0.0,
    seconds_per_output_token: Annotated[
        float, typer.Option(help="Simulated generation time.")
    ] = 0.0,
    fail_first_n: Annotated[
        int, typer.Option(help="Answer the first N requests with --fail-status.")
    ] = 0,
    fail_status: int = 429,
    fail_retry_after: Annotated[
        str | None, typer.Option(help="retry-after of those answers.")
    ] = None,
    seed: int = 0,
) -> None:
    """Run the local Messages-API-compatible server (set ANTHROPIC_BASE_URL to it)."""
    from pgqueue.sandbox import SandboxConfig, serve

    try:
        config = SandboxConfig(
            requests_per_minute=rpm,
            input_tokens_per_minute=itpm,
            output_tokens_per_minute=otpm,
            overload_rate=overload_rate,
            seconds_per_output_token=seconds_per_output_token,
            fail_first_n=fail_first_n,
            fail_status=fail_status,
            fail_retry_after=fail_retry_after,
            seed=seed,
        )
    except ValueError as exc:
        raise _fail(exc, 2) from None
    err_console.print(
        f"sandbox on http://{host}:{port} — export ANTHROPIC_BASE_URL=http://{host}:{port}"
    )
    serve(config, host=host, port=port)


@app.command()
def replay(
    trace: Annotated[
        Path | None, typer.Argument(help="CSV trace; default: the bundled Azure trace.")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Replay the first N requests.")] = 1000,
    speedup: Annotated[float, typer.Option(help="Replay this many times faster.")] = 1.0,
    tenants: Annotated[int, typer.Option(help="Number of tenants (t00 is the runaway).")] = 8,
    seed: int = 0,
    dsn: DsnOption = None,
) -> None:
    """Enqueue a real trace at its recorded arrival times (run `pgqueue work` beside it)."""
    from pgqueue.replay import replay_plan
    from pgqueue.trace import load_trace, plan_replay, summarize_plan

    settings = _settings()
    target = _dsn(settings, dsn)
    try:
        plan = plan_replay(
            load_trace(trace, limit=limit), tenants=tenants, speedup=speedup, seed=seed
        )
    except PgqueueError as exc:
        raise _fail(exc, 2) from None
    console.print(f"replaying {len(plan)} requests over {plan[-1].at_seconds if plan else 0:.1f} s")
    stats = asyncio.run(replay_plan(target, plan, settings))
    console.print(summarize_plan(plan))
    console.print(
        f"enqueued {stats.jobs} jobs in {stats.batches} round trips over "
        f"{stats.elapsed_seconds:.1f} s (worst lag {stats.max_lag_seconds * 1000:.0f} ms)"
    )


@app.command()
def demo(
    requests: Annotated[int, typer.Option(min=1, help="Requests from the trace.")] = 400,
    speedup: Annotated[float, typer.Option(help="Replay speed-up.")] = 10.0,
    concurrency: Annotated[int, typer.Option(min=1)] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    dsn: DsnOption = None,
) -> None:
    """Embedded Postgres + sandbox API + a slice of a real trace + workers, then a summary."""
    from pgqueue.demo import DemoOptions, run_demo
    from pgqueue.observability.report import render_run_report

    settings = _settings()
    target = _dsn(settings, dsn)
    if not as_json:
        console.print(
            f"demo: replaying {requests} requests of the Azure LLM trace 2023 (CC-BY 4.0) "
            f"at {speedup}× against the local sandbox..."
        )
    report = run_demo(
        target, settings, DemoOptions(requests=requests, speedup=speedup, concurrency=concurrency)
    )
    if as_json:
        sys.stdout.write(json.dumps(report, default=str) + "\n")
    else:
        render_run_report(report, console, title="Demo")
