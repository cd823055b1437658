"""Running ``pgqueue bench`` (interleaved repeats, medians, ratios) and its table and chart."""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from pgqueue.bench.common import (
    PAYLOAD_BYTES,
    BenchOptions,
    Scratch,
    _asyncpg_available,
    _median,
    _r,
    _ratios,
)
from pgqueue.bench.measure import ENQUEUE, consume_once, wakeup

# ------------------------------------------------------------------------------------ the run


@dataclass
class _Series:
    samples: dict[str, list[float]] = field(default_factory=dict)

    def add(self, system: str, value: float) -> None:
        self.samples.setdefault(system, []).append(value)

    def summary(self, systems: Sequence[str]) -> dict[str, Any]:
        out: dict[str, Any] = {
            f"{s}_jobs_per_s": _r(_median(self.samples.get(s, []))) for s in systems
        }
        ours = self.samples.get("pgqueue", [])
        for other in systems[1:]:
            ratios = _ratios(ours, self.samples.get(other, []))
            out[f"ratio_vs_{other}"] = _r(_median(ratios), 3)
        out["samples"] = {k: [round(v, 1) for v in vs] for k, vs in self.samples.items()}
        return out


def _order(systems: Sequence[str], repeat: int) -> list[str]:
    k = repeat % len(systems)
    return [*systems[k:], *systems[:k]]


def run(
    server_dsn: str,
    options: BenchOptions,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the benchmark on scratch databases of ``server_dsn``; returns the JSON-able report."""
    options.check()
    say = progress or (lambda _msg: None)
    systems = ["pgqueue", "plain"] + ([options.peer] if options.peer else [])
    scratch = Scratch(server_dsn, options.peer)
    report: dict[str, Any] = {"meta": _meta(server_dsn, options, systems)}
    report["meta"]["scratch_prefix"] = scratch.prefix
    try:
        say(f"template database {scratch.template}")
        scratch.create_template()
        if "enqueue" in options.parts:
            report["enqueue"] = _run_enqueue(scratch, options, systems, say)
        if "consume" in options.parts:
            report["consume"] = _run_consume(scratch, options, systems, say)
        if "wakeup" in options.parts:
            say("wake-up latency")
            with scratch.clone() as dsn:
                report["wakeup"] = wakeup(dsn, options)
    finally:
        scratch.close()
    report["meta"]["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    return report


def _run_enqueue(
    scratch: Scratch, options: BenchOptions, systems: list[str], say: Callable[[str], None]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode, n in (("single", options.single_jobs), ("bulk", options.bulk_jobs)):
        series = _Series()
        for repeat in range(options.repeats):
            for system in _order(systems, repeat):
                with scratch.clone() as dsn:
                    rate = ENQUEUE[system](dsn, n, mode == "bulk", options.batch, options.tenants)
                series.add(system, rate)
                say(f"enqueue {mode} {system} #{repeat + 1}: {rate:,.0f} jobs/s")
        out[mode] = {"jobs": n, **series.summary(systems)}
    return out


def _run_consume(
    scratch: Scratch, options: BenchOptions, systems: list[str], say: Callable[[str], None]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for procs in options.procs:
        series = _Series()
        first_claim: dict[str, list[float]] = {}
        for repeat in range(options.repeats):
            for system in _order(systems, repeat):
                with scratch.clone() as dsn:
                    result = consume_once(dsn, system, procs, options)
                series.add(system, result["jobs_per_s"])
                if result["first_claim_ms"] is not None:
                    first_claim.setdefault(system, []).append(result["first_claim_ms"])
                say(
                    f"consume {procs} proc(s) {system} #{repeat + 1}: "
                    f"{result['jobs_per_s']:,.0f} jobs/s"
                )
        rows.append(
            {
                "procs": procs,
                "jobs": options.jobs,
                **series.summary(systems),
                "first_claim_ms": {k: _r(_median(v), 2) for k, v in first_claim.items()},
            }
        )
    base = next((r for r in rows if r["procs"] == 1), None)
    for row in rows:
        if base is not None:
            for system in systems:
                ours, one = row[f"{system}_jobs_per_s"], base[f"{system}_jobs_per_s"]
                row[f"{system}_vs_1_proc"] = _r(ours / one, 3) if ours and one else None
    return rows


def _meta(server_dsn: str, options: BenchOptions, systems: list[str]) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    with psycopg.connect(server_dsn, autocommit=True) as conn:
        server = conn.execute("SHOW server_version").fetchone()
        sync = conn.execute("SHOW synchronous_commit").fetchone()
    peer_version = None
    if options.peer:
        with contextlib.suppress(PackageNotFoundError):
            peer_version = version(options.peer)
    return {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "systems": systems,
        "options": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(options).items()},
        "payload_bytes": len(PAYLOAD_BYTES),
        "postgres": server[0] if server else None,
        "synchronous_commit": sync[0] if sync else None,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "pgqueue": version("pgqueue"),
        "peer_version": peer_version,
        "peer_driver": ("asyncpg" if _asyncpg_available() else "psycopg") if options.peer else None,
    }


# ------------------------------------------------------------------------------------ output


def render(report: dict[str, Any]) -> list[Any]:
    """Rich tables of a report (enqueue, consume, wake-up)."""
    from rich.table import Table

    systems: list[str] = report["meta"]["systems"]
    others = systems[1:]
    tables: list[Any] = []

    def fmt(value: Any, ratio: bool = False) -> str:
        if value is None:
            return "-"
        return f"{value:.2f}x" if ratio else f"{value:,.0f}"

    if "enqueue" in report:
        t = Table(title="Enqueue (jobs/s, medians; ratio = median of per-repeat ratios)")
        t.add_column("mode")
        for s in systems:
            t.add_column(s, justify="right")
        for o in others:
            t.add_column(f"pgqueue / {o}", justify="right")
        for mode, row in report["enqueue"].items():
            t.add_row(
                f"{mode} ({row['jobs']:,})",
                *[fmt(row[f"{s}_jobs_per_s"]) for s in systems],
                *[fmt(row[f"ratio_vs_{o}"], ratio=True) for o in others],
            )
        tables.append(t)
    if "consume" in report:
        opts = report.get("meta", {}).get("options", {})
        shape = f"{opts.get('concurrency', '?')} slots per process"
        cap = opts.get("claim_batch")
        if cap is not None and cap < opts.get("concurrency", 0):  # (never more than the slots)
            shape += f", at most {cap} per claim"
        if "pgqueuer" in systems:
            limit = opts.get("peer_max_in_flight")
            shape += f"; pgqueuer batch {opts.get('peer_batch', '?')}, " + (
                f"at most {limit} in flight" if limit is not None else "no cap on jobs in flight"
            )
        t = Table(title=f"Claim + complete of no-op jobs (jobs/s, medians; {shape})")
        t.add_column("procs", justify="right")
        for s in systems:
            t.add_column(s, justify="right")
        for o in others:
            t.add_column(f"pgqueue / {o}", justify="right")
        t.add_column("pgqueue vs 1 proc", justify="right")
        for row in report["consume"]:
            t.add_row(
                str(row["procs"]),
                *[fmt(row[f"{s}_jobs_per_s"]) for s in systems],
                *[fmt(row[f"ratio_vs_{o}"], ratio=True) for o in others],
                fmt(row.get("pgqueue_vs_1_proc"), ratio=True),
            )
        tables.append(t)
    if "wakeup" in report:
        w = report["wakeup"]
        t = Table(title="Idle wake-up: commit → claim (ms)")
        for col in ("samples", "p50", "p99", "max"):
            t.add_column(col, justify="right")
        t.add_row(
            str(w["samples"]), f"{w['p50_ms']:.2f}", f"{w['p99_ms']:.2f}", f"{w['max_ms']:.2f}"
        )
        tables.append(t)
    return tables


def plot(report: dict[str, Any], path: Path) -> bool:
    """Write a PNG bar chart; ``False`` when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    systems: list[str] = report["meta"]["systems"]
    panels: list[tuple[str, list[str], dict[str, list[float]]]] = []
    if "enqueue" in report:
        for mode, row in report["enqueue"].items():
            panels.append(
                (f"enqueue {mode}", [""], {s: [row[f"{s}_jobs_per_s"] or 0.0] for s in systems})
            )
    if "consume" in report:
        labels = [f"{r['procs']} proc" for r in report["consume"]]
        values = {s: [r[f"{s}_jobs_per_s"] or 0.0 for r in report["consume"]] for s in systems}
        panels.append(("claim + complete", labels, values))
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    width = 0.8 / len(systems)
    for ax, (title, labels, values) in zip(axes[0], panels, strict=True):
        for k, s in enumerate(systems):
            xs = [i + (k - (len(systems) - 1) / 2) * width for i in range(len(labels))]
            ax.bar(xs, values[s], width, label=s)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_title(title)
        ax.set_ylabel("jobs/s")
    axes[0][0].legend()
    if "wakeup" in report:
        w = report["wakeup"]
        fig.suptitle(
            f"idle wake-up commit→claim: p50 {w['p50_ms']:.2f} ms, p99 {w['p99_ms']:.2f} ms"
        )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
