"""``pgqueue simulate``: the backpressure experiment on the real queue and a real worker.

Producers faster than workers offer urgent and normal jobs; a :class:`~pgqueue.worker.runtime.
Worker` runs them with handlers that sleep a service time drawn per job (urgent short, normal
long). Two strategies are compared under each admission policy for normal work:

* ``fifo`` — one shared FIFO: every job is classified the same (standard tier, one tenant), so
  the scheduler cannot tell urgent from normal; one cap and one policy for all of it.
* ``weighted`` / ``probabilistic`` / ``strict`` — tiers + scheduler: urgent jobs are critical
  (own cap, policy ``block``), normal jobs are standard (cap + the normal policy), and the claim
  picks the tier by that ``pgqueue.tier_policy``.

Each scenario runs in a fresh database cloned from a migrated template, so scenarios share no
state. Latency is enqueue-to-finish by the database clock. The pure parts (drawing, percentiles,
summaries) are functions of their inputs; :func:`run_simulation` does the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgqueue.admission import set_admission
from pgqueue.db import migrate, queries
from pgqueue.enqueue import enqueue
from pgqueue.errors import InvalidArgument, QueueFull
from pgqueue.handlers.registry import Registry
from pgqueue.models import Job
from pgqueue.settings import Settings
from pgqueue.worker.runtime import Worker

STRATEGIES = ("fifo", "weighted", "probabilistic", "strict")
POLICIES = ("drop", "block", "reject")
URGENT_KIND = "simulate.urgent"
NORMAL_KIND = "simulate.normal"
TENANT = "simulate"
#: The prefix of a run's databases: its template ``pgqueue_simulate_<run>`` and one clone per
#: scenario, ``pgqueue_simulate_<run>_<n>``; all dropped when the run ends. Each run has names
#: of its own (found by a tester: two runs on one server, e.g. two tests side by side, dropped
#: each other's template mid-run when it was a fixed ``pgqueue_simulate``).
SIMULATE_DATABASE = "pgqueue_simulate"


@dataclass(frozen=True, slots=True)
class SimulateOptions:
    """The experiment. ``duration_seconds`` is the total measured time, split evenly over the
    scenarios (setup and teardown come on top, about a second per scenario)."""

    duration_seconds: float = 60.0
    strategies: tuple[str, ...] = STRATEGIES
    policies: tuple[str, ...] = POLICIES
    urgent_share: float = 0.1
    arrival_rate_per_second: float = 150.0
    workers: int = 24
    normal_cap: int = 40
    urgent_cap: int = 20
    urgent_service_seconds: tuple[float, float] = (0.05, 0.15)
    normal_service_seconds: tuple[float, float] = (0.2, 0.6)
    seed: int = 42

    def validate(self) -> None:
        """Raises :class:`InvalidArgument` for an unknown strategy or policy or a bad range."""
        for s in self.strategies:
            if s not in STRATEGIES:
                raise InvalidArgument(f"unknown strategy {s!r}; expected one of {STRATEGIES}")
        for p in self.policies:
            if p not in POLICIES:
                raise InvalidArgument(f"unknown normal policy {p!r}; expected one of {POLICIES}")
        if not self.strategies or not self.policies:
            raise InvalidArgument("give at least one strategy and one policy")
        if not 0 < self.urgent_share < 1:
            raise InvalidArgument("urgent_share must be between 0 and 1")
        for low, high in (self.urgent_service_seconds, self.normal_service_seconds):
            if not 0 <= low <= high:
                raise InvalidArgument("service time ranges need 0 <= low <= high")

    @property
    def scenarios(self) -> list[tuple[str, str]]:
        """(strategy, normal policy) pairs, in run order."""
        return [(s, p) for s in self.strategies for p in self.policies]

    @property
    def scenario_seconds(self) -> float:
        """Measured seconds per scenario."""
        return self.duration_seconds / len(self.scenarios)

    @property
    def urgent_service_mean_seconds(self) -> float:
        """Mean urgent service time (uniform draw)."""
        return sum(self.urgent_service_seconds) / 2


# ------------------------------------------------------------------------------- pure parts


def draw_service_seconds(rng: random.Random, bounds: tuple[float, float]) -> float:
    """One service time, uniform over ``bounds`` (the seed's base + jitter)."""
    low, high = bounds
    return low + rng.random() * (high - low)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..1) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, int(-(-q * len(ordered) // 1)))  # ceil(q * n), at least 1
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class ClassStats:
    """What happened to one class of jobs (urgent or normal) in one scenario."""

    offered: int = 0
    count: int = 0
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    dropped: int = 0
    rejected: int = 0
    unfinished: int = 0


@dataclass
class ScenarioResult:
    """One row of the experiment's table."""

    strategy: str
    normal_policy: str
    seconds: float
    backlog_mean: float
    urgent: ClassStats = field(default_factory=ClassStats)
    normal: ClassStats = field(default_factory=ClassStats)

    @property
    def name(self) -> str:
        """``strategy/policy``."""
        return f"{self.strategy}/{self.normal_policy}"


def summarize_latencies(stats: ClassStats, latencies_seconds: Sequence[float]) -> None:
    """Fill ``count`` and p50/p95/p99 (milliseconds) from finished jobs' latencies."""
    stats.count = len(latencies_seconds)
    for attr, q in (("p50_ms", 0.50), ("p95_ms", 0.95), ("p99_ms", 0.99)):
        value = percentile(latencies_seconds, q)
        setattr(stats, attr, None if value is None else round(value * 1000, 1))


def report(options: SimulateOptions, results: Sequence[ScenarioResult]) -> dict[str, Any]:
    """The JSON document of a run: options, one entry per scenario, and the verdicts."""
    bound_ms = 3 * options.urgent_service_mean_seconds * 1000
    tiered = [r for r in results if r.strategy != "fifo"]
    return {
        "options": asdict(options),
        "urgent_service_mean_ms": options.urgent_service_mean_seconds * 1000,
        "scenarios": [
            {
                "scenario": r.name,
                "strategy": r.strategy,
                "normal_policy": r.normal_policy,
                "seconds": round(r.seconds, 2),
                "backlog_mean": round(r.backlog_mean, 1),
                "urgent": asdict(r.urgent),
                "normal": asdict(r.normal),
            }
            for r in results
        ],
        "verdict": {
            "tiers_urgent_p95_bound_ms": bound_ms,
            "tiers_urgent_p95_within_bound": (
                all(r.urgent.p95_ms is not None and r.urgent.p95_ms <= bound_ms for r in tiered)
                if tiered
                else None
            ),
        },
    }


# ------------------------------------------------------------------------------------- I/O


def _recreate(server_dsn: str, name: str, template: str | None = None) -> str:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        ident = sql.Identifier(name)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
        if template is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(ident))
        else:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(ident, sql.Identifier(template))
            )
    return make_conninfo(server_dsn, dbname=name)


def _drop(server_dsn: str, name: str) -> None:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def _registry() -> Registry:
    registry = Registry()

    async def serve(job: Job) -> dict[str, Any]:
        await asyncio.sleep(float(job.payload["service_seconds"]))
        return {"ok": True}

    registry.register(URGENT_KIND, serve)
    registry.register(NORMAL_KIND, serve)
    return registry


def _produce(
    dsn: str,
    options: SimulateOptions,
    result: ScenarioResult,
    rng: random.Random,
    deadline: float,
) -> None:
    """The producer: Poisson arrivals at ``arrival_rate_per_second`` until ``deadline``
    (monotonic). A blocked enqueue ties the producer up, as in any real producer."""
    fifo = result.strategy == "fifo"
    with psycopg.connect(dsn, autocommit=True) as conn:
        next_at = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= deadline:
                return
            if next_at > now:
                time.sleep(next_at - now)
                continue
            next_at = max(next_at, now - 0.05) + rng.expovariate(options.arrival_rate_per_second)
            urgent = rng.random() < options.urgent_share
            stats = result.urgent if urgent else result.normal
            bounds = options.urgent_service_seconds if urgent else options.normal_service_seconds
            stats.offered += 1
            try:
                job_id = enqueue(
                    conn,
                    tenant_id=TENANT,
                    origin="user_action" if urgent and not fifo else "scheduled",
                    sla_seconds=None if urgent and not fifo else 60.0,
                    kind=URGENT_KIND if urgent else NORMAL_KIND,
                    payload={"service_seconds": draw_service_seconds(rng, bounds)},
                    block_timeout_seconds=max(deadline - time.monotonic(), 0.0),
                )
            except QueueFull:
                stats.rejected += 1
                continue
            if job_id is None:
                stats.dropped += 1


def _configure(dsn: str, options: SimulateOptions, strategy: str, policy: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        set_admission(conn, "standard", max_queued=options.normal_cap, policy=policy)
        if strategy != "fifo":
            set_admission(conn, "critical", max_queued=options.urgent_cap, policy="block")


def _collect(dsn: str, result: ScenarioResult) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = queries.run(conn, "simulate_latencies")
        unfinished = queries.run(conn, "simulate_unfinished")
    lat: dict[str, list[float]] = {URGENT_KIND: [], NORMAL_KIND: []}
    for r in rows:
        lat[r["kind"]].append(float(r["latency_seconds"]))
    summarize_latencies(result.urgent, lat[URGENT_KIND])
    summarize_latencies(result.normal, lat[NORMAL_KIND])
    for r in unfinished:
        target = result.urgent if r["kind"] == URGENT_KIND else result.normal
        target.unfinished = int(r["jobs"])


async def _scenario(
    dsn: str, options: SimulateOptions, strategy: str, policy: str, seed: int
) -> ScenarioResult:
    result = ScenarioResult(strategy, policy, options.scenario_seconds, 0.0)
    worker_dsn = make_conninfo(
        dsn, options=f"-c pgqueue.tier_policy={'weighted' if strategy == 'fifo' else strategy}"
    )
    settings = Settings(
        poll_interval_seconds=0.2,
        counters_compact_interval_seconds=0.5,
        shutdown_grace_seconds=0.0,
    )
    worker = Worker(worker_dsn, settings, _registry(), concurrency=options.workers, seed=seed)
    work = asyncio.create_task(worker.run(install_signal_handlers=False))
    await asyncio.sleep(0.3)  # the worker connects and listens before the clock starts
    deadline = time.monotonic() + options.scenario_seconds
    rng = random.Random(seed)
    producer = threading.Thread(
        target=_produce, args=(dsn, options, result, rng, deadline), daemon=True
    )
    producer.start()
    samples: list[float] = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = await queries.arun(conn, "simulate_backlog")
            samples.append(float(row["queued"]))
            await asyncio.sleep(0.1)
    await asyncio.to_thread(producer.join)
    worker.request_stop(hard=True)
    with contextlib.suppress(asyncio.CancelledError):
        await work
    result.backlog_mean = sum(samples) / len(samples) if samples else 0.0
    await asyncio.to_thread(_collect, dsn, result)
    return result


def run_simulation(
    server_dsn: str,
    options: SimulateOptions | None = None,
    progress: Callable[[ScenarioResult], None] | None = None,
) -> list[ScenarioResult]:
    """Run every scenario of ``options`` on the server of ``server_dsn``, in databases of its
    own (``pgqueue_simulate_<run>`` and its clones, dropped at the end; the user's queue is
    never touched).

    Raises:
        InvalidArgument: bad options. psycopg.Error: the role may not create databases, or
            the database failed.
    """
    opts = options or SimulateOptions()
    opts.validate()
    # The simulation's workers run only its own kinds: the no-API-key warning is noise here.
    logging.getLogger("pgqueue.worker").setLevel(logging.ERROR)
    template = f"{SIMULATE_DATABASE}_{uuid.uuid4().hex[:8]}"
    results: list[ScenarioResult] = []
    try:
        migrate.upgrade(_recreate(server_dsn, template))
        for index, (strategy, policy) in enumerate(opts.scenarios):
            name = f"{template}_{index}"
            dsn = _recreate(server_dsn, name, template=template)
            try:
                _configure(dsn, opts, strategy, policy)
                result = asyncio.run(_scenario(dsn, opts, strategy, policy, opts.seed + index))
            finally:
                _drop(server_dsn, name)
            results.append(result)
            if progress is not None:
                progress(result)
    finally:
        _drop(server_dsn, template)
    return results


def require_matplotlib() -> None:
    """Raises :class:`InvalidArgument` when matplotlib (the ``plot`` extra) is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InvalidArgument(
            "--plot needs matplotlib: the plot extra (pip install -e '.[plot]' in the pgqueue "
            "checkout)"
        ) from None


def plot(results: Sequence[ScenarioResult], path: str, bound_ms: float) -> None:
    """Bar chart of urgent p95 per scenario (log scale) with the 3 × service bound.

    Raises:
        InvalidArgument: matplotlib is not installed (the ``plot`` extra).
    """
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.name for r in results]
    values = [r.urgent.p95_ms or 0.0 for r in results]
    colors = ["tab:red" if r.strategy == "fifo" else "tab:blue" for r in results]
    fig, ax = plt.subplots(figsize=(max(6, len(names) * 0.8), 4))
    ax.bar(names, values, color=colors)
    ax.axhline(bound_ms, color="black", linestyle="--", label="3 × urgent service time")
    ax.set_yscale("log")
    ax.set_ylabel("urgent p95 latency (ms)")
    ax.set_title("pgqueue simulate: shared FIFO (red) vs tiers + scheduler (blue)")
    ax.legend()
    plt.setp(ax.get_xticklabels(), rotation=45, ha="right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
