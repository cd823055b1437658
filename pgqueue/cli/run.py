"""Commands that run things: workers, the metrics exporter, the sandbox, replays, the demo.
The measurements (``bench``, ``simulate``) are in :mod:`pgqueue.cli.experiments`."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from pgqueue.cli import (
    _INT64_MAX,
    _MAX_SECONDS,
    LOOPBACK_HOSTS,
    MAX_CONCURRENCY,
    DsnOption,
    _dsn,
    _settings,
    app,
    check_can_listen,
    cli_errors,
    console,
    err_console,
    finite_in_range,
    int_in_range,
)
from pgqueue.display import cell
from pgqueue.worker.shutdown import work_until_stopped

if TYPE_CHECKING:
    from pgqueue.worker.runtime import Worker, WorkerStats

#: `replay --against-sandbox --rate-scale` at most: 50 RPM x 2e7 is 1e9, the most
#: `pgqueue limits set --rpm` takes.
_MAX_RATE_SCALE = 2e7
#: `metrics --top-tenants` and `replay --tenants` at most (labels per metric; tenants built).
_MAX_TENANTS = 10_000
#: `sandbox --fail-first-n` at most (one scripted answer each, kept in memory).
_MAX_SCRIPTED_FAILURES = 1_000_000


@app.command()
@cli_errors
def work(
    dsn: DsnOption = None,
    concurrency: Annotated[
        int | None, typer.Option(help=f"Jobs in flight, 1 to {MAX_CONCURRENCY}.")
    ] = None,
    burst: Annotated[bool, typer.Option(help="Exit when nothing is left to run.")] = False,
    app_spec: Annotated[
        str | None, typer.Option("--app", help="module:attribute of a pgqueue.Registry.")
    ] = None,
    poll_interval: Annotated[
        float | None,
        typer.Option(help="Seconds between polls, above 0, at most 1e9 (NOTIFY wakes sooner)."),
    ] = None,
    listen: Annotated[
        bool, typer.Option(help="Use LISTEN/NOTIFY; --no-listen polls only (PgBouncer).")
    ] = True,
    metrics_port: Annotated[
        int | None,
        typer.Option(help="Serve this worker's pgqueue_* metrics on this port (1 to 65535)."),
    ] = None,
    metrics_host: Annotated[
        str,
        typer.Option(
            help="Address of --metrics-port; 127.0.0.1 keeps it on this machine, 0.0.0.0 lets "
            "a Prometheus on another host (or container) scrape it."
        ),
    ] = "127.0.0.1",
    claim_batch: Annotated[
        int | None,
        typer.Option(
            help=f"At most this many jobs per claim, 1 to {MAX_CONCURRENCY} (default: every "
            "free slot); below --concurrency, the next claim overlaps the jobs still running.",
        ),
    ] = None,
) -> None:
    """Run a worker: claim jobs fairly, call the provider, record outcomes."""
    from pgqueue.handlers.registry import Registry, load_app
    from pgqueue.worker.runtime import Worker

    int_in_range("--concurrency", concurrency, 1, MAX_CONCURRENCY)
    int_in_range("--metrics-port", metrics_port, 1, 65535)
    int_in_range("--claim-batch", claim_batch, 1, MAX_CONCURRENCY)
    finite_in_range("--poll-interval", poll_interval, 0.0, _MAX_SECONDS, low_open=True)
    settings = _settings(poll_interval_seconds=poll_interval, claim_batch_max=claim_batch)
    target = _dsn(settings, dsn)
    registry = load_app(app_spec) if app_spec else Registry()
    if metrics_port is not None:  # 127.0.0.1 by default, as `pgqueue metrics` (issue 28)
        check_can_listen(metrics_host, metrics_port)
        from prometheus_client import start_http_server

        from pgqueue.observability.metrics import WORKER_REGISTRY

        start_http_server(metrics_port, addr=metrics_host, registry=WORKER_REGISTRY)
        _warn_if_beyond_this_machine(metrics_host)
    # the worker's INFO lines are its life cycle (a stop, the end of an outage): shown without -v
    logging.getLogger("pgqueue.worker").setLevel(logging.INFO)
    worker = Worker(target, settings, registry, concurrency=concurrency, burst=burst, listen=listen)
    worker.check_schema()  # a schema behind: one error line, not "started" first (a tester)
    wake = "LISTEN/NOTIFY" if listen else "polling only"
    err_console.print(
        f"worker {worker.worker_id} started: {worker.concurrency} slots, {wake} (poll every "
        f"{settings.poll_interval_seconds:g} s), {'burst' if burst else 'until SIGTERM'}, "
        f"database {_where(target)}",
        markup=False,
        highlight=False,
    )
    stats = asyncio.run(_work_showing_progress(worker))
    done = ", ".join(f"{k} {v}" for k, v in sorted(stats.outcomes.items())) or "nothing"
    console.print(
        f"worker {worker.worker_id} stopped: claimed {stats.claimed} ({done})", markup=False
    )


def _where(dsn: str) -> str:
    """A DSN as "database on host" (no user, no password)."""
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(dsn)
    return f"{parts.get('dbname') or 'default'} on {parts.get('host') or 'the local socket'}"


async def _work_showing_progress(worker: Worker) -> WorkerStats:
    """Run the worker; on a terminal, a live line of its counts (a log gets none)."""
    from pgqueue.progress import Phases

    if not err_console.is_terminal:
        return await work_until_stopped(worker)
    with Phases(err_console) as phases:
        phases.phase("working")
        task = asyncio.ensure_future(work_until_stopped(worker))
        while not task.done():
            await asyncio.wait({task}, timeout=0.5)
            done = sum(worker.stats.outcomes.values())
            outcomes = ", ".join(f"{k} {v}" for k, v in sorted(worker.stats.outcomes.items()))
            phases.update(done, f"claimed {worker.stats.claimed}; {outcomes}")
        return task.result()


@app.command()
@cli_errors
def metrics(
    port: Annotated[int, typer.Option(help="Port of /metrics, 1 to 65535.")] = 9464,
    host: Annotated[
        str,
        typer.Option(
            help="Address to bind; 127.0.0.1 keeps it on this machine, 0.0.0.0 lets a "
            "Prometheus on another host (or container) scrape it."
        ),
    ] = "127.0.0.1",
    refresh_seconds: Annotated[
        float, typer.Option(help="Read the database at most this often, seconds, 0 to 1e9.")
    ] = 30.0,
    top_tenants: Annotated[
        int,
        typer.Option(help=f"Per-tenant labels kept, 1 to {_MAX_TENANTS}; the rest is 'other'."),
    ] = 20,
    dsn: DsnOption = None,
) -> None:
    """Serve the database-wide claude_* metrics (run ONE per database; workers add their own)."""
    import signal
    import threading

    from prometheus_client import start_http_server

    from pgqueue.observability.metrics import database_registry

    int_in_range("--port", port, 1, 65535)
    int_in_range("--top-tenants", top_tenants, 1, _MAX_TENANTS)
    finite_in_range("--refresh-seconds", refresh_seconds, 0.0, _MAX_SECONDS)
    check_can_listen(host, port)  # a busy port: one line naming the address, exit 2
    # The database is read once before serving: unreachable, or without the schema, the
    # command exits 1 as every other does (found by a tester: it served an empty queue).
    registry = database_registry(
        _dsn(_settings(), dsn),
        check=True,
        refresh_seconds=refresh_seconds,
        top_tenants=top_tenants,
    )
    server, _thread = start_http_server(port, addr=host, registry=registry)
    _warn_if_beyond_this_machine(host)
    err_console.print(f"metrics on http://{host}:{port}/metrics", markup=False)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()


def _warn_if_beyond_this_machine(host: str) -> None:
    """One line on stderr when metrics are served beyond loopback (as `dashboard` warns):
    tenant ids are labels of the exporter's series."""
    if host not in LOOPBACK_HOSTS:
        err_console.print(
            f"warning: serving metrics on {host}, beyond this machine, over plain HTTP",
            markup=False,
            highlight=False,
        )


@app.command()
@cli_errors
def sandbox(
    host: str = "127.0.0.1",
    port: Annotated[int, typer.Option(help="1 to 65535.")] = 8765,
    rpm: Annotated[int, typer.Option(help="Requests per minute, 1 to 1e9.")] = 50,
    itpm: Annotated[int, typer.Option(help="Input tokens per minute, 1 to 1e12.")] = 40_000,
    otpm: Annotated[int, typer.Option(help="Output tokens per minute, 1 to 1e12.")] = 8_000,
    overload_rate: Annotated[
        float, typer.Option(help="Share of requests answered 529, 0 to 1.")
    ] = 0.0,
    seconds_per_output_token: Annotated[
        float, typer.Option(help="Simulated generation time per output token, 0 to 1e9.")
    ] = 0.0,
    fail_first_n: Annotated[
        int,
        typer.Option(
            help=f"Answer the first N requests with --fail-status, 0 to {_MAX_SCRIPTED_FAILURES}."
        ),
    ] = 0,
    fail_status: Annotated[int, typer.Option(help="An HTTP error status, 400 to 599.")] = 429,
    fail_retry_after: Annotated[
        str | None, typer.Option(help="retry-after of those answers.")
    ] = None,
    seed: int = 0,
    batch_processing_seconds: Annotated[
        float, typer.Option(help="How long a Message Batch stays in progress, 0 to 1e9.")
    ] = 0.0,
) -> None:
    """Run the local Messages-API-compatible server (set ANTHROPIC_BASE_URL to it)."""
    from pgqueue.errors import InvalidArgument
    from pgqueue.sandbox import SandboxConfig, serve

    int_in_range("--port", port, 1, 65535)
    int_in_range("--rpm", rpm, 1, 10**9)  # as `pgqueue limits set`
    int_in_range("--itpm", itpm, 1, 10**12)
    int_in_range("--otpm", otpm, 1, 10**12)
    int_in_range("--fail-first-n", fail_first_n, 0, _MAX_SCRIPTED_FAILURES)
    int_in_range("--fail-status", fail_status, 400, 599)
    finite_in_range("--overload-rate", overload_rate, 0.0, 1.0)
    finite_in_range("--seconds-per-output-token", seconds_per_output_token, 0.0, _MAX_SECONDS)
    finite_in_range("--batch-processing-seconds", batch_processing_seconds, 0.0, _MAX_SECONDS)
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
            batch_processing_seconds=batch_processing_seconds,
        )
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    check_can_listen(host, port)
    err_console.print(
        f"sandbox on http://{host}:{port} — export ANTHROPIC_BASE_URL=http://{host}:{port}",
        markup=False,
    )
    serve(config, host=host, port=port)


@app.command()
@cli_errors
def replay(
    trace: Annotated[
        Path | None, typer.Argument(help="CSV trace; default: the bundled Azure trace.")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(help="Replay the first N requests, 1 to 2^63-1.")
    ] = 1000,
    speedup: Annotated[
        float, typer.Option(help="Replay this many times faster, at least 0.01.")
    ] = 1.0,
    tenants: Annotated[
        int, typer.Option(help=f"Tenants, 1 to {_MAX_TENANTS} (t00 is the runaway).")
    ] = 8,
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
        typer.Option(help="With --against-sandbox: limits × 50 RPM/40k ITPM/8k OTPM, 0.01 to 2e7."),
    ] = 1.0,
    concurrency: Annotated[
        int, typer.Option(help=f"With --against-sandbox: jobs in flight, 1 to {MAX_CONCURRENCY}.")
    ] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    dsn: DsnOption = None,
) -> None:
    """Enqueue a real trace at its recorded arrival times (run `pgqueue work` beside it), or
    measure the whole path against the sandbox with --against-sandbox."""
    from pgqueue.replay import batch_lane_savings, replay_plan
    from pgqueue.trace import load_trace, plan_replay, summarize_plan

    int_in_range("--limit", limit, 1, _INT64_MAX)
    int_in_range("--tenants", tenants, 1, _MAX_TENANTS)
    int_in_range("--concurrency", concurrency, 1, MAX_CONCURRENCY)
    finite_in_range("--speedup", speedup, 0.01)
    finite_in_range("--rate-scale", rate_scale, 0.01, _MAX_RATE_SCALE)
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
        from pgqueue.progress import Phases

        with Phases(err_console) as phases:
            report = run_demo(target, settings, options, phases)
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
            cell(tenant_id),
            str(row.get("jobs", "")),
            f"{row.get('input_tokens', 0):,}",
            f"{row.get('output_tokens', 0):,}",
        )
    console.print(table)
    console.print(
        f"enqueued {stats.jobs} jobs in {stats.batches} round trips over "
        f"{stats.elapsed_seconds:.1f} s (worst lag {stats.max_lag_seconds * 1000:.0f} ms)"
    )
    lane = batch_lane_savings(plan, settings)
    console.print(
        f"batch tier: {lane['jobs']} jobs, {lane['input_tokens']:,} input / "
        f"{lane['output_tokens']:,} output tokens; through the batches lane an estimated "
        f"${lane['cost_saved_usd']:,.2f} saved (docs/batches.md)",
        markup=False,
    )


def _check_chart_folder(chart: Path) -> None:
    """Fail before the run, not after it, if the PNG could not be written (found by testers:
    a path in no folder, and the default path from a folder that takes no files, ``/proc``).
    Without matplotlib there is no PNG: the chart goes to the terminal."""
    import importlib.util
    import tempfile

    if not chart.parent.resolve().is_dir():
        raise typer.BadParameter(f"{chart.parent} is not a folder", param_hint="--chart")
    if importlib.util.find_spec("matplotlib") is None:
        return
    try:
        with tempfile.TemporaryFile(dir=chart.parent):
            pass
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot write to {chart.parent.resolve()} ({exc.strerror or exc})",
            param_hint="--chart",
        ) from None


@app.command()
@cli_errors
def demo(
    requests: Annotated[int, typer.Option(help="Requests from the trace, 1 to 2^63-1.")] = 400,
    speedup: Annotated[float, typer.Option(help="Replay speed-up, at least 0.01.")] = 5.0,
    concurrency: Annotated[
        int, typer.Option(help=f"Jobs in flight per queue, 1 to {MAX_CONCURRENCY}.")
    ] = 16,
    load: Annotated[
        float,
        typer.Option(help="What the trace asks / what the provider serves, 0.1 to 100."),
    ] = 1.4,
    chart: Annotated[
        Path, typer.Option(help="Where to write the PNG chart (needs the plot extra).")
    ] = Path("pgqueue-demo.png"),
    keep: Annotated[
        bool, typer.Option(help="Keep the two demo databases (their DSNs are printed).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
    dsn: DsnOption = None,
) -> None:
    """The same real arrivals through a plain FIFO queue and through pgqueue, side by side.

    Replays a slice of the Azure LLM inference trace 2023 (CC-BY 4.0) for eight tenants, one a
    runaway, into two queues at once, each with its own worker and local sandbox API at the same
    limits, and prints the small tenants' wait, the critical tier against its SLO, Jain's index
    and the 429s, then draws a chart. Each queue is a database of its own on the server
    (`pgqueue_demo_<run>_fifo` and `_pgqueue`), dropped at the end: your queue is never touched.
    """
    from pgqueue.demo_compare import CompareOptions, Interrupted, run_comparison
    from pgqueue.demo_figures import figures_json, render, terminal_chart, write_chart
    from pgqueue.progress import Phases

    int_in_range("--requests", requests, 1, _INT64_MAX)
    int_in_range("--concurrency", concurrency, 1, MAX_CONCURRENCY)
    finite_in_range("--speedup", speedup, 0.01)
    finite_in_range("--load", load, 0.1, 100.0)
    if not as_json:
        _check_chart_folder(chart)
    settings = _settings()
    options = CompareOptions(
        requests=requests, speedup=speedup, concurrency=concurrency, load=load, keep=keep
    )
    try:
        with Phases(err_console) as phases:
            phases.phase("starting Postgres" if not (dsn or settings.dsn) else "connecting")
            target = _dsn(settings, dsn)
            result = run_comparison(target, settings, options, phases)
    except KeyboardInterrupt as stopped:
        # Ctrl-C: one line, not asyncio's traceback (found by a tester), and the shell's 130.
        if not isinstance(stopped, Interrupted):  # before the databases were named
            err_console.print("interrupted", markup=False)
        elif keep:
            err_console.print("interrupted: kept the demo databases", markup=False)
            for arm, kept in stopped.dsns.items():
                err_console.print(f"kept {arm}: {kept}", markup=False, highlight=False)
        else:
            err_console.print("interrupted: dropped the demo databases", markup=False)
        raise typer.Exit(130) from None
    if as_json:
        document = figures_json(result.fifo, result.pgqueue)
        document["limits_per_minute"] = dict(
            zip(
                ("requests", "input_tokens", "output_tokens"), result.limits_per_minute, strict=True
            )
        )
        document["seconds"] = result.seconds
        sys.stdout.write(json.dumps(document) + "\n")
        return
    rpm, itpm, otpm = result.limits_per_minute
    console.print(
        f"{requests} requests of the Azure LLM inference trace 2023 (CC-BY 4.0; Patel et al., "
        f"Splitwise, ISCA 2024) at {speedup:g}×, tenants t00 (runaway, 40 %) to t07; provider "
        f"limits {rpm:,} RPM / {itpm:,} ITPM / {otpm:,} OTPM, 1/{load:g} of the demand, buckets "
        f"spent at the start; {result.seconds:.0f} s.",
        markup=False,
        highlight=False,
    )
    render(result.fifo, result.pgqueue, console)
    caption = (
        f"pgqueue demo: {requests} requests of the Azure LLM inference trace 2023 (CC-BY 4.0) at "
        f"{speedup:g}×, 8 tenants (t00 a runaway), the same provider limits for both queues"
    )
    try:
        write_chart(result.fifo, result.pgqueue, chart, caption)
        console.print(f"chart: {chart}", markup=False, highlight=False)
    except ImportError:
        terminal_chart(result.fifo, result.pgqueue, console)
        console.print("(for a PNG chart: pip install -e '.[plot]')", markup=False, highlight=False)
    if keep:
        for arm, kept in result.dsns.items():
            console.print(f"kept {arm}: {kept}", markup=False, highlight=False)
