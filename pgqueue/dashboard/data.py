"""What the dashboard's pages show, read by named statements on the caller's connection.

The overview runs the statements ``pgqueue status`` and ``pgqueue limits list`` run (the views
``latency_slo``, ``fairness`` and ``rate_limit_state``, demotions and throttle events) and
one of its own, depth per lane and tier, whose sums per tier are ``queue_depth``'s numbers
(that view reads the whole table at 1M jobs; see ``sql/queries/dashboard.sql``).
Collectors return plain dicts for the templates; :func:`slo_class` is the one colour rule.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import psycopg

from pgqueue.batches.outcomes import cost_saved_usd
from pgqueue.db import queries
from pgqueue.models import Tier
from pgqueue.settings import Settings

#: Rows of ``pgqueue.claim_order`` the schedule page shows.
SCHEDULE_ROWS = 50
#: Tenants the tenants page shows at most.
TENANT_ROWS = 500
#: The window of "now" for 429s (as ``pgqueue status`` and the metrics exporter: 60 s).
THROTTLE_WINDOW_SECONDS = 60.0
#: A latency above this share of its SLO, but within it, is shown as a warning.
SLO_WARN_SHARE = 0.8


def slo_class(seconds: float | None, slo_seconds: float | None) -> str:
    """The colour class of a latency against its SLO: ``none`` (no data), ``ok`` (at most
    :data:`SLO_WARN_SHARE` of the SLO), ``warn`` (up to the SLO) or ``bad`` (over it)."""
    if seconds is None or slo_seconds is None:
        return "none"
    if seconds <= SLO_WARN_SHARE * slo_seconds:
        return "ok"
    return "warn" if seconds <= slo_seconds else "bad"


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    return {k: float(v) if isinstance(v, Decimal) else v for k, v in row.items()}


def _share(part: float | None, whole: float | None) -> float:
    if not part or not whole:
        return 0.0
    return max(0.0, min(1.0, part / whole))


def depth(conn: psycopg.Connection[Any], *, window_seconds: float) -> dict[str, Any]:
    """The overview's depth: ``lanes`` (per lane: queued, due, running per tier) and ``depth``
    (per tier: their sums and the oldest queued job's age in seconds). ``window_seconds`` is
    not used (every part of the overview takes it)."""
    tiers = [t.value for t in Tier]
    lanes: dict[str, dict[str, dict[str, Any]]] = {}
    totals: dict[str, dict[str, Any]] = {
        t: {"tier": t, "queued": 0, "due": 0, "running": 0, "oldest_queued_seconds": None}
        for t in tiers
    }
    for r in queries.run(conn, "dashboard_depth_by_lane"):
        counts = {k: int(r[k]) for k in ("queued", "due", "running")}
        lanes.setdefault(r["lane"], {})[r["tier"]] = counts
        total = totals[r["tier"]]
        for k, v in counts.items():
            total[k] += v
        oldest = r["oldest_queued_seconds"]
        if oldest is not None and (total["oldest_queued_seconds"] or 0.0) < oldest:
            total["oldest_queued_seconds"] = oldest
    return {
        "tiers": tiers,
        "depth": list(totals.values()),
        "lanes": [{"lane": lane, "tiers": counts} for lane, counts in sorted(lanes.items())],
    }


def fairness(conn: psycopg.Connection[Any], *, window_seconds: float) -> dict[str, Any]:
    """Jain's index (``pgqueue.fairness_in`` over ``window_seconds``): ``fairness``, all tiers
    as ``all`` and per tier; None where there is no data."""
    window = {"window_seconds": window_seconds}
    rows = queries.run(conn, "report_fairness", window)
    return {"fairness": {(r["tier"] or "all"): _plain(r) for r in rows}}


def service(conn: psycopg.Connection[Any], *, window_seconds: float) -> dict[str, Any]:
    """The overview's service and pressure: ``latency`` (per tier: p50/p95/p99 over
    ``window_seconds`` against the SLO, with colour classes), ``demotions`` (now),
    ``throttles_by_tenant`` / ``throttles_by_model`` / ``throttles_total`` (429/529 in the
    last minute), ``models`` (each model's three buckets, their share available, and
    cooldown)."""
    window = {"window_seconds": window_seconds}
    latency = []
    for r in queries.run(conn, "report_latency_slo", window):
        row = _plain(r)
        for p in ("p50", "p95", "p99"):
            row[f"{p}_class"] = slo_class(row[f"{p}_seconds"], row["slo_p99_seconds"])
        latency.append(row)
    recent = {"window_seconds": THROTTLE_WINDOW_SECONDS}
    by_tenant = [_plain(r) for r in queries.run(conn, "report_throttles_by_tenant", recent)]
    by_model = [_plain(r) for r in queries.run(conn, "dashboard_throttles_by_model", recent)]
    models = []
    for r in queries.run(conn, "ratelimit_list"):
        row = _plain(r)
        for bucket in ("requests", "input_tokens", "output_tokens"):
            row[f"{bucket}_share"] = _share(row[f"{bucket}_available"], row[f"{bucket}_per_minute"])
        models.append(row)
    return {
        "window_seconds": window_seconds,
        "latency": latency,
        "demotions": [_plain(r) for r in queries.run(conn, "report_demotions")],
        "throttles_by_tenant": by_tenant,
        "throttles_by_model": by_model,
        "throttles_total": sum(int(r["throttles"]) for r in by_model),
        "models": models,
    }


#: The overview's parts read on every page: independent, so the dashboard runs them side by
#: side on connections of their own. :func:`fairness` is read apart, in the background.
OVERVIEW_PARTS = (depth, service)


def overview(conn: psycopg.Connection[Any], *, window_seconds: float) -> dict[str, Any]:
    """Everything the overview shows (:func:`depth`, :func:`service`, :func:`fairness`), read
    one after the other on ``conn``."""
    found: dict[str, Any] = {}
    for part in (*OVERVIEW_PARTS, fairness):
        found.update(part(conn, window_seconds=window_seconds))
    return found


def tenants(
    conn: psycopg.Connection[Any], *, window_seconds: float, settings: Settings | None = None
) -> list[dict[str, Any]]:
    """Per tenant (at most :data:`TENANT_ROWS`, busiest first): plan, quantum, cost served
    over ``window_seconds`` and its share of all service against its weight share (its quantum
    over the quanta of the tenants served or queued), queued jobs, 429s in the last minute,
    demoted until, today's input tokens against the daily budget (``budget_share``), and the
    batches lane's tokens with ``batch_cost_saved_usd`` (USD, at the prices of ``settings``,
    default ``Settings()``; :func:`pgqueue.batches.outcomes.cost_saved_usd`)."""
    prices = settings or Settings()
    rows = queries.run(
        conn, "dashboard_tenants", {"window_seconds": window_seconds, "limit": TENANT_ROWS}
    )
    out = []
    for r in rows:
        row = _plain(r)
        row["budget_share"] = _share(row["input_tokens_today"], row["daily_token_budget"])
        row["budget_used"] = (
            row["input_tokens_today"] / row["daily_token_budget"]
            if row["daily_token_budget"]
            else None
        )
        row["batch_cost_saved_usd"] = cost_saved_usd(
            int(row["batch_input_tokens"]),
            int(row["batch_output_tokens"]),
            input_usd_per_mtok=prices.price_input_usd_per_mtok,
            output_usd_per_mtok=prices.price_output_usd_per_mtok,
            discount=prices.batches_discount,
        )
        out.append(row)
    return out


def schedule(conn: psycopg.Connection[Any], *, rows: int = SCHEDULE_ROWS) -> dict[str, Any]:
    """The first ``rows`` rows of ``pgqueue.claim_order``: per tier and lane, the stamped jobs
    in the order their claims take them. ``columns`` (the view's, in order), ``rows``, and
    ``unstamped``: the lanes and tiers (``{"lane", "tier"}``) whose due jobs have no key yet,
    which the next claim stamps. Read-only: nothing is stamped or claimed here."""
    found = [_plain(r) for r in queries.run(conn, "dashboard_claim_order", {"limit": rows})]
    unstamped = [_plain(r) for r in queries.run(conn, "dashboard_unstamped")]
    columns = list(found[0]) if found else []
    return {"columns": columns, "rows": found, "unstamped": unstamped}
