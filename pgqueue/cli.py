"""The ``pgqueue`` command line: thin typer commands that parse, call one function, format.

Every command goes through :func:`cli_errors`, so a user error prints one line and exits 2, an
environment problem (database unreachable, schema missing) prints one line and exits 1, and
neither shows a traceback.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import psycopg
import typer
from rich.console import Console
from rich.table import Table

from pgqueue.errors import AdmissionError, PgqueueError, UsageError
from pgqueue.settings import Settings, load_settings

app = typer.Typer(
    help="pgqueue: a Postgres-native job queue for rate-limited LLM APIs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
tenants_app = typer.Typer(help="List and configure tenants (plan, quantum, daily budget).")
app.add_typer(tenants_app, name="tenants")
limits_app = typer.Typer(help="The provider's rate limits per model, shared by all workers.")
app.add_typer(limits_app, name="limits")
admission_app = typer.Typer(help="Admission control: caps of queued jobs and tier policies.")
app.add_typer(admission_app, name="admission")
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

P = ParamSpec("P")
R = TypeVar("R")

DsnOption = Annotated[
    str | None,
    typer.Option("--dsn", help="Postgres DSN; default PGQUEUE_DSN, else the embedded server."),
]
_INT32_MAX = 2_147_483_647
_PLAN = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")


def _say(kind: str, message: str) -> None:
    from rich.markup import escape

    err_console.print(f"[red]{escape(kind)}:[/red] {escape(message)}", highlight=False)


def cli_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn the errors a user can meet into one line on stderr and an exit code.

    Exit 2: bad input (:class:`UsageError`, bad files, a malformed DSN). Exit 75 (EX_TEMPFAIL):
    admission control refused the job for now (:class:`AdmissionError`, e.g. ``QueueFull``);
    retry later. Exit 1: the environment (unreachable database, missing schema, any other
    pgqueue or database error).
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except UsageError as exc:
            _say(type(exc).__name__, str(exc))
            raise typer.Exit(2) from None
        except AdmissionError as exc:
            _say(type(exc).__name__, str(exc))
            raise typer.Exit(75) from None
        except PgqueueError as exc:
            _say(type(exc).__name__, str(exc))
            raise typer.Exit(1) from None
        except psycopg.OperationalError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            _say("cannot reach Postgres", first)
            raise typer.Exit(1) from None
        except (
            psycopg.errors.UndefinedTable,
            psycopg.errors.InvalidSchemaName,
            psycopg.errors.UndefinedFunction,
        ):
            _say("SchemaOutOfDate", "the pgqueue schema is missing here; run `pgqueue migrate`")
            raise typer.Exit(1) from None
        except psycopg.errors.NumericValueOutOfRange as exc:
            _say("InvalidArgument", exc.diag.message_primary or str(exc))
            raise typer.Exit(2) from None
        except psycopg.ProgrammingError as exc:
            _say("invalid DSN or query", str(exc).strip().splitlines()[0])
            raise typer.Exit(2) from None
        except psycopg.Error as exc:
            _say("database error", exc.diag.message_primary or str(exc))
            raise typer.Exit(1) from None
        except OSError as exc:
            _say(type(exc).__name__, str(exc))
            raise typer.Exit(2) from None

    return wrapper


def _settings(**overrides: Any) -> Settings:
    try:
        return load_settings(**overrides)
    except ValueError as exc:
        _say("invalid settings", str(exc))
        raise typer.Exit(2) from None


def _dsn(settings: Settings, dsn: str | None) -> str:
    from pgqueue.db.connect import resolve_dsn

    return resolve_dsn(settings, dsn)


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
@cli_errors
def migrate(dsn: DsnOption = None) -> None:
    """Create or upgrade the pgqueue schema (alembic; safe to run concurrently)."""
    from pgqueue.db import migrate as m

    target = _dsn(_settings(), dsn)
    m.upgrade(target)
    console.print(f"pgqueue schema at revision {m.head_revision()}")


@app.command()
@cli_errors
def grant(dsn: DsnOption = None) -> None:
    """Create the roles pgqueue_producer / _worker / _admin, grant them, turn on tenant scoping
    and row-level security (idempotent; run after `pgqueue migrate`)."""
    from pgqueue.db import queries

    with psycopg.connect(_dsn(_settings(), dsn), autocommit=True) as conn:
        queries.run(conn, "security_grant")
    console.print(
        "granted: pgqueue_producer (enqueue, reads its tenant's jobs), pgqueue_worker, "
        "pgqueue_admin; row-level security on pgqueue.jobs and pgqueue.usage_daily"
    )


@app.command()
@cli_errors
def dsn(
    show_password: Annotated[
        bool, typer.Option(help="Print a configured password instead of ****.")
    ] = False,
) -> None:
    """Print the DSN commands use (starting the embedded server if that is the default)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    target = _dsn(_settings(), None)
    if not show_password and conninfo_to_dict(target).get("password"):
        target = make_conninfo(target, password="****")
    sys.stdout.write(target + "\n")


@app.command()
@cli_errors
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
    metrics_port: Annotated[
        int | None,
        typer.Option(min=1, max=65535, help="Serve this worker's pgqueue_* metrics here."),
    ] = None,
) -> None:
    """Run a worker: claim jobs fairly, call the provider, record outcomes."""
    from pgqueue.handlers.registry import Registry, load_app
    from pgqueue.worker.runtime import Worker

    settings = _settings(poll_interval_seconds=poll_interval)
    target = _dsn(settings, dsn)
    registry = load_app(app_spec) if app_spec else Registry()
    if metrics_port is not None:
        from prometheus_client import start_http_server

        from pgqueue.observability.metrics import WORKER_REGISTRY

        start_http_server(metrics_port, registry=WORKER_REGISTRY)
    worker = Worker(target, settings, registry, concurrency=concurrency, burst=burst, listen=listen)
    stats = asyncio.run(worker.run())
    done = ", ".join(f"{k} {v}" for k, v in sorted(stats.outcomes.items())) or "nothing"
    console.print(f"worker {worker.worker_id} stopped: claimed {stats.claimed} ({done})")


def _read_payload(payload: str) -> Any:
    import pgqueue

    raw = Path(payload[1:]).read_text(encoding="utf-8") if payload.startswith("@") else payload
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise pgqueue.InvalidPayload(f"--payload is not JSON: {exc}") from None


@app.command()
@cli_errors
def metrics(
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port of /metrics.")] = 9464,
    host: str = "0.0.0.0",
    refresh_seconds: Annotated[
        float, typer.Option(min=0.0, help="Read the database at most this often.")
    ] = 30.0,
    top_tenants: Annotated[
        int, typer.Option(min=1, help="Per-tenant labels kept; the rest is 'other'.")
    ] = 20,
    dsn: DsnOption = None,
) -> None:
    """Serve the database-wide claude_* metrics (run ONE per database; workers add their own)."""
    import signal
    import threading

    from prometheus_client import start_http_server

    from pgqueue.observability.metrics import database_registry

    registry = database_registry(
        _dsn(_settings(), dsn), refresh_seconds=refresh_seconds, top_tenants=top_tenants
    )
    server, _thread = start_http_server(port, addr=host, registry=registry)
    err_console.print(f"metrics on http://{host}:{port}/metrics")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()


@app.command()
@cli_errors
def enqueue(
    tenant: Annotated[str, typer.Argument(help="Tenant id.")],
    origin: Annotated[str, typer.Option(help="user_action | scheduled | batch_job")] = "scheduled",
    sla_seconds: Annotated[float | None, typer.Option(help="SLA in seconds; none = batch.")] = None,
    prompt: Annotated[str | None, typer.Option(help="User message text.")] = None,
    payload: Annotated[
        str | None, typer.Option(help="Messages API parameters as JSON, or @file.json.")
    ] = None,
    model: Annotated[str, typer.Option(help="Model, with --prompt.")] = "claude-haiku-4-5",
    max_tokens: Annotated[
        int, typer.Option(min=1, max=_INT32_MAX, help="max_tokens, with --prompt.")
    ] = 256,
    kind: Annotated[str, typer.Option(help="Handler kind.")] = "anthropic.messages",
    dsn: DsnOption = None,
) -> None:
    """Enqueue one job and print its id."""
    import pgqueue

    if (prompt is None) == (payload is None):
        raise pgqueue.InvalidArgument("give exactly one of --prompt TEXT or --payload JSON")
    body: Any
    if payload is not None:
        body = _read_payload(payload)
    else:
        body = {
            "model": model,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": prompt}],
        }
    settings = _settings()
    with psycopg.connect(_dsn(settings, dsn)) as conn:
        job_id = pgqueue.enqueue(
            conn,
            tenant_id=tenant,
            origin=origin,
            payload=body,
            sla_seconds=sla_seconds,
            kind=kind,
            settings=settings,
        )
    console.print("dropped (tier full, policy drop)" if job_id is None else job_id)


@app.command()
@cli_errors
def status(
    dsn: DsnOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    window: Annotated[
        float, typer.Option(min=1.0, help="Latency and fairness window, seconds.")
    ] = 300.0,
    watch: Annotated[
        float | None, typer.Option(min=0.5, help="Refresh every N seconds until Ctrl-C.")
    ] = None,
) -> None:
    """Depth per tier, p50/p99 against the SLOs, Jain's index, demotions, top tenants, 429s."""
    import time

    from rich.live import Live

    from pgqueue.observability.report import collect_status, render_status

    target = _dsn(_settings(), dsn)

    def snapshot() -> dict[str, Any]:
        with psycopg.connect(target, autocommit=True) as conn:
            return collect_status(conn, window_seconds=window)

    if as_json:
        sys.stdout.write(json.dumps(snapshot(), default=str) + "\n")
        return
    if watch is None:
        render_status(snapshot(), console)
        return
    with Live(console=console, auto_refresh=False) as live:
        try:
            while True:
                frame = Console(record=True, width=console.width)
                with frame.capture():
                    render_status(snapshot(), frame)
                live.update(frame.export_text(styles=True), refresh=True)
                time.sleep(watch)
        except KeyboardInterrupt:
            return


@tenants_app.command("list")
@cli_errors
def tenants_list(
    dsn: DsnOption = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many tenants.")] = 100,
) -> None:
    """List tenants with plan, quantum, budget, queued jobs and demotion."""
    from pgqueue.db import queries

    with psycopg.connect(_dsn(_settings(), dsn), autocommit=True) as conn:
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
@cli_errors
def tenants_set(
    tenant: str,
    plan: Annotated[str | None, typer.Option(help="Plan name, e.g. free or pro.")] = None,
    quantum: Annotated[
        float | None, typer.Option(min=0.001, max=1e9, help="DRR quantum, cost units.")
    ] = None,
    daily_budget: Annotated[
        int | None, typer.Option(min=0, max=2**62, help="Daily input-token budget.")
    ] = None,
    dsn: DsnOption = None,
) -> None:
    """Create or update a tenant."""
    from pgqueue.db import queries
    from pgqueue.errors import InvalidArgument, InvalidTenant
    from pgqueue.validation import MAX_TENANT_ID_CHARS

    if not tenant or len(tenant) > MAX_TENANT_ID_CHARS or "\x00" in tenant:
        raise InvalidTenant(f"tenant id must be 1 to {MAX_TENANT_ID_CHARS} characters")
    if plan is not None and not _PLAN.match(plan):
        raise InvalidArgument("plan must be 1 to 32 letters, digits, '_', '.' or '-'")
    with psycopg.connect(_dsn(_settings(), dsn), autocommit=True) as conn:
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


@limits_app.command("list")
@cli_errors
def limits_list(dsn: DsnOption = None) -> None:
    """Per model: limits per minute, what is available now, cooldown, estimate ratio."""
    from pgqueue.db import queries

    with psycopg.connect(_dsn(_settings(), dsn), autocommit=True) as conn:
        rows = queries.run(conn, "ratelimit_list")
    table = Table(title="Provider rate limits (per minute; available now)")
    for col in ("model", "requests", "input tokens", "output tokens", "cooldown", "est. ratio"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in rows:
        table.add_row(
            r["model"],
            f"{r['requests_available']:.0f} / {r['requests_per_minute']:.0f}",
            f"{r['input_tokens_available']:.0f} / {r['input_tokens_per_minute']:.0f}",
            f"{r['output_tokens_available']:.0f} / {r['output_tokens_per_minute']:.0f}",
            str(r["cooldown_until"]) if r["cooling_down"] else "",
            f"{r['input_estimate_ratio']:.2f}",
        )
    console.print(table)


@limits_app.command("set")
@cli_errors
def limits_set(
    model: str,
    rpm: Annotated[float, typer.Option(min=1, max=1e9, help="Requests per minute.")] = 50,
    itpm: Annotated[float, typer.Option(min=1, max=1e12, help="Input tokens per minute.")] = 40_000,
    otpm: Annotated[float, typer.Option(min=1, max=1e12, help="Output tokens per minute.")] = 8_000,
    dsn: DsnOption = None,
) -> None:
    """Set a model's limits (the provider's answer headers correct them later)."""
    from pgqueue.db import queries
    from pgqueue.errors import InvalidArgument

    if not model or len(model) > 256 or "\x00" in model:
        raise InvalidArgument("model must be 1 to 256 characters")
    with psycopg.connect(_dsn(_settings(), dsn), autocommit=True) as conn:
        row = queries.run(
            conn, "ratelimit_set", {"model": model, "rpm": rpm, "itpm": itpm, "otpm": otpm}
        )
    console.print(row)


@app.command()
@cli_errors
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
    all_failed: Annotated[
        bool, typer.Option("--all", help="Re-queue every failed job (no filter).")
    ] = False,
    dsn: DsnOption = None,
) -> None:
    """Re-queue failed jobs in bulk, with fresh attempt counters."""
    from pgqueue.admin import requeue_failed
    from pgqueue.errors import InvalidArgument

    if not all_failed and all(v is None for v in (tenant, tier, reason, since, until)):
        raise InvalidArgument(
            "give a filter (--tenant, --tier, --reason, --since, --until) or --all"
        )
    since_utc = since.replace(tzinfo=UTC) if since and since.tzinfo is None else since
    until_utc = until.replace(tzinfo=UTC) if until and until.tzinfo is None else until
    with psycopg.connect(_dsn(_settings(), dsn)) as conn:
        ids = requeue_failed(
            conn, tenant_id=tenant, tier=tier, reason=reason, since=since_utc, until=until_utc
        )
    console.print(f"re-queued {len(ids)} failed job(s)")


@app.command()
@cli_errors
def prune(
    older_than: Annotated[
        float, typer.Option(min=0.0, help="Delete jobs finished more than this many seconds ago.")
    ] = 7 * 86_400.0,
    dsn: DsnOption = None,
) -> None:
    """Retention: delete finished jobs (queued and running jobs are never touched)."""
    from pgqueue.admin import prune_finished

    with psycopg.connect(_dsn(_settings(), dsn), autocommit=True) as conn:
        deleted = prune_finished(conn, older_than_seconds=older_than)
    console.print(f"deleted {deleted} finished job(s)")


@app.command()
@cli_errors
def sandbox(
    host: str = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8765,
    rpm: Annotated[int, typer.Option(min=1, help="Requests per minute.")] = 50,
    itpm: Annotated[int, typer.Option(min=1, help="Input tokens per minute.")] = 40_000,
    otpm: Annotated[int, typer.Option(min=1, help="Output tokens per minute.")] = 8_000,
    overload_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of requests answered 529.")
    ] = 0.0,
    seconds_per_output_token: Annotated[
        float, typer.Option(min=0.0, help="Simulated generation time.")
    ] = 0.0,
    fail_first_n: Annotated[
        int, typer.Option(min=0, help="Answer the first N requests with --fail-status.")
    ] = 0,
    fail_status: int = 429,
    fail_retry_after: Annotated[
        str | None, typer.Option(help="retry-after of those answers.")
    ] = None,
    seed: int = 0,
) -> None:
    """Run the local Messages-API-compatible server (set ANTHROPIC_BASE_URL to it)."""
    from pgqueue.errors import InvalidArgument
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
        raise InvalidArgument(str(exc)) from None
    err_console.print(
        f"sandbox on http://{host}:{port} — export ANTHROPIC_BASE_URL=http://{host}:{port}"
    )
    serve(config, host=host, port=port)


@app.command()
@cli_errors
def replay(
    trace: Annotated[
        Path | None, typer.Argument(help="CSV trace; default: the bundled Azure trace.")
    ] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Replay the first N requests.")] = 1000,
    speedup: Annotated[float, typer.Option(min=0.01, help="Replay this many times faster.")] = 1.0,
    tenants: Annotated[int, typer.Option(min=1, help="Tenants (t00 is the runaway).")] = 8,
    seed: int = 0,
    against_sandbox: Annotated[
        bool,
        typer.Option(
            help="Also start the sandbox API and workers (in a database of their own) and "
            "report latency, 429s, re-occurrence and quota use."
        ),
    ] = False,
    rate_scale: Annotated[
        float,
        typer.Option(min=0.01, help="With --against-sandbox: limits × 50 RPM/40k ITPM/8k OTPM."),
    ] = 1.0,
    concurrency: Annotated[int, typer.Option(min=1, help="With --against-sandbox.")] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    dsn: DsnOption = None,
) -> None:
    """Enqueue a real trace at its recorded arrival times (run `pgqueue work` beside it), or
    measure the whole path against the sandbox with --against-sandbox."""
    from pgqueue.replay import replay_plan
    from pgqueue.trace import load_trace, plan_replay, summarize_plan

    settings = _settings()
    target = _dsn(settings, dsn)
    if against_sandbox:
        from pgqueue.demo import DemoOptions, run_demo
        from pgqueue.observability.report import render_run_report

        options = DemoOptions(
            requests=limit or 1000,
            speedup=speedup,
            concurrency=concurrency,
            rate_scale=rate_scale,
            tenants=tenants,
            seed=seed,
            trace=trace,
        )
        report = run_demo(target, settings, options)
        if as_json:
            sys.stdout.write(json.dumps(report, default=str) + "\n")
        else:
            render_run_report(report, console, title="Replay")
        return
    plan = plan_replay(load_trace(trace, limit=limit), tenants=tenants, speedup=speedup, seed=seed)
    span = plan[-1].at_seconds if plan else 0.0
    console.print(f"replaying {len(plan)} requests over {span:.1f} s")
    stats = asyncio.run(replay_plan(target, plan, settings))
    summary = summarize_plan(plan)
    table = Table(title="Replayed per tenant")
    for col in ("tenant", "jobs", "input tokens", "output tokens"):
        table.add_column(col, justify="left" if col == "tenant" else "right")
    for tenant_id, row in sorted(summary.get("tenants", {}).items()):
        table.add_row(
            tenant_id,
            str(row.get("jobs", "")),
            f"{row.get('input_tokens', 0):,}",
            f"{row.get('output_tokens', 0):,}",
        )
    console.print(table)
    console.print(
        f"enqueued {stats.jobs} jobs in {stats.batches} round trips over "
        f"{stats.elapsed_seconds:.1f} s (worst lag {stats.max_lag_seconds * 1000:.0f} ms)"
    )


@app.command()
@cli_errors
def demo(
    requests: Annotated[int, typer.Option(min=1, help="Requests from the trace.")] = 400,
    speedup: Annotated[float, typer.Option(min=0.01, help="Replay speed-up.")] = 10.0,
    concurrency: Annotated[int, typer.Option(min=1)] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    dsn: DsnOption = None,
) -> None:
    """Embedded Postgres + sandbox API + a slice of a real trace + workers, then a summary.

    The demo works in its own database (``pgqueue_demo``, recreated on each run) on the same
    server, so it never touches your queue.
    """
    from pgqueue.demo import DemoOptions, run_demo
    from pgqueue.observability.report import render_run_report

    settings = _settings()
    target = _dsn(settings, dsn)
    if not as_json:
        console.print(
            f"demo: replaying {requests} requests of the Azure LLM trace 2023 (CC-BY 4.0) "
            f"at {speedup}× against the local sandbox..."
        )
    options = DemoOptions(requests=requests, speedup=speedup, concurrency=concurrency)
    report = run_demo(target, settings, options)
    if as_json:
        sys.stdout.write(json.dumps(report, default=str) + "\n")
    else:
        render_run_report(report, console, title="Demo")


@app.command()
@cli_errors
def bench(
    jobs: Annotated[int, typer.Option(min=1, help="Jobs per claim+complete run.")] = 20_000,
    procs: Annotated[str, typer.Option(help="Worker process counts, comma-separated.")] = "1,2,4",
    concurrency: Annotated[int, typer.Option(min=1, help="Slots per worker process.")] = 10,
    repeats: Annotated[int, typer.Option(min=1, help="Interleaved runs per measurement.")] = 3,
    single_jobs: Annotated[int, typer.Option(min=1, help="Jobs per single-enqueue run.")] = 2_000,
    bulk_jobs: Annotated[int, typer.Option(min=1, help="Jobs per bulk-enqueue run.")] = 20_000,
    batch: Annotated[int, typer.Option(min=1, help="Jobs per bulk statement.")] = 1_000,
    wake_samples: Annotated[int, typer.Option(min=1, help="Idle wake-up samples.")] = 200,
    peer: Annotated[
        str | None,
        typer.Option(help="Also measure a peer: pgqueuer (pip install 'pgqueue[bench]')."),
    ] = None,
    peer_batch: Annotated[int, typer.Option(min=1, help="The peer's dequeue batch size.")] = 10,
    only: Annotated[
        str | None, typer.Option(help="Comma-separated parts: enqueue, consume, wakeup.")
    ] = None,
    json_out: Annotated[Path | None, typer.Option(help="Write the report as JSON here.")] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG chart here (needs matplotlib).")
    ] = None,
    dsn: DsnOption = None,
) -> None:
    """No-op throughput and wake-up latency vs a plain SKIP LOCKED queue, in scratch databases.

    Ratios measured in one run on the same server are the result; absolute jobs/s depend on
    the machine. Scratch databases (pgq_bench_*) are dropped at the end.
    """
    from pgqueue import bench as b

    options = b.BenchOptions(
        jobs=jobs,
        procs=b.parse_int_list(procs, "--procs"),
        concurrency=concurrency,
        repeats=repeats,
        single_jobs=single_jobs,
        bulk_jobs=bulk_jobs,
        batch=batch,
        wake_samples=wake_samples,
        peer=peer,
        peer_batch=peer_batch,
        parts=tuple(x.strip() for x in only.split(",")) if only else b.PARTS,
    )
    options.check()
    target = _dsn(_settings(), dsn)
    report = b.run(target, options, progress=lambda msg: err_console.print(msg, highlight=False))
    for table in b.render(report):
        console.print(table)
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        err_console.print(f"wrote {json_out}")
    if plot is not None:
        if b.plot(report, plot):
            err_console.print(f"wrote {plot}")
        else:
            err_console.print(
                "matplotlib is not installed (pip install 'pgqueue[bench]'); no chart"
            )


@admission_app.command("show")
@cli_errors
def admission_show(
    dsn: DsnOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Per tier: queued jobs (exact counters), caps, policy and jobs dropped so far."""
    from pgqueue.admission import admission_status

    with psycopg.connect(_dsn(_settings(), dsn), autocommit=True) as conn:
        rows = admission_status(conn)
    if as_json:
        sys.stdout.write(json.dumps(rows, default=str) + "\n")
        return
    table = Table(title="Admission control")
    for col in ("tier", "queued", "max queued", "per tenant", "policy", "dropped"):
        table.add_column(col, justify="left" if col in ("tier", "policy") else "right")
    for r in rows:
        table.add_row(
            r["tier"],
            str(r["queued"]),
            "-" if r["max_queued"] is None else str(r["max_queued"]),
            "-" if r["tenant_max_queued"] is None else str(r["tenant_max_queued"]),
            r["policy"],
            str(r["dropped"]),
        )
    console.print(table)


@admission_app.command("set")
@cli_errors
def admission_set(
    tier: Annotated[str, typer.Argument(help="critical | standard | batch")],
    max_queued: Annotated[
        int | None, typer.Option(min=0, help="Cap of the tier's queued jobs; omit: no cap.")
    ] = None,
    tenant_max_queued: Annotated[
        int | None, typer.Option(min=0, help="Cap of one tenant's queued jobs in the tier.")
    ] = None,
    policy: Annotated[
        str, typer.Option(help="reject | block | drop (never drop for critical).")
    ] = "reject",
    dsn: DsnOption = None,
) -> None:
    """Set a tier's caps and policy (caps not given are removed)."""
    from pgqueue.admission import set_admission

    with psycopg.connect(_dsn(_settings(), dsn), autocommit=True) as conn:
        set_admission(
            conn, tier, max_queued=max_queued, tenant_max_queued=tenant_max_queued, policy=policy
        )
    console.print(
        f"{tier}: max_queued={max_queued} tenant_max_queued={tenant_max_queued} policy={policy}"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


@app.command()
@cli_errors
def simulate(
    duration: Annotated[
        float, typer.Option(min=1.0, help="Total measured seconds, split over the scenarios.")
    ] = 20.0,
    strategies: Annotated[
        str, typer.Option(help="Comma list of fifo, weighted, probabilistic, strict.")
    ] = "fifo,weighted,probabilistic,strict",
    policies: Annotated[
        str, typer.Option(help="Normal-job policies: comma list of drop, block, reject.")
    ] = "drop,block,reject",
    urgent_share: Annotated[float, typer.Option(help="Share of urgent jobs.")] = 0.1,
    rate: Annotated[float, typer.Option(min=1.0, help="Jobs offered per second.")] = 150.0,
    workers: Annotated[int, typer.Option(min=1, help="Jobs in flight (worker slots).")] = 24,
    normal_cap: Annotated[
        int, typer.Option(min=0, help="Cap of queued normal jobs (the shared queue's, in fifo).")
    ] = 40,
    urgent_cap: Annotated[int, typer.Option(min=0, help="Cap of queued urgent jobs.")] = 20,
    seed: int = 42,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write urgent p95 per scenario to a PNG.")
    ] = None,
    dsn: DsnOption = None,
) -> None:
    """The backpressure experiment on the real queue: shared FIFO vs tiers + scheduler.

    Producers outpace a real worker; urgent jobs are short, normal ones long. Each scenario
    runs in a database of its own (``pgqueue_simulate`` and clones), never in your queue.
    """
    from pgqueue.simulate import SimulateOptions, report, run_simulation
    from pgqueue.simulate import plot as draw

    options = SimulateOptions(
        duration_seconds=duration,
        strategies=tuple(s.strip() for s in strategies.split(",") if s.strip()),
        policies=tuple(p.strip() for p in policies.split(",") if p.strip()),
        urgent_share=urgent_share,
        arrival_rate_per_second=rate,
        workers=workers,
        normal_cap=normal_cap,
        urgent_cap=urgent_cap,
        seed=seed,
    )
    options.validate()
    if plot is not None:
        from pgqueue.simulate import require_matplotlib

        require_matplotlib()
    target = _dsn(_settings(), dsn)
    if not as_json:
        err_console.print(
            f"simulate: {len(options.scenarios)} scenarios × {options.scenario_seconds:.1f} s, "
            f"{rate:g} jobs/s offered, {workers} worker slots..."
        )
    results = run_simulation(target, options)
    doc = report(options, results)
    if plot is not None:
        draw(results, str(plot), doc["verdict"]["tiers_urgent_p95_bound_ms"])
    if as_json:
        sys.stdout.write(json.dumps(doc) + "\n")
        return
    table = Table(title="Urgent vs normal latency (ms, enqueue to finish)")
    cols = ["scenario", "backlog"]
    for cls in ("urgent", "normal"):
        cols += [f"{cls} n", "p50", "p95", "p99", "dropped", "rejected"]
    for col in cols:
        table.add_column(col, justify="left" if col == "scenario" else "right")
    for r in results:
        cells = [r.name, f"{r.backlog_mean:.0f}"]
        for stats in (r.urgent, r.normal):
            cells += [
                str(stats.count),
                _ms(stats.p50_ms),
                _ms(stats.p95_ms),
                _ms(stats.p99_ms),
                str(stats.dropped),
                str(stats.rejected),
            ]
        table.add_row(*cells)
    # The table is wide: never squeeze it below 160 columns (pipes report 80).
    Console(soft_wrap=True, width=max(console.width, 160)).print(table)
    verdict = doc["verdict"]
    if verdict["tiers_urgent_p95_within_bound"] is not None:
        console.print(
            "tiers + scheduler keep urgent p95 within 3 × the urgent service time "
            f"({verdict['tiers_urgent_p95_bound_ms']:.0f} ms): "
            + ("yes" if verdict["tiers_urgent_p95_within_bound"] else "NO")
        )
