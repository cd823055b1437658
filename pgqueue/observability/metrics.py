"""Prometheus metrics: the article's six ``claude_*`` series and pgqueue's own.

Two sources, so that nothing is double counted when several processes are scraped and summed:

* :class:`DatabaseCollector` derives every database-wide fact — queue depth, throttles per
  tenant, demoted tenants, Jain's fairness index, input tokens per tenant, and the
  enqueue-to-finish latency histogram (fed incrementally from finished jobs) — and is served
  by ONE process per database: ``pgqueue metrics --port P``.
* Each worker (``pgqueue work --metrics-port P``) serves only its own process series
  (``pgqueue_*``): claims, claim latency, outcomes, retries by reason, rescues and slots in
  use. These add up correctly across workers.

Per-tenant labels are capped (``top_tenants``, by traffic) with the rest summed as ``other``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pgqueue.batches.outcomes import cost_saved_usd
from pgqueue.db import queries
from pgqueue.display import printable
from pgqueue.models import Deferred, Failed, Interrupted, Outcome, Succeeded, Throttled
from pgqueue.settings import Settings

log = logging.getLogger(__name__)

#: Latency buckets (seconds) that resolve the SLOs 2 s / 6 s / 120 s.
LATENCY_BUCKETS_SECONDS = (
    0.1,
    0.25,
    0.5,
    1,
    1.5,
    2,
    3,
    4,
    6,
    10,
    20,
    30,
    60,
    90,
    120,
    180,
    300,
    600,
)
TIERS = ("critical", "standard", "batch")

# --------------------------------------------------------------------- worker process series
WORKER_REGISTRY = CollectorRegistry(auto_describe=True)
CLAIMS = Counter("pgqueue_claims", "Claim statements run by this worker.", registry=WORKER_REGISTRY)
JOBS_CLAIMED = Counter(
    "pgqueue_jobs_claimed", "Jobs claimed by this worker.", ["priority"], registry=WORKER_REGISTRY
)
CLAIM_SECONDS = Histogram(
    "pgqueue_claim_duration_seconds",
    "Time of one claim statement (tier pick + DRR + lease), seconds.",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1),
    registry=WORKER_REGISTRY,
)
OUTCOMES = Counter(
    "pgqueue_job_outcomes",
    "Outcomes recorded by this worker (succeeded, retried, failed, throttled, deferred, ...).",
    ["outcome"],
    registry=WORKER_REGISTRY,
)


RETRIES = Counter(
    "pgqueue_retries",
    "Jobs sent back to the queue by reason (error, throttle, shutdown, deferred).",
    ["reason"],
    registry=WORKER_REGISTRY,
)


_OUTCOME_CHILDREN: dict[str, Any] = {}
_CLAIMED_CHILDREN: dict[str, Any] = {}


def count_claimed(tier: str, jobs: int) -> None:
    """Count ``jobs`` claimed of ``tier`` (``JOBS_CLAIMED``; its labelled children are kept, as
    in :func:`count_outcome`)."""
    child = _CLAIMED_CHILDREN.get(tier)
    if child is None:
        child = _CLAIMED_CHILDREN.setdefault(tier, JOBS_CLAIMED.labels(tier))
    child.inc(jobs)


def count_outcome(outcome: Outcome, state: str | None) -> None:
    """Count one recorded outcome (``OUTCOMES``: succeeded, failed, throttled, deferred,
    interrupted, lease_lost, cancelled, unrecorded), and the reason when the job went back
    to the queue (``RETRIES``). ``state`` is what was recorded: None when the lease was lost,
    ``cancelled`` when the job was cancelled (or its row deleted) while it ran,
    ``unrecorded`` when the write failed or was given up; a success whose result could not
    be stored counts as failed.

    The labelled children are kept: ``labels()`` takes a lock and builds a key per call, a
    visible part of a no-op job's cost on the worker.
    """
    if state is None:
        name = "lease_lost"
    elif state in ("cancelled", "unrecorded"):  # cancelled while it ran; a write given up
        name = state
    elif state == "failed" and isinstance(outcome, Succeeded):
        name = "failed"
    else:
        name = type(outcome).__name__.lower()
    child = _OUTCOME_CHILDREN.get(name)
    if child is None:
        child = _OUTCOME_CHILDREN.setdefault(name, OUTCOMES.labels(name))
    child.inc()
    if state != "queued":
        return
    if isinstance(outcome, Failed):
        RETRIES.labels("error").inc()
    elif isinstance(outcome, Throttled):
        RETRIES.labels("throttle").inc()
    elif isinstance(outcome, Interrupted):
        RETRIES.labels("shutdown").inc()
    elif isinstance(outcome, Deferred):
        RETRIES.labels("deferred").inc()


RATELIMIT_WAITS = Counter(
    "pgqueue_ratelimit_waits",
    "Claims stopped because the provider's limits had no room for the next job.",
    registry=WORKER_REGISTRY,
)
RESCUED = Counter(
    "pgqueue_rescued_jobs",
    "Jobs with an expired lease returned by this worker's rescuer.",
    registry=WORKER_REGISTRY,
)
SLOTS_IN_USE = Gauge(
    "pgqueue_worker_slots_in_use", "Jobs this worker runs now.", registry=WORKER_REGISTRY
)
SLOTS = Gauge("pgqueue_worker_slots", "This worker's concurrency.", registry=WORKER_REGISTRY)

# Admission control, counted by the process that enqueues (producers share this registry).
ADMISSION_REJECTED = Counter(
    "pgqueue_admission_rejected",
    "Enqueue calls refused with QueueFull, by tier, policy (reject, or block after waiting or "
    "inside a transaction) and the cap reached (tier or tenant).",
    ["tier", "policy", "scope"],
    registry=WORKER_REGISTRY,
)
ADMISSION_DROPPED = Counter(
    "pgqueue_admission_dropped",
    "Jobs not stored because their tier was full and its policy is drop.",
    ["tier", "scope"],
    registry=WORKER_REGISTRY,
)
ADMISSION_BLOCKED = Counter(
    "pgqueue_admission_blocked",
    "Enqueue calls that waited for room in a full tier whose policy is block.",
    ["tier"],
    registry=WORKER_REGISTRY,
)
ADMISSION_BLOCK_SECONDS = Histogram(
    "pgqueue_admission_block_duration_seconds",
    "Time blocked enqueue calls waited for room (admitted or timed out), seconds.",
    ["tier"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=WORKER_REGISTRY,
)


# ------------------------------------------------------------------------ database series
def _or_nan(value: Any) -> float:
    """A number read from the database, NaN for NULL (no data: Prometheus' way to say it, and
    no alert on ``< threshold`` fires on it)."""
    return math.nan if value is None else float(value)


def _cap(values: dict[str, float], top: int) -> dict[str, float]:
    """Keep the ``top`` largest labels; sum the rest under ``other``."""
    ranked = sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))
    kept = dict(ranked[:top])
    rest = sum(v for _k, v in ranked[top:])
    if len(ranked) > top:
        kept["other"] = kept.get("other", 0.0) + rest
    return kept


#: How long the exporter waits to connect and for each statement of a refresh, seconds.
EXPORTER_TIMEOUT_SECONDS = 10.0


class DatabaseCollector(Collector):
    """Collects the six ``claude_*`` series from the database, at most every
    ``refresh_seconds`` (default 30 s: a scrape in between serves the cached values).

    ``claude_request_latency_seconds`` is a histogram this collector accumulates from jobs as
    they finish (a cursor over ``finished_at``), so it is monotonic like any histogram; it
    starts at the jobs finished after the collector's start. A failed refresh raises nothing:
    the last values are served, ``pgqueue_exporter_up`` reads 0 until a refresh succeeds
    again, ``pgqueue_exporter_errors`` counts it, and the first failure and the recovery are
    logged (found by a tester: a database down looked like an empty, fair queue).
    """

    def __init__(
        self,
        dsn: str,
        *,
        refresh_seconds: float = 30.0,
        top_tenants: int = 20,
        timeout_seconds: float = EXPORTER_TIMEOUT_SECONDS,
    ) -> None:
        self._dsn = dsn
        self._timeout = timeout_seconds
        self._refresh_seconds = refresh_seconds
        self._top = top_tenants
        self._lock = threading.Lock()
        self._refreshed = float("-inf")
        self._errors = 0
        self._up = False
        self._snapshot: dict[str, Any] = {}
        self._cursor: tuple[datetime, int] = (datetime.now(UTC), 0)
        self._buckets = {tier: [0] * len(LATENCY_BUCKETS_SECONDS) for tier in TIERS}
        self._counts = dict.fromkeys(TIERS, 0)
        self._sums = dict.fromkeys(TIERS, 0.0)
        self._settings = Settings()  # the prices of the cost saved by the batches lane

    def refresh(self, *, force: bool = False, raise_errors: bool = False) -> None:
        """Read the database now if the cache is older than ``refresh_seconds``.

        Raises:
            psycopg.Error: only with ``raise_errors`` (``pgqueue metrics`` checks the database
                once before it serves), when the database cannot be read.
        """
        with self._lock:
            if not force and time.monotonic() - self._refreshed < self._refresh_seconds:
                return
            try:
                with psycopg.connect(
                    self._dsn, autocommit=True, connect_timeout=max(1, round(self._timeout))
                ) as conn:
                    # a held lock or a stuck server fails the refresh instead of the scrape
                    # hanging (found by a tester: 30 s and more, reported as up)
                    conn.execute(
                        "SELECT set_config('statement_timeout', %s, false)",
                        (f"{round(self._timeout * 1000)}ms",),
                    )
                    self._snapshot = self._read(conn)
                    self._read_latencies(conn)
            except psycopg.Error as exc:
                self._errors += 1
                if self._up:
                    log.warning("cannot read the database; serving the last values: %s", exc)
                self._up = False
                if raise_errors:
                    raise
                return
            if not self._up and self._errors:
                log.warning("the database can be read again")
            self._up = True
            self._refreshed = time.monotonic()

    def _read(self, conn: psycopg.Connection[Any]) -> dict[str, Any]:
        depth = {r["tier"]: float(r["queued"]) for r in queries.run(conn, "metrics_queue_depth")}
        throttles = {
            r["tenant_id"]: float(r["throttles"])
            for r in queries.run(conn, "metrics_throttles_by_tenant")
        }
        demoted = queries.run(conn, "metrics_demoted_tenants")["demoted"]
        fairness = queries.run(conn, "metrics_fairness")
        tokens = {
            r["tenant_id"]: float(r["input_tokens"])
            for r in queries.run(conn, "metrics_input_tokens_by_tenant")
        }
        admission = {r["tier"]: r for r in queries.run(conn, "admission_status")}
        lane = {k: float(v) for k, v in queries.run(conn, "batch_totals").items()}
        return {
            "batches": lane,
            "depth": depth,
            "throttles": _cap(throttles, self._top),
            "demoted": float(demoted),
            "fairness": _or_nan(fairness["jain_weighted"]),
            "fairness_unweighted": _or_nan(fairness["jain_unweighted"]),
            "tokens": _cap(tokens, self._top),
            "dropped": {t: float(r["dropped"]) for t, r in admission.items()},
            "caps": {
                t: float(r["max_queued"])
                for t, r in admission.items()
                if r["max_queued"] is not None
            },
        }

    def _read_latencies(self, conn: psycopg.Connection[Any]) -> None:
        while True:
            rows = queries.run(
                conn,
                "metrics_finished_since",
                {"after_time": self._cursor[0], "after_id": self._cursor[1], "limit": 5000},
            )
            for r in rows:
                tier, seconds = r["tier"], max(0.0, float(r["latency_seconds"]))
                self._counts[tier] += 1
                self._sums[tier] += seconds
                for i, bound in enumerate(LATENCY_BUCKETS_SECONDS):
                    if seconds <= bound:
                        self._buckets[tier][i] += 1
                self._cursor = (r["finished_at"], r["id"])
            if len(rows) < 5000:
                return

    def collect(self) -> Iterable[Metric]:
        """Serve the (refreshed if stale) values; the registry calls this on every scrape."""
        self.refresh()
        snap = self._snapshot
        yield from self._families(snap)

    def _families(self, snap: dict[str, Any]) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "claude_queue_depth", "Queued jobs per priority tier.", labels=["priority"]
        )
        for tier in TIERS:
            depth.add_metric([tier], snap.get("depth", {}).get(tier, 0.0))
        yield depth
        latency = HistogramMetricFamily(
            "claude_request_latency_seconds",
            "Enqueue-to-finish latency per priority tier, seconds.",
            labels=["priority"],
        )
        for tier in TIERS:
            buckets = [
                (str(bound), float(count))
                for bound, count in zip(LATENCY_BUCKETS_SECONDS, self._buckets[tier], strict=True)
            ]
            buckets.append(("+Inf", float(self._counts[tier])))
            latency.add_metric([tier], buckets, self._sums[tier])
        yield latency
        throttle = GaugeMetricFamily(
            "claude_throttle_count",
            "429/529 answers attributed to each tenant in the last 60 s.",
            labels=["tenant_id"],
        )
        for tenant, value in sorted(snap.get("throttles", {}).items()):
            throttle.add_metric([printable(tenant)], value)
        yield throttle
        yield GaugeMetricFamily(
            "claude_demoted_tenants",
            "Tenants demoted to batch now.",
            value=snap.get("demoted", 0.0),
        )
        yield GaugeMetricFamily(
            "claude_drr_fairness_index",
            "Jain's fairness index (5 min, weight-normalised cost served, backlogged tenants; "
            "NaN: no data).",
            value=snap.get("fairness", math.nan),
        )
        yield GaugeMetricFamily(
            "pgqueue_fairness_index_unweighted",
            "Jain's index over raw cost served (5 min; NaN: no data).",
            value=snap.get("fairness_unweighted", math.nan),
        )
        tokens = CounterMetricFamily(
            "claude_input_tokens", "Input tokens charged per tenant.", labels=["tenant_id"]
        )
        for tenant, value in sorted(snap.get("tokens", {}).items()):
            tokens.add_metric([printable(tenant)], value)
        yield tokens
        dropped = CounterMetricFamily(
            "pgqueue_admission_dropped_jobs",
            "Jobs admission control dropped (tier full, policy drop), from the database.",
            labels=["priority"],
        )
        for tier in TIERS:
            dropped.add_metric([tier], snap.get("dropped", {}).get(tier, 0.0))
        yield dropped
        caps = GaugeMetricFamily(
            "pgqueue_admission_max_queued_jobs",
            "The tier's cap of queued jobs (tiers without a cap are absent).",
            labels=["priority"],
        )
        for tier, value in sorted(snap.get("caps", {}).items()):
            caps.add_metric([tier], value)
        yield caps
        yield from self._batch_families(snap.get("batches", {}))
        yield CounterMetricFamily(
            "pgqueue_exporter_errors", "Failed database refreshes.", value=float(self._errors)
        )
        yield GaugeMetricFamily(
            "pgqueue_exporter_up",
            "1 when the last database refresh succeeded; 0: the other series hold old values.",
            value=1.0 if self._up else 0.0,
        )

    def _batch_families(self, lane: dict[str, float]) -> Iterator[Metric]:
        """The batches lane: requests by result, tokens by direction, and the estimated cost
        saved (docs/batches.md) at the price settings of this process."""
        requests = CounterMetricFamily(
            "pgqueue_batches_requests", "Requests of ended Message Batches.", labels=["result"]
        )
        for result in ("succeeded", "errored", "expired", "canceled"):
            requests.add_metric([result], lane.get(result, 0.0))
        yield requests
        tokens = CounterMetricFamily(
            "pgqueue_batches_tokens",
            "Tokens of succeeded Message Batch requests.",
            labels=["direction"],
        )
        for direction in ("input", "output"):
            tokens.add_metric([direction], lane.get(f"{direction}_tokens", 0.0))
        yield tokens
        s = self._settings
        yield GaugeMetricFamily(
            "pgqueue_batches_cost_saved_usd",
            "Estimated dollars the batches lane saved against the Messages API's prices.",
            value=cost_saved_usd(
                int(lane.get("input_tokens", 0)),
                int(lane.get("output_tokens", 0)),
                input_usd_per_mtok=s.price_input_usd_per_mtok,
                output_usd_per_mtok=s.price_output_usd_per_mtok,
                discount=s.batches_discount,
            ),
        )


def database_registry(dsn: str, *, check: bool = False, **options: Any) -> CollectorRegistry:
    """A registry holding one :class:`DatabaseCollector` for ``dsn``.

    Raises:
        psycopg.Error: with ``check``, when the database cannot be read now (unreachable, or
            no pgqueue schema).
    """
    collector = DatabaseCollector(dsn, **options)
    if check:
        collector.refresh(force=True, raise_errors=True)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
