"""``pgqueue demo``: the same arrivals through a plain FIFO queue and through pgqueue, side by side.

The arrivals are the first ``requests`` of the Azure LLM inference trace 2023 (CC-BY 4.0; Patel
et al., "Splitwise", ISCA 2024), replayed ``speedup`` × faster across eight tenants, one of them
(``t00``) a runaway with 40 % of the requests. Two arms run at once, each in a database of its
own on the same server, with a worker and a sandbox Messages API of its own:

* **plain FIFO**: every job is enqueued under one tenant with one SLA, so the claim serves them
  in arrival order, as a plain ``SKIP LOCKED`` queue does (demotion is switched off there: one
  tenant carries everyone's tokens);
* **pgqueue**: each job under its own tenant and origin: tiers, DRR between tenants, demotion.

Everything else is the same: the worker, its slots, the shared limiter and the retries, and the
provider's limits, scaled so that it can serve 1 / ``load`` of what the trace slice asks for,
with its buckets spent at the start (as mid-way through a busy hour; full buckets hold a minute
of capacity and would hide the backlog). The difference between the arms is the schedule alone.
Both databases are dropped at the end (``keep`` leaves them), so two demos never meet.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import SecretStr

from pgqueue.batch import JobSpec
from pgqueue.db import migrate, queries
from pgqueue.demo_figures import ArmFigures, JobTimes, arm_figures
from pgqueue.enqueue import enqueue
from pgqueue.handlers.registry import NOOP_KIND
from pgqueue.models import Origin
from pgqueue.progress import Phases
from pgqueue.replay import replay_plan
from pgqueue.sandbox import SandboxConfig, running_sandbox
from pgqueue.scheduling.tiers import classify
from pgqueue.settings import Settings
from pgqueue.trace import PlannedJob, load_trace, plan_replay
from pgqueue.worker.runtime import Worker

#: The default per-minute limits the provider's are scaled from (Anthropic's tier 1).
DEFAULT_LIMITS = (50, 40_000, 8_000)
ARMS = ("fifo", "pgqueue")
#: The FIFO arm's one tenant and its SLA (seconds): the standard tier for every job.
FIFO_TENANT = "fifo"
FIFO_SLA_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class CompareOptions:
    """The demo's size. ``requests`` from the trace (``trace``: a CSV, None for the bundled
    one), ``speedup`` × faster, over ``tenants`` tenants; ``concurrency`` slots per arm;
    ``load`` = what the slice asks for / what the provider serves (> 1: a backlog builds);
    each output token takes ``seconds_per_output_token``; after the last arrival the arms get
    at most ``drain_seconds`` to finish. ``keep`` leaves the two databases on the server."""

    requests: int = 400
    speedup: float = 5.0
    concurrency: int = 16
    load: float = 1.4
    tenants: int = 8
    seed: int = 0
    trace: Path | None = None
    model: str = "claude-haiku-4-5"
    seconds_per_output_token: float = 0.002
    drain_seconds: float = 25.0
    keep: bool = False


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during the demo: its workers and sandboxes are stopped, its databases (``dsns``)
    dropped unless kept."""

    def __init__(self, dsns: dict[str, str]) -> None:
        super().__init__()
        self.dsns = dsns


@dataclass(frozen=True, slots=True)
class Comparison:
    """The outcome: both arms' figures, the provider's limits per minute (requests, input and
    output tokens), the run's wall time, and the databases' DSNs (dropped unless kept)."""

    fifo: ArmFigures
    pgqueue: ArmFigures
    limits_per_minute: tuple[int, int, int]
    seconds: float
    dsns: dict[str, str]


def provider_limits(plan: list[PlannedJob], load: float) -> tuple[int, int, int]:
    """Per-minute limits (requests, input, output tokens) that serve 1 / ``load`` of what
    ``plan`` asks for: the defaults 50 / 40,000 / 8,000 scaled alike until the binding one
    (the largest demand against its default) is ``load`` times too small."""
    span = max(plan[-1].at_seconds if plan else 0.0, 1.0) / 60.0
    demand = (
        len(plan) / span,
        sum(j.input_tokens for j in plan) / span,
        sum(j.output_tokens for j in plan) / span,
    )
    scale = max(d / limit for d, limit in zip(demand, DEFAULT_LIMITS, strict=True)) / load
    return (
        max(1, round(DEFAULT_LIMITS[0] * scale)),
        max(1, round(DEFAULT_LIMITS[1] * scale)),
        max(1, round(DEFAULT_LIMITS[2] * scale)),
    )


def _fifo_spec(job: PlannedJob) -> JobSpec:
    return JobSpec(FIFO_TENANT, Origin.SCHEDULED, job.payload, FIFO_SLA_SECONDS)


def _pgqueue_spec(job: PlannedJob) -> JobSpec:
    return JobSpec(job.tenant_id, job.origin, job.payload, job.sla_seconds)


def _database_dsns(server_dsn: str, run: str) -> dict[str, str]:
    """The DSNs of the arms' databases on the server of ``server_dsn``."""
    return {arm: make_conninfo(server_dsn, dbname=f"pgqueue_demo_{run}_{arm}") for arm in ARMS}


def _create_databases(server_dsn: str, dsns: dict[str, str]) -> None:
    """Create and migrate the arms' databases (the second cloned from the first)."""
    names = {arm: str(conninfo_to_dict(dsn)["dbname"]) for arm, dsn in dsns.items()}
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(names["pgqueue"])))
    migrate.upgrade(dsns["pgqueue"])
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(names["fifo"]), sql.Identifier(names["pgqueue"])
            )
        )
        # One tenant carries every tenant's tokens in the FIFO arm: no demotion there.
        for setting, value in (
            ("pgqueue.default_daily_budget", "1000000000000"),
            ("pgqueue.demotion_throttle_threshold", "1000000000"),
        ):
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(names["fifo"]),
                    sql.Identifier(*setting.split(".")),
                    sql.Literal(value),
                )
            )


def drop_databases(server_dsn: str, dsns: dict[str, str]) -> None:
    """Drop the arms' databases (those that exist)."""
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        for dsn in dsns.values():
            name = str(conninfo_to_dict(dsn)["dbname"])
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _spend_the_limiter(dsn: str, model: str, limits: tuple[int, int, int]) -> None:
    """Set the shared limiter to the provider's limits, its buckets spent (as the sandbox's)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        queries.run(
            conn,
            "ratelimit_set",
            {"model": model, "rpm": limits[0], "itpm": limits[1], "otpm": limits[2]},
        )
        queries.run(
            conn,
            "ratelimit_observe",
            {
                "model": model,
                "requests_limit": limits[0],
                "requests_remaining": 0,
                "input_limit": limits[1],
                "input_remaining": 0,
                "output_limit": limits[2],
                "output_remaining": 0,
                "estimated_input": None,
                "actual_input": None,
                "reserved_output": None,
                "actual_output": None,
            },
        )


def _read_jobs(dsn: str, stands_for: dict[int, PlannedJob]) -> tuple[list[JobTimes], float]:
    """The arm's jobs as :class:`JobTimes` (tenant and origin as planned), and the clock."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = queries.run(conn, "demo_jobs")
        now = float(queries.run(conn, "demo_progress")["now"])
    jobs = [
        JobTimes(
            tenant_id=stands_for[r["id"]].tenant_id,
            tier=classify(
                stands_for[r["id"]].origin, stands_for[r["id"]].sla_seconds, demoted=False
            ).value,
            queue_tier=r["tier"],
            cost=float(r["cost"]),
            state=r["state"],
            enqueued=float(r["enqueued"]),
            started=r["started"],
            finished=r["finished"],
            throttle_retries=int(r["throttle_retries"]),
        )
        for r in rows
        if r["id"] in stands_for
    ]
    return jobs, now


class _Run:
    """The two arms running in one event loop, and the progress they show."""

    def __init__(
        self,
        dsns: dict[str, str],
        urls: dict[str, str],
        plan: list[PlannedJob],
        settings: Settings,
        options: CompareOptions,
    ) -> None:
        self.dsns, self.plan, self.options = dsns, plan, options
        self.settings = {
            arm: settings.model_copy(
                update={
                    "anthropic_base_url": urls[arm],
                    "anthropic_api_key": SecretStr("sandbox-key"),
                    "poll_interval_seconds": min(settings.poll_interval_seconds, 0.5),
                    "shutdown_grace_seconds": 0.0,
                }
            )
            for arm in ARMS
        }
        self.enqueued = dict.fromkeys(ARMS, 0)
        self.ids: dict[str, tuple[int | None, ...]] = {}
        self.ready = {arm: asyncio.Event() for arm in ARMS}

    async def arm(self, arm: str, spec: Callable[[PlannedJob], JobSpec]) -> None:
        dsn = self.dsns[arm]
        worker = Worker(dsn, self.settings[arm], concurrency=self.options.concurrency)
        work = asyncio.create_task(worker.run(install_signal_handlers=False))
        try:
            await self._ready(dsn, work)
            self.ready[arm].set()
            await asyncio.wait({asyncio.ensure_future(e.wait()) for e in self.ready.values()})

            def counted(n: int) -> None:
                self.enqueued[arm] = n

            stats = await replay_plan(
                dsn, self.plan, self.settings[arm], spec=spec, on_batch=counted
            )
            self.ids[arm] = stats.ids
            deadline = time.monotonic() + self.options.drain_seconds
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                while time.monotonic() < deadline and not work.done():
                    row = await queries.arun(conn, "demo_progress")
                    if row["finished"] >= row["jobs"]:
                        break
                    await asyncio.sleep(0.2)
        finally:
            worker.request_stop(hard=True)
            with contextlib.suppress(asyncio.CancelledError):
                await work

    @staticmethod
    async def _ready(dsn: str, work: asyncio.Task[Any]) -> None:
        """Wait until the worker has run a no-op job: started, schema checked, claiming (a
        replay started before would see its first seconds' arrivals wait for the start-up)."""
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            warm_up = await enqueue(
                conn, tenant_id="warm-up", origin=Origin.USER_ACTION, payload={}, kind=NOOP_KIND
            )
            while not work.done():
                row = await queries.arun(conn, "demo_job_state", {"id": warm_up})
                if row["state"] == "succeeded":
                    return
                await asyncio.sleep(0.05)
        work.result()  # the worker stopped: its error

    async def show(self, phases: Phases, arms: asyncio.Future[Any]) -> None:
        total = 2 * len(self.plan)
        phases.phase("starting a worker per queue")
        while not arms.done() and not all(e.is_set() for e in self.ready.values()):
            await asyncio.wait({arms}, timeout=0.1)
        phases.phase(
            f"replaying {len(self.plan)} requests into both queues "
            f"({self.plan[-1].at_seconds:.0f} s at {self.options.speedup:g}×)",
            total=total,
        )
        while not arms.done() and sum(self.enqueued.values()) < total:
            phases.update(sum(self.enqueued.values()))
            await asyncio.wait({arms}, timeout=0.25)
        phases.phase("letting both queues drain", total=total)
        async with contextlib.AsyncExitStack() as stack:
            conns = [
                await stack.enter_async_context(
                    await psycopg.AsyncConnection.connect(self.dsns[arm], autocommit=True)
                )
                for arm in ARMS
            ]
            while not arms.done():
                done = [int((await queries.arun(c, "demo_progress"))["finished"]) for c in conns]
                phases.update(sum(done), f"FIFO {done[0]}, pgqueue {done[1]} finished")
                await asyncio.wait({arms}, timeout=0.5)

    async def main(self, phases: Phases) -> None:
        tasks = [
            asyncio.create_task(self.arm("fifo", _fifo_spec)),
            asyncio.create_task(self.arm("pgqueue", _pgqueue_spec)),
        ]
        arms = asyncio.gather(*tasks)
        try:
            await self.show(phases, arms)
            await arms
        except asyncio.CancelledError:
            # Ctrl-C (asyncio.run cancels this task): each arm stops its worker at once and
            # waits for it, before asyncio.run cancels what is left (found by a tester: the
            # workers were cancelled mid-write, "the pool is already closed", 33 s to exit).
            _ignore_ctrl_c()
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            if arms.done() and not arms.cancelled():
                arms.exception()  # retrieved: no "exception was never retrieved" log
            raise


def _ignore_ctrl_c() -> None:
    """Once interrupted, the clean-up runs to its end: another Ctrl-C would stop it half-way
    (workers cancelled mid-write, the databases left). :func:`run_comparison` restores the
    handler at its end."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _sandbox_stats(base_url: str) -> dict[str, Any]:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{base_url}/_sandbox/stats", timeout=10) as answer:
        data: dict[str, Any] = json.loads(answer.read())
    return data


def run_comparison(
    server_dsn: str, settings: Settings, options: CompareOptions, phases: Phases
) -> Comparison:
    """Run both arms on the server of ``server_dsn`` and return their figures.

    Raises:
        psycopg.Error: the server refused (e.g. the role may not create databases).
        InvalidArgument: a bad trace or option (from the trace planner).
    """
    began = time.monotonic()
    plan = plan_replay(
        load_trace(options.trace, limit=options.requests),
        tenants=options.tenants,
        speedup=options.speedup,
        seed=options.seed,
        model=options.model,
    )
    limits = provider_limits(plan, options.load)
    phases.phase("creating the two databases and their sandbox APIs")
    run = uuid.uuid4().hex[:8]
    # Named before they are created: a Ctrl-C while creating them drops them too (found by a
    # tester: interrupted in the first seconds, the demo left `pgqueue_demo_<run>_pgqueue`).
    dsns = _database_dsns(server_dsn, run)
    on_ctrl_c = signal.getsignal(signal.SIGINT)
    try:
        _create_databases(server_dsn, dsns)
        sandbox = SandboxConfig(
            requests_per_minute=limits[0],
            input_tokens_per_minute=limits[1],
            output_tokens_per_minute=limits[2],
            seconds_per_output_token=options.seconds_per_output_token,
            seed=options.seed,
            initial_fill=0.0,
        )
        with contextlib.ExitStack() as stack:
            urls = {arm: stack.enter_context(running_sandbox(sandbox)) for arm in ARMS}
            for arm in ARMS:  # after the sandbox: the limiter is never ahead of it
                _spend_the_limiter(dsns[arm], options.model, limits)
            state = _Run(dsns, urls, plan, settings, options)
            asyncio.run(state.main(phases))
            phases.phase("reading the figures")
            figures = {}
            for arm in ARMS:
                stands_for = {
                    i: job
                    for i, job in zip(
                        state.ids[arm], sorted(plan, key=lambda j: j.at_seconds), strict=True
                    )
                    if i is not None
                }
                jobs, now = _read_jobs(dsns[arm], stands_for)
                figures[arm] = arm_figures("plain FIFO" if arm == "fifo" else "pgqueue", jobs, now)
                stats = _sandbox_stats(urls[arm])
                figures[arm].http_429 = int(stats.get("429", 0))
                figures[arm].http_529 = int(stats.get("529", 0))
    except KeyboardInterrupt:
        _ignore_ctrl_c()
        raise Interrupted(dsns) from None
    finally:
        try:
            if not options.keep:
                drop_databases(server_dsn, dsns)
        finally:
            if on_ctrl_c is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, on_ctrl_c)
    return Comparison(figures["fifo"], figures["pgqueue"], limits, time.monotonic() - began, dsns)
