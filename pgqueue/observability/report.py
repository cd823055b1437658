"""Read-only summaries of the queue (``pgqueue status``) and of a run (demo, replay).

Collectors return plain dicts (JSON-ready); renderers turn them into rich tables. Latencies are
enqueue-to-finish, in seconds, from the database clock. Every string from the database (tenant
ids, tiers, reasons) goes into a table as a :func:`pgqueue.display.cell`, never as a str,
which rich reads as markup: a tenant named ``[/oops]`` raised MarkupError, ``[bold]x[/bold]``
showed as a bold "x" (found by a tester); its control characters are escaped (an ESC in a
tenant id coloured the rest of the screen).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table

from pgqueue.batches.outcomes import cost_saved_usd
from pgqueue.db import queries
from pgqueue.display import cell, printable
from pgqueue.models import Tier
from pgqueue.settings import Settings


def _num(value: Any) -> Any:
    """Decimals (from numeric aggregates) as floats, so that reports are JSON-ready."""
    return float(value) if isinstance(value, Decimal) else value


def collect_status(
    conn: psycopg.Connection[Any],
    *,
    top: int = 10,
    window_seconds: float = 300.0,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Depth per tier and state, oldest queued age per tier (seconds), p50/p95/p99 latency
    per tier against the SLOs over ``window_seconds``, Jain's index, top tenants, demotions,
    429s in the last minute, and the batches lane's totals and its top tenants with the
    estimated cost saved (prices and discount from ``settings``, default ``Settings()``)."""
    depth = queries.run(conn, "report_depth")
    oldest = queries.run(conn, "report_oldest_queued")
    tenants = queries.run(conn, "report_top_tenants", {"since": None, "limit": top})
    demotions = queries.run(conn, "report_demotions")
    throttles = queries.run(conn, "report_throttles_by_tenant", {"window_seconds": 60})
    window = {"window_seconds": window_seconds}
    latency = queries.run(conn, "report_latency_slo", window)
    fairness = queries.run(conn, "report_fairness", window)
    by_tier: dict[str, dict[str, int]] = {tier.value: {"queued": 0, "running": 0} for tier in Tier}
    for r in depth:
        by_tier[r["tier"]][r["state"]] = int(r["jobs"])
    return {
        "batches": batch_totals(conn, settings or Settings(), tenants=top),
        "depth": by_tier,
        "oldest_queued_seconds": {r["tier"]: _num(r["oldest_seconds"]) for r in oldest},
        "top_tenants": [{k: _num(v) for k, v in r.items()} for r in tenants],
        "demotions": [{k: _num(v) for k, v in r.items()} for r in demotions],
        "throttles_last_minute": {r["tenant_id"]: int(r["throttles"]) for r in throttles},
        "window_seconds": window_seconds,
        "latency": {r["tier"]: {k: _num(v) for k, v in r.items() if k != "tier"} for r in latency},
        "fairness": {
            (r["tier"] or "all"): {
                "tenants": int(r["tenants"]),
                "jain_weighted": _num(r["jain_weighted"]),
                "jain_unweighted": _num(r["jain_unweighted"]),
            }
            for r in fairness
        },
    }


def batch_totals(
    conn: psycopg.Connection[Any], settings: Settings, *, tenants: int = 10
) -> dict[str, Any]:
    """The batches lane since the start: batches, requests, results by type, tokens of the
    succeeded requests, and ``cost_saved_usd`` (:func:`pgqueue.batches.outcomes.cost_saved_usd`
    at the settings' prices and discount); under ``tenants``, the same per tenant (the view
    ``pgqueue.batch_lane_service``: requests, pending, results by type, tokens,
    ``cost_saved_usd``), at most ``tenants`` rows, most tokens first."""
    totals = {k: int(v) for k, v in queries.run(conn, "batch_totals").items()}
    by_tenant = queries.run(conn, "batch_lane_by_tenant", {"limit": tenants})
    rows = [
        {
            "tenant_id": r["tenant_id"],
            **{k: int(v) for k, v in r.items() if k != "tenant_id"},
            "cost_saved_usd": _saved(settings, r["input_tokens"], r["output_tokens"]),
        }
        for r in by_tenant
    ]
    saved = _saved(settings, totals["input_tokens"], totals["output_tokens"])
    return {**totals, "cost_saved_usd": saved, "tenants": rows}


def _saved(settings: Settings, input_tokens: int, output_tokens: int) -> float:
    """:func:`pgqueue.batches.outcomes.cost_saved_usd` at the settings' prices, to 1e-6 USD."""
    saved = cost_saved_usd(
        int(input_tokens),
        int(output_tokens),
        input_usd_per_mtok=settings.price_input_usd_per_mtok,
        output_usd_per_mtok=settings.price_output_usd_per_mtok,
        discount=settings.batches_discount,
    )
    return round(saved, 6)


def collect_run_report(conn: psycopg.Connection[Any], since: datetime) -> dict[str, Any]:
    """Per tier: jobs, succeeded, failed, p50/p99 latency; per tenant: jobs and tokens;
    throttles (429/529) recorded — all for jobs enqueued at or after ``since``."""
    tiers = queries.run(conn, "report_tier_latency", {"since": since})
    tenants = queries.run(conn, "report_top_tenants", {"since": since, "limit": 1000})
    throttles = queries.run(conn, "report_throttles_since", {"since": since})
    return {
        "tiers": [{k: _num(v) for k, v in r.items()} for r in tiers],
        "tenants": [{k: _num(v) for k, v in r.items()} for r in tenants],
        "throttles": {k: int(v) for k, v in throttles.items()},
    }


def _fmt_seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render_run_report(report: dict[str, Any], console: Console, title: str = "Run") -> None:
    """Print the per-tier and per-tenant tables of :func:`collect_run_report`."""
    tiers = Table(title=f"{title}: latency per tier (enqueue → finish, seconds)")
    for col in ("tier", "jobs", "succeeded", "failed", "p50 s", "p99 s"):
        tiers.add_column(col, justify="right" if col != "tier" else "left")
    for r in report["tiers"]:
        tiers.add_row(
            cell(r["tier"]),
            str(r["jobs"]),
            str(r["succeeded"]),
            str(r["failed"]),
            _fmt_seconds(r["p50_seconds"]),
            _fmt_seconds(r["p99_seconds"]),
        )
    console.print(tiers)
    tenants = Table(title=f"{title}: per tenant")
    for col in ("tenant", "jobs done", "failed", "input tokens", "output tokens"):
        tenants.add_column(col, justify="right" if col != "tenant" else "left")
    for r in sorted(report["tenants"], key=lambda r: r["tenant_id"]):
        tenants.add_row(
            cell(r["tenant_id"]),
            str(r["succeeded"]),
            str(r["failed"]),
            f"{r['input_tokens']:,}",
            f"{r['output_tokens']:,}",
        )
    console.print(tenants)
    t = report["throttles"]
    console.print(
        f"Provider throttling: {t['http_429']} × 429, {t['http_529']} × 529 "
        f"(each rescheduled at retry-after × 1.0–1.44, never earlier)"
    )
    bp = report.get("backpressure")
    if bp:
        use = bp["quota_use"]

        def pct(x: float | None) -> str:
            return "-" if x is None else f"{100 * x:.1f} %"

        console.print(
            f"Backpressure: {bp['requests']} requests, 429/529 share {pct(bp['share_429'])}, "
            f"429 re-occurrence {pct(bp['reoccurrence'])}; quota used over "
            f"{use['window_seconds']:.0f} s: requests {pct(use['requests'])}, input tokens "
            f"{pct(use['input_tokens'])}, output tokens {pct(use['output_tokens'])}"
        )
    offered = report.get("offered")
    if offered:
        _render_offered(offered, console)


def _render_offered(offered: dict[str, dict[str, float]], console: Console) -> None:
    """One line per tier: what it asked for while its jobs arrived, as shares of the limits,
    and a warning for a tier whose SLO no schedule could meet (over 100 % of a limit)."""
    names = {"requests": "requests", "input_tokens": "input", "output_tokens": "output"}
    for tier, shares in offered.items():
        worst = max(shares, key=lambda k: shares[k])
        console.print(
            f"Offered by {tier} while arriving: "
            + ", ".join(f"{names[k]} {100 * v:.0f} %" for k, v in shares.items())
            + " of the limits"
            + (
                f" (over the {names[worst]} limit by itself: its jobs queue behind each other,"
                " whatever the schedule)"
                if shares[worst] > 1.0
                else ""
            ),
            markup=False,
            highlight=False,
        )


def _render_latency(status: dict[str, Any], console: Console) -> None:
    minutes = status["window_seconds"] / 60
    table = Table(title=f"Latency, enqueue → finish, last {minutes:g} min (seconds)")
    for col in ("tier", "finished", "p50", "p95", "p99", "SLO p99", "verdict"):
        table.add_column(col, justify="left" if col in ("tier", "verdict") else "right")
    for tier, r in status["latency"].items():
        verdict = {True: "[green]meets[/green]", False: "[red]misses[/red]"}.get(
            r["meets_slo"], "[dim]no data[/dim]"
        )
        table.add_row(
            cell(tier),
            str(r["finished"]),
            _fmt_seconds(r["p50_seconds"]),
            _fmt_seconds(r["p95_seconds"]),
            _fmt_seconds(r["p99_seconds"]),
            _fmt_seconds(r["slo_p99_seconds"]),
            verdict,
        )
    console.print(table)
    overall = status["fairness"].get("all")
    if overall and overall["jain_weighted"] is not None:
        console.print(
            f"Jain's fairness index: {overall['jain_weighted']:.3f} (weight-normalised), "
            f"{overall['jain_unweighted']:.3f} (raw) over {overall['tenants']} backlogged "
            "tenants"
        )
    else:
        backlogged = overall["tenants"] if overall else 0
        console.print(
            f"Jain's fairness index: no data ({backlogged} tenant(s) backlogged now; it needs "
            "two or more, served a DRR round)"
        )


def _render_demotions(status: dict[str, Any], console: Console) -> None:
    if not status["demotions"]:
        console.print("No tenant is demoted.")
        return
    table = Table(title="Demoted tenants (new jobs go to batch)")
    for col in ("tenant", "reason", "expires in s"):
        table.add_column(col)
    for r in status["demotions"]:
        table.add_row(cell(r["tenant_id"]), cell(r["reason"]), f"{r['expires_in_seconds']:.0f}")
    console.print(table)


def render_status(status: dict[str, Any], console: Console) -> None:
    """Print the tables of :func:`collect_status`."""
    depth = Table(title="Queue depth")
    for col in ("tier", "queued", "running", "oldest queued s"):
        depth.add_column(col, justify="right" if col != "tier" else "left")
    for tier, counts in status["depth"].items():
        depth.add_row(
            cell(tier),
            str(counts.get("queued", 0)),
            str(counts.get("running", 0)),
            _fmt_seconds(status["oldest_queued_seconds"].get(tier)),
        )
    console.print(depth)
    _render_latency(status, console)
    tenants = Table(title="Top tenants")
    for col in ("tenant", "queued", "running", "succeeded", "failed", "input tokens"):
        tenants.add_column(col, justify="right" if col != "tenant" else "left")
    for r in status["top_tenants"]:
        tenants.add_row(
            cell(r["tenant_id"]),
            str(r["queued"]),
            str(r["running"]),
            str(r["succeeded"]),
            str(r["failed"]),
            f"{r['input_tokens']:,}",
        )
    console.print(tenants)
    _render_demotions(status, console)
    throttled = status["throttles_last_minute"]
    total = sum(throttled.values())
    by_tenant = ", ".join(f"{printable(tenant)} {n}" for tenant, n in sorted(throttled.items()))
    console.print(  # markup=False: tenant ids are shown as they are (controls escaped)
        f"429/529 in the last minute: {total}" + (f" ({by_tenant})" if by_tenant else ""),
        markup=False,
    )
    lane = status.get("batches") or {}
    if lane.get("batches"):
        console.print(
            f"Batches lane: {lane['batches']:,} batches, {lane['requests']:,} requests "
            f"({lane['succeeded']:,} succeeded, {lane['errored']:,} errored, "
            f"{lane['expired']:,} expired, {lane['canceled']:,} canceled); "
            f"{lane['input_tokens']:,} input / {lane['output_tokens']:,} output tokens; "
            f"estimated cost saved ${lane['cost_saved_usd']:,.2f}",
            markup=False,
        )
    if lane.get("tenants"):
        table = Table(title="Batches lane per tenant")
        for col in ("tenant", "requests", "pending", "succeeded", "input tokens", "output tokens"):
            table.add_column(col, justify="right" if col != "tenant" else "left")
        table.add_column("cost saved $", justify="right")
        for r in lane["tenants"]:
            table.add_row(
                cell(r["tenant_id"]),
                f"{r['requests']:,}",
                f"{r['pending']:,}",
                f"{r['succeeded']:,}",
                f"{r['input_tokens']:,}",
                f"{r['output_tokens']:,}",
                f"{r['cost_saved_usd']:,.2f}",
            )
        console.print(table)
