"""``pgqueue bench``: throughput and wake-up latency against a plain queue (and pgqueuer), one run.

Everything is measured on scratch databases of the server you point it at, in one run, so
the figures that matter are ratios (the machine is shared; absolute jobs/s are not portable):

- **enqueue**: single (one ``pgqueue.enqueue`` per autocommit transaction) and bulk
  (``pgqueue.enqueue_many``, ``batch`` jobs per statement), against a bare ``INSERT`` into a
  minimal table (``bench_plain.jobs``) with the same payload, and pgqueuer's ``enqueue``.
- **consume**: claim + complete of ``pgqueue.noop`` jobs by 1, 2, 4 real ``pgqueue work
  --burst --concurrency N`` processes draining a pre-filled queue, against processes that
  claim ``ORDER BY id FOR UPDATE SKIP LOCKED LIMIT free`` from the minimal table and complete
  each job with its own fenced ``UPDATE`` (same worker shape: asyncio, ``concurrency`` slots,
  a pool of ``min(concurrency, 8) + 2`` connections), and pgqueuer ``QueueManager`` processes
  in drain mode. Start line: workers are up and idle first; the queue is filled in ONE
  transaction and the clock starts at ``clock_timestamp()`` just before its ``COMMIT``; it
  stops at the last job's completion time in the database.
- **wakeup**: an idle ``pgqueue work`` process (LISTEN) and a producer committing one job at
  a time; latency = the claim's ``started_at`` minus ``clock_timestamp()`` taken in the
  producer's transaction just before ``COMMIT``.

Each measured run gets a fresh clone of one template database (pgqueue migrated, the plain
table, pgqueuer's schema), runs are interleaved (pgqueue, plain, peer; rotated each repeat),
and the report gives medians plus the median of the per-repeat ratios. All scratch
databases are dropped at the end.

``python -m pgqueue.bench plain-worker|pgqueuer-worker DSN N`` are the baseline and peer
worker processes (internal).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb

from pgqueue.errors import InvalidArgument

#: The job kind every benchmark job uses (the built-in handler that does nothing).
NOOP_KIND = "pgqueue.noop"
#: One payload for every system (pgqueuer gets the same JSON as bytes).
PAYLOAD: dict[str, Any] = {
    "model": "claude-haiku-4-5",
    "max_tokens": 16,
    "messages": [{"role": "user", "content": "Summarise the benchmark in one line, please."}],
}
PAYLOAD_JSON = json.dumps(PAYLOAD, separators=(",", ":"))
PAYLOAD_BYTES = PAYLOAD_JSON.encode()
#: Origins cycled over the jobs (with the SLA each gets), so all three tiers are used.
ORIGINS: tuple[tuple[str, float | None], ...] = (
    ("user_action", None),
    ("scheduled", 300.0),
    ("batch_job", None),
)
#: ``application_name`` of the baseline/peer processes' start-signal connection.
READY_APP = "pgqueue-bench-ready"
#: ``application_name`` of pgqueue's LISTEN connection (``pgqueue.worker.notifier``).
LISTEN_APP = "pgqueue-listen"
GO_CHANNEL = "pgqueue_bench_go"
GO_NOTIFY = "NOTIFY pgqueue_bench_go"
PEERS = ("pgqueuer",)
PARTS = ("enqueue", "consume", "wakeup")
SENTINEL_TENANT = "bench-sentinel"

PLAIN_DDL = """
CREATE SCHEMA bench_plain;
CREATE TABLE bench_plain.jobs (
    id          bigserial PRIMARY KEY,
    tenant_id   text NOT NULL,
    state       text NOT NULL DEFAULT 'queued',
    payload     jsonb NOT NULL,
    run_at      timestamptz NOT NULL DEFAULT now(),
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    started_at  timestamptz,
    finished_at timestamptz,
    attempts    int NOT NULL DEFAULT 0,
    worker_id   text,
    lease_token uuid,
    result      jsonb
);
CREATE INDEX jobs_queued_idx ON bench_plain.jobs (id) WHERE state = 'queued';
"""

PLAIN_INSERT = "INSERT INTO bench_plain.jobs (tenant_id, payload) VALUES (%s, %s)"
PLAIN_INSERT_MANY = (
    "INSERT INTO bench_plain.jobs (tenant_id, payload) "
    "SELECT * FROM unnest(%s::text[], %s::jsonb[])"
)
PLAIN_CLAIM = """
WITH picked AS (
    SELECT id FROM bench_plain.jobs
    WHERE state = 'queued' AND run_at <= now()
    ORDER BY id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE bench_plain.jobs j
SET state = 'running', attempts = j.attempts + 1, started_at = clock_timestamp(),
    worker_id = %s, lease_token = gen_random_uuid()
FROM picked WHERE j.id = picked.id
RETURNING j.id, j.lease_token, j.payload
"""
PLAIN_COMPLETE = """
UPDATE bench_plain.jobs
SET state = 'succeeded', finished_at = now(), result = '{"ok": true}'
WHERE id = %s AND state = 'running' AND lease_token = %s
"""


@dataclass(frozen=True)
class BenchOptions:
    """Sizes and switches of one benchmark run (see ``pgqueue bench --help``)."""

    jobs: int = 20_000
    procs: tuple[int, ...] = (1, 2, 4)
    concurrency: int = 10
    repeats: int = 3
    single_jobs: int = 2_000
    bulk_jobs: int = 20_000
    batch: int = 1_000
    wake_samples: int = 200
    tenants: int = 10
    peer: str | None = None
    peer_batch: int = 10
    parts: tuple[str, ...] = PARTS
    process_timeout: float = 600.0

    def check(self) -> None:
        """Raise :class:`InvalidArgument` for sizes or names that cannot run."""
        positive = {
            "jobs": self.jobs,
            "concurrency": self.concurrency,
            "repeats": self.repeats,
            "single_jobs": self.single_jobs,
            "bulk_jobs": self.bulk_jobs,
            "batch": self.batch,
            "wake_samples": self.wake_samples,
            "tenants": self.tenants,
            "peer_batch": self.peer_batch,
        }
        for name, value in positive.items():
            if value < 1:
                raise InvalidArgument(f"{name} must be at least 1, got {value}")
        if not self.procs or any(p < 1 or p > 32 for p in self.procs):
            raise InvalidArgument(f"procs must be 1 to 32 each, got {self.procs}")
        unknown = set(self.parts) - set(PARTS)
        if unknown or not self.parts:
            raise InvalidArgument(f"parts must be among {', '.join(PARTS)}, got {self.parts}")
        if self.peer is not None and self.peer not in PEERS:
            raise InvalidArgument(f"--peer must be one of {', '.join(PEERS)}, got {self.peer!r}")
        if self.peer == "pgqueuer" and not pgqueuer_available():
            raise InvalidArgument(
                "--peer pgqueuer needs pgqueuer installed: pip install 'pgqueue[bench]'"
            )


def parse_int_list(text: str, name: str) -> tuple[int, ...]:
    """``"1,2,4"`` → ``(1, 2, 4)``; raises :class:`InvalidArgument` on anything else."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InvalidArgument(f"{name} expects comma-separated integers, got {text!r}") from None
    if not values:
        raise InvalidArgument(f"{name} expects at least one integer")
    return values


def pgqueuer_available() -> bool:
    """Whether the optional peer can be imported."""
    try:
        import pgqueuer  # noqa: F401
    except ImportError:
        return False
    return True


def _asyncpg_available() -> bool:
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------------------------ helpers


def _job(i: int, tenants: int) -> dict[str, Any]:
    origin, sla = ORIGINS[i % len(ORIGINS)]
    return {
        "tenant_id": f"t{i % tenants}",
        "origin": origin,
        "sla_seconds": sla,
        "payload": PAYLOAD,
        "kind": NOOP_KIND,
    }


def _chunks(n: int, size: int) -> Iterator[range]:
    for start in range(0, n, size):
        yield range(start, min(n, start + size))


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0–100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def _r(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    return [x / y for x, y in zip(a, b, strict=False) if y > 0]


def _cli_command() -> list[str]:
    """How to start ``pgqueue`` with this interpreter: the console script next to it."""
    script = Path(sys.executable).with_name("pgqueue")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from pgqueue.cli import app; app()"]


class Scratch:
    """A template database (pgqueue migrated, the plain table, the peer's schema) and clones."""

    def __init__(self, server_dsn: str, peer: str | None) -> None:
        self.server_dsn = server_dsn
        self.peer = peer
        self.prefix = f"pgq_bench_{uuid.uuid4().hex[:8]}"
        self.template = f"{self.prefix}_tpl"
        self._count = 0

    def dsn(self, name: str) -> str:
        return make_conninfo(self.server_dsn, dbname=name)

    def _admin(self, statement: sql.Composed) -> None:
        with psycopg.connect(self.server_dsn, autocommit=True) as conn:
            conn.execute(statement)

    def create_template(self) -> None:
        from pgqueue.db import migrate

        self._admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        dsn = self.dsn(self.template)
        migrate.upgrade(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(PLAIN_DDL)
        if self.peer == "pgqueuer":
            asyncio.run(_pgqueuer_install(dsn))

    @contextlib.contextmanager
    def clone(self) -> Iterator[str]:
        """A fresh copy of the template, dropped on exit."""
        self._count += 1
        name = f"{self.prefix}_{self._count}"
        self._admin(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(self.template)
            )
        )
        try:
            yield self.dsn(name)
        finally:
            self.drop(name)

    def drop(self, name: str) -> None:
        self._admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def close(self) -> None:
        self.drop(self.template)


# ------------------------------------------------------------------------------------ enqueue


def _enqueue_pgqueue(dsn: str, n: int, bulk: bool, batch: int, tenants: int) -> float:
    import pgqueue

    jobs = [_job(i, tenants) for i in range(n)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        pgqueue.enqueue(conn, **_job(0, tenants))  # warm-up: connection, plans, tenant rows
        if bulk:
            specs = [pgqueue.JobSpec(**j) for j in jobs]
            started = time.perf_counter()
            for part in _chunks(n, batch):
                pgqueue.enqueue_many(conn, specs[part.start : part.stop])
        else:
            started = time.perf_counter()
            for job in jobs:
                pgqueue.enqueue(conn, **job)
        return n / (time.perf_counter() - started)


def _enqueue_plain(dsn: str, n: int, bulk: bool, batch: int, tenants: int) -> float:
    tenant_ids = [f"t{i % tenants}" for i in range(n)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(PLAIN_INSERT, ("t0", Jsonb(PAYLOAD)))  # warm-up
        started = time.perf_counter()
        if bulk:
            for part in _chunks(n, batch):
                conn.execute(
                    PLAIN_INSERT_MANY,
                    (tenant_ids[part.start : part.stop], [PAYLOAD_JSON] * len(part)),
                )
        else:
            for tenant in tenant_ids:
                conn.execute(PLAIN_INSERT, (tenant, Jsonb(PAYLOAD)))
        return n / (time.perf_counter() - started)


async def _pgqueuer_queries(dsn: str) -> tuple[Any, Callable[[], Any]]:
    """pgqueuer ``Queries`` on its preferred driver (asyncpg when installed, else psycopg)."""
    from pgqueuer import Queries

    if _asyncpg_available():
        import asyncpg

        params = conninfo_to_dict(dsn)
        aconn = await asyncpg.connect(
            host=params.get("host"),
            port=int(str(params["port"])) if params.get("port") else None,
            user=params.get("user"),
            password=params.get("password"),
            database=params.get("dbname"),
        )
        return Queries.from_asyncpg_connection(aconn), aconn.close
    pconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    return Queries.from_psycopg_connection(pconn), pconn.close


async def _pgqueuer_install(dsn: str) -> None:
    queries, close = await _pgqueuer_queries(dsn)
    try:
        await queries.install()
    finally:
        await close()


async def _enqueue_pgqueuer_async(dsn: str, n: int, bulk: bool, batch: int) -> float:
    queries, close = await _pgqueuer_queries(dsn)
    try:
        await queries.enqueue("noop", PAYLOAD_BYTES, 0)  # warm-up
        started = time.perf_counter()
        if bulk:
            for part in _chunks(n, batch):
                size = len(part)
                await queries.enqueue(["noop"] * size, [PAYLOAD_BYTES] * size, [0] * size)
        else:
            for _ in range(n):
                await queries.enqueue("noop", PAYLOAD_BYTES, 0)
        return n / (time.perf_counter() - started)
    finally:
        await close()


def _enqueue_pgqueuer(dsn: str, n: int, bulk: bool, batch: int, tenants: int) -> float:
    return asyncio.run(_enqueue_pgqueuer_async(dsn, n, bulk, batch))


ENQUEUE: dict[str, Callable[[str, int, bool, int, int], float]] = {
    "pgqueue": _enqueue_pgqueue,
    "plain": _enqueue_plain,
    "pgqueuer": _enqueue_pgqueuer,
}


# ------------------------------------------------------------------------------------ consume


def _spawn(cmd: list[str], log: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=os.environ.copy())


def _wait_ready(dsn: str, app_name: str, count: int, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 40.0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = %s",
                (app_name,),
            ).fetchone()
            if row is not None and row[0] >= count:
                break
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a benchmark worker process exited before it was ready")
            if time.monotonic() > deadline:
                raise RuntimeError(f"benchmark workers not ready after 40 s ({app_name})")
            time.sleep(0.05)
    time.sleep(0.5)  # let each worker finish its first (empty) claim and go idle


def _fill_sync(dsn: str, system: str, options: BenchOptions, sentinel: int | None) -> float:
    """Fill the queue in ONE transaction; return ``clock_timestamp()`` just before COMMIT."""
    import pgqueue

    n, batch, tenants = options.jobs, options.batch, options.tenants
    with psycopg.connect(dsn) as conn:
        for part in _chunks(n, batch):
            if system == "pgqueue":
                pgqueue.enqueue_many(conn, [pgqueue.JobSpec(**_job(i, tenants)) for i in part])
            else:
                conn.execute(
                    PLAIN_INSERT_MANY,
                    ([f"t{i % tenants}" for i in part], [PAYLOAD_JSON] * len(part)),
                )
        if sentinel is not None:
            conn.execute(
                "UPDATE pgqueue.jobs SET state = 'cancelled', finished_at = now() WHERE id = %s",
                (sentinel,),
            )
        conn.execute(sql.SQL("NOTIFY {}").format(sql.Identifier(GO_CHANNEL)))
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        conn.commit()
        return float(row[0])


async def _fill_pgqueuer_async(dsn: str, n: int, batch: int) -> float:
    queries, close = await _pgqueuer_queries(dsn)
    try:
        await queries.driver.execute("BEGIN")
        for part in _chunks(n, batch):
            size = len(part)
            await queries.enqueue(["noop"] * size, [PAYLOAD_BYTES] * size, [0] * size)
        await queries.driver.execute(GO_NOTIFY)
        rows = await queries.driver.fetch(
            "SELECT extract(epoch FROM clock_timestamp())::float8 AS t"
        )
        await queries.driver.execute("COMMIT")
        return float(rows[0]["t"])
    finally:
        await close()


def _sentinel(dsn: str) -> int:
    """A job due in 45 s keeps ``--burst`` workers waiting (LISTEN) until the fill commits."""
    import pgqueue

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT now() + interval '45 seconds'").fetchone()
        assert row is not None
        sentinel = pgqueue.enqueue(
            conn,
            tenant_id=SENTINEL_TENANT,
            origin="batch_job",
            payload=PAYLOAD,
            kind=NOOP_KIND,
            run_at=row[0],
        )
        assert sentinel is not None, "admission dropped the benchmark's sentinel job"
        return sentinel


_END_QUERY = {
    "pgqueue": (
        "SELECT count(*), extract(epoch FROM max(finished_at))::float8, "
        "extract(epoch FROM min(started_at))::float8 FROM pgqueue.jobs "
        "WHERE state = 'succeeded' AND tenant_id <> %s"
    ),
    "plain": (
        "SELECT count(*), extract(epoch FROM max(finished_at))::float8, "
        "extract(epoch FROM min(started_at))::float8 FROM bench_plain.jobs "
        "WHERE state = 'succeeded' AND tenant_id <> %s"
    ),
    "pgqueuer": (
        "SELECT count(*) FILTER (WHERE status = 'successful'), "
        "extract(epoch FROM max(created) FILTER (WHERE status = 'successful'))::float8, "
        "extract(epoch FROM min(created) FILTER (WHERE status <> 'queued'))::float8 "
        "FROM pgqueuer_log WHERE entrypoint <> %s"
    ),
}


def consume_once(dsn: str, system: str, procs: int, options: BenchOptions) -> dict[str, Any]:
    """One drain of ``options.jobs`` no-op jobs by ``procs`` processes of ``system``."""
    n = options.jobs
    sentinel = _sentinel(dsn) if system == "pgqueue" else None
    if system == "pgqueue":
        cmd = [*_cli_command(), "work", "--burst", "--concurrency", str(options.concurrency)]
        cmd += ["--dsn", dsn]
        ready_app = LISTEN_APP
    else:
        size = options.concurrency if system == "plain" else options.peer_batch
        cmd = [sys.executable, "-m", "pgqueue.bench", f"{system}-worker", dsn, str(size)]
        ready_app = READY_APP
    with tempfile.TemporaryFile() as log:
        workers = [_spawn(cmd, log) for _ in range(procs)]
        try:
            _wait_ready(dsn, ready_app, procs, workers)
            if system == "pgqueuer":
                t0 = asyncio.run(_fill_pgqueuer_async(dsn, n, options.batch))
            else:
                t0 = _fill_sync(dsn, system, options, sentinel)
            deadline = time.monotonic() + options.process_timeout
            for proc in workers:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            for proc in workers:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        codes = [p.returncode for p in workers]
        log.seek(0)
        stderr = log.read().decode(errors="replace")
    if any(codes):
        raise RuntimeError(f"{system} worker exited with {codes}: {stderr[-2000:]}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(_END_QUERY[system], (SENTINEL_TENANT,)).fetchone()
    assert row is not None
    done, end, first = int(row[0]), row[1], row[2]
    if done != n or end is None:
        raise RuntimeError(f"{system}: {done} of {n} jobs succeeded; worker log: {stderr[-2000:]}")
    wall = end - t0
    return {
        "jobs_per_s": n / wall,
        "wall_s": wall,
        "first_claim_ms": None if first is None else (first - t0) * 1000,
    }


# ------------------------------------------------------------------------------------ wake-up


def wakeup(dsn: str, options: BenchOptions) -> dict[str, Any]:
    """Commit one job at a time to an idle LISTENing worker; latency commit → claim."""
    import pgqueue

    cmd = [*_cli_command(), "work", "--concurrency", str(options.concurrency), "--dsn", dsn]
    rng = random.Random(8)
    samples: list[tuple[int, float]] = []
    with tempfile.TemporaryFile() as log:
        worker = _spawn(cmd, log)
        try:
            _wait_ready(dsn, LISTEN_APP, 1, [worker])
            time.sleep(0.5)
            with psycopg.connect(dsn) as conn:
                for i in range(options.wake_samples):
                    time.sleep(rng.uniform(0.02, 0.06))  # the worker is idle again
                    job_id = pgqueue.enqueue(conn, **_job(i, options.tenants))
                    assert job_id is not None, "admission dropped a benchmark job"
                    row = conn.execute(
                        "SELECT extract(epoch FROM clock_timestamp())::float8"
                    ).fetchone()
                    assert row is not None
                    conn.commit()
                    samples.append((job_id, float(row[0])))
                ids = [s[0] for s in samples]
                deadline = time.monotonic() + 30.0
                started: dict[int, float] = {}
                while True:
                    started = dict(
                        conn.execute(
                            "SELECT id, extract(epoch FROM started_at)::float8 FROM pgqueue.jobs "
                            "WHERE id = ANY(%s) AND started_at IS NOT NULL",
                            (ids,),
                        ).fetchall()
                    )
                    conn.commit()
                    if len(started) == len(ids) or time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    latencies = [(started[j] - t) * 1000 for j, t in samples if j in started]
    if not latencies:
        raise RuntimeError("no wake-up sample was claimed")
    return {
        "samples": len(latencies),
        "missed": len(samples) - len(latencies),
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies),
        "all_ms": [round(x, 3) for x in latencies],
    }


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
        t = Table(title="Claim + complete of no-op jobs (jobs/s, medians)")
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


# ------------------------------------------------------------------------------------ workers


async def plain_worker(dsn: str, concurrency: int) -> None:
    """The baseline worker: same shape as pgqueue's, minus tiers, DRR, leases bookkeeping."""
    from psycopg_pool import AsyncConnectionPool

    worker_id = f"plain:{os.getpid()}"
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn,
        min_size=1,
        max_size=min(concurrency, 8) + 2,
        kwargs={"autocommit": True},
        open=False,
    )
    await pool.open(wait=True)
    try:
        await _wait_go(dsn)

        async def complete(job_id: int, token: Any) -> None:
            async with pool.connection() as conn:
                await conn.execute(PLAIN_COMPLETE, (job_id, token))

        inflight: set[asyncio.Task[None]] = set()
        while True:
            inflight = {t for t in inflight if not t.done()}
            free = concurrency - len(inflight)
            if free > 0:
                async with pool.connection() as conn:
                    cur = await conn.execute(PLAIN_CLAIM, (free, worker_id))
                    rows = await cur.fetchall()
                for job_id, token, _payload in rows:
                    inflight.add(asyncio.create_task(complete(job_id, token)))
                if rows and len(rows) == free:
                    continue
                if not rows and not inflight:
                    return
            await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await pool.close()


async def _wait_go(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, application_name=READY_APP
    ) as conn:
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(GO_CHANNEL)))
        async for _notify in conn.notifies():
            return


async def pgqueuer_worker(dsn: str, batch_size: int) -> None:
    """A pgqueuer ``QueueManager`` with a no-op entrypoint, draining the queue."""
    from pgqueuer import QueueManager
    from pgqueuer.models import Job
    from pgqueuer.types import QueueExecutionMode

    queries, close = await _pgqueuer_queries(dsn)
    try:
        qm = QueueManager(queries)

        @qm.entrypoint("noop")  # type: ignore[untyped-decorator, unused-ignore]
        async def noop(job: Job) -> None:
            return None

        await _wait_go(dsn)
        await qm.run(
            batch_size=batch_size,
            mode=QueueExecutionMode.drain,
            log_aggregation_interval=timedelta(0),
        )
    finally:
        await close()


def _child_main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("plain-worker", "pgqueuer-worker"):
        sys.stderr.write("usage: python -m pgqueue.bench plain-worker|pgqueuer-worker DSN N\n")
        return 2
    role, dsn, size = argv[0], argv[1], int(argv[2])
    if role == "plain-worker":
        asyncio.run(plain_worker(dsn, size))
    else:
        asyncio.run(pgqueuer_worker(dsn, size))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
