"""Commands that measure: the no-op throughput benchmark against peers (``bench``) and the
backpressure experiment on the real queue (``simulate``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

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
        typer.Option(
            help="Also measure a peer: pgqueuer (the bench extra: pip install -e '.\\[bench]' "
            "in the pgqueue checkout)."
        ),
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
                "matplotlib is not installed (the bench extra: pip install -e '.[bench]' in the "
                "pgqueue checkout); no chart",
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
    ] = 60.0,
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
        err_console.print(f"chart: {plot}", markup=False, highlight=False)
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
