"""Commands that run things: workers, the metrics exporter, the sandbox, replays, the demo,
benchmarks and the backpressure simulation."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pgqueue.cli import (
    _INT32_MAX,
    _INT64_MAX,
    _MAX_SECONDS,
    MAX_CONCURRENCY,
    DsnOption,
    _dsn,
    _settings,
    app,
    cli_errors,
    console,
    err_console,
    finite_in_range,
    int_in_range,
)
from pgqueue.worker.shutdown import work_until_stopped

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
    if metrics_port is not None:
        from prometheus_client import start_http_server

        from pgqueue.observability.metrics import WORKER_REGISTRY

        start_http_server(metrics_port, registry=WORKER_REGISTRY)
    worker = Worker(target, settings, registry, concurrency=concurrency, burst=burst, listen=listen)
    stats = asyncio.run(work_until_stopped(worker))
    done = ", ".join(f"{k} {v}" for k, v in sorted(stats.outcomes.items())) or "nothing"
    console.print(
        f"worker {worker.worker_id} stopped: claimed {stats.claimed} ({done})", markup=False
    )


@app.command()
@cli_errors
def metrics(
    port: Annotated[int, typer.Option(help="Port of /metrics, 1 to 65535.")] = 9464,
    host: str = "0.0.0.0",
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
    registry = database_registry(
        _dsn(_settings(), dsn), refresh_seconds=refresh_seconds, top_tenants=top_tenants
    )
    server, _thread = start_http_server(port, addr=host, registry=registry)
    err_console.print(f"metrics on http://{host}:{port}/metrics", markup=False)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()


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
    from pgqueue.replay import replay_plan
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
            Text(tenant_id),
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
    requests: Annotated[int, typer.Option(help="Requests from the trace, 1 to 2^63-1.")] = 400,
    speedup: Annotated[float, typer.Option(help="Replay speed-up, at least 0.01.")] = 10.0,
    concurrency: Annotated[int, typer.Option(help=f"Jobs in flight, 1 to {MAX_CONCURRENCY}.")] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    dsn: DsnOption = None,
) -> None:
    """Embedded Postgres + sandbox API + a slice of a real trace + workers, then a summary.

    The demo works in its own database (``pgqueue_demo``, recreated on each run) on the same
    server, so it never touches your queue.
    """
    from pgqueue.demo import DemoOptions, run_demo
    from pgqueue.observability.report import render_run_report

    int_in_range("--requests", requests, 1, _INT64_MAX)
    int_in_range("--concurrency", concurrency, 1, MAX_CONCURRENCY)
    finite_in_range("--speedup", speedup, 0.01)
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
    jobs: Annotated[int, typer.Option(help="Jobs per claim+complete run, 1 to 2^31-1.")] = 20_000,
    procs: Annotated[str, typer.Option(help="Worker process counts, comma-separated.")] = "1,2,4",
    concurrency: Annotated[
        int, typer.Option(help=f"Slots per worker process, 1 to {MAX_CONCURRENCY}.")
    ] = 10,
    repeats: Annotated[
        int, typer.Option(help="Interleaved runs per measurement, 1 to 2^31-1.")
    ] = 3,
    single_jobs: Annotated[
        int, typer.Option(help="Jobs per single-enqueue run, 1 to 2^31-1.")
    ] = 2_000,
    bulk_jobs: Annotated[
        int, typer.Option(help="Jobs per bulk-enqueue run, 1 to 2^31-1.")
    ] = 20_000,
    batch: Annotated[int, typer.Option(help="Jobs per bulk statement, 1 to 2^31-1.")] = 1_000,
    wake_samples: Annotated[int, typer.Option(help="Idle wake-up samples, 1 to 2^31-1.")] = 200,
    peer: Annotated[
        str | None,
        typer.Option(help="Also measure a peer: pgqueuer (pip install 'pgqueue\\[bench]')."),
    ] = None,
    peer_batch: Annotated[
        int, typer.Option(help=f"The peer's dequeue batch size, 1 to {MAX_CONCURRENCY}.")
    ] = 10,
    claim_batch: Annotated[
        int | None,
        typer.Option(
            help=f"Jobs per claim of pgqueue and plain workers, 1 to {MAX_CONCURRENCY} "
            "(default: free slots)."
        ),
    ] = None,
    peer_max_in_flight: Annotated[
        int | None,
        typer.Option(
            help="The peer's cap on jobs in flight (pgqueuer max_concurrent_tasks, at least "
            f"twice --peer-batch, at most {2 * MAX_CONCURRENCY}; default: its own, no cap).",
        ),
    ] = None,
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
    from pgqueue.errors import InvalidArgument

    for option, value, high in (
        ("--jobs", jobs, _INT32_MAX),
        ("--concurrency", concurrency, MAX_CONCURRENCY),
        ("--repeats", repeats, _INT32_MAX),
        ("--single-jobs", single_jobs, _INT32_MAX),
        ("--bulk-jobs", bulk_jobs, _INT32_MAX),
        ("--batch", batch, _INT32_MAX),
        ("--wake-samples", wake_samples, _INT32_MAX),
        ("--peer-batch", peer_batch, MAX_CONCURRENCY),
        ("--claim-batch", claim_batch, MAX_CONCURRENCY),
        ("--peer-max-in-flight", peer_max_in_flight, 2 * MAX_CONCURRENCY),
    ):
        int_in_range(option, value, 1, high)
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
        claim_batch=claim_batch,
        peer_max_in_flight=peer_max_in_flight,
        parts=tuple(x.strip() for x in only.split(",")) if only else b.PARTS,
    )
    options.check()
    for out in (json_out, plot):  # before a run of minutes, not after it
        if out is not None and not out.parent.is_dir():
            raise InvalidArgument(f"{out}: the folder {out.parent} does not exist")
    target = _dsn(_settings(), dsn)
    report = b.run(
        target, options, progress=lambda msg: err_console.print(msg, markup=False, highlight=False)
    )
    for table in b.render(report):
        console.print(table)
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        err_console.print(f"wrote {json_out}", markup=False)
    if plot is not None:
        if b.plot(report, plot):
            err_console.print(f"wrote {plot}", markup=False)
        else:
            err_console.print(
                "matplotlib is not installed (pip install 'pgqueue[bench]'); no chart",
                markup=False,
            )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


@app.command()
@cli_errors
def simulate(
    duration: Annotated[
        float,
        typer.Option(help="Total measured seconds, split over the scenarios, 1 to 1e9."),
    ] = 20.0,
    strategies: Annotated[
        str, typer.Option(help="Comma list of fifo, weighted, probabilistic, strict.")
    ] = "fifo,weighted,probabilistic,strict",
    policies: Annotated[
        str, typer.Option(help="Normal-job policies: comma list of drop, block, reject.")
    ] = "drop,block,reject",
    urgent_share: Annotated[
        float, typer.Option(help="Share of urgent jobs, above 0 and below 1.")
    ] = 0.1,
    rate: Annotated[float, typer.Option(help="Jobs offered per second, at least 1.")] = 150.0,
    workers: Annotated[
        int, typer.Option(help=f"Jobs in flight (worker slots), 1 to {MAX_CONCURRENCY}.")
    ] = 24,
    normal_cap: Annotated[
        int,
        typer.Option(help="Cap of queued normal jobs (the shared queue's, in fifo), 0 to 2^63-1."),
    ] = 40,
    urgent_cap: Annotated[int, typer.Option(help="Cap of queued urgent jobs, 0 to 2^63-1.")] = 20,
    seed: int = 42,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write urgent p95 per scenario to a PNG.")
    ] = None,
    dsn: DsnOption = None,
) -> None:
    """The backpressure experiment on the real queue: shared FIFO vs tiers + scheduler.

    Producers outpace a real worker; urgent jobs are short, normal ones long. Each scenario
    runs in a database of its own (``pgqueue_simulate_<run>`` and clones), never in your queue.
    """
    from pgqueue.simulate import SimulateOptions, report, run_simulation
    from pgqueue.simulate import plot as draw

    int_in_range("--workers", workers, 1, MAX_CONCURRENCY)
    int_in_range("--normal-cap", normal_cap, 0, _INT64_MAX)
    int_in_range("--urgent-cap", urgent_cap, 0, _INT64_MAX)
    finite_in_range("--duration", duration, 1.0, _MAX_SECONDS)
    finite_in_range("--urgent-share", urgent_share, 0.0, 1.0, low_open=True, high_open=True)
    finite_in_range("--rate", rate, 1.0)
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
    Console(soft_wrap=True, width=max(console.width, 160), emoji=False).print(table)
    verdict = doc["verdict"]
    if verdict["tiers_urgent_p95_within_bound"] is not None:
        console.print(
            "tiers + scheduler keep urgent p95 within 3 × the urgent service time "
            f"({verdict['tiers_urgent_p95_bound_ms']:.0f} ms): "
            + ("yes" if verdict["tiers_urgent_p95_within_bound"] else "NO")
        )
