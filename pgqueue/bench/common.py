"""Shared pieces of ``pgqueue bench``: options, the plain baseline's SQL, scratch databases,
statistics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import statistics
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

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
# The arrays go in binary (%b): in text format psycopg escapes every quote of 1,000 JSON
# texts and the server parses the escaped array literal back, ~32 ms of a ~46 ms statement:
# the baseline measured its own adapter, not a bare insert (found in this session; pgqueue's
# enqueue_many already sent its arrays in binary).
PLAIN_INSERT_MANY = (
    "INSERT INTO bench_plain.jobs (tenant_id, payload) "
    "SELECT * FROM unnest(%b::text[], %b::jsonb[])"
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
    #: pgqueue's and the plain baseline's jobs per claim (None: every free slot)
    claim_batch: int | None = None
    #: pgqueuer's max_concurrent_tasks (None: its default, no cap on jobs in flight)
    peer_max_in_flight: int | None = None
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
        for name, limit in (
            ("claim_batch", self.claim_batch),
            ("peer_max_in_flight", self.peer_max_in_flight),
        ):
            if limit is not None and limit < 1:
                raise InvalidArgument(f"{name} must be at least 1, got {limit}")
        if self.peer_max_in_flight is not None and self.peer is None:
            raise InvalidArgument("--peer-max-in-flight needs --peer pgqueuer")
        if self.peer_max_in_flight is not None and self.peer_max_in_flight < 2 * self.peer_batch:
            raise InvalidArgument(  # pgqueuer's own rule (QueueManager.run raises otherwise)
                "--peer-max-in-flight must be at least twice --peer-batch (pgqueuer's rule), "
                f"got {self.peer_max_in_flight} with a batch of {self.peer_batch}"
            )
        if not self.procs or any(p < 1 or p > 32 for p in self.procs):
            raise InvalidArgument(f"procs must be 1 to 32 each, got {self.procs}")
        unknown = set(self.parts) - set(PARTS)
        if unknown or not self.parts:
            raise InvalidArgument(f"parts must be among {', '.join(PARTS)}, got {self.parts}")
        if self.peer is not None and self.peer not in PEERS:
            raise InvalidArgument(f"--peer must be one of {', '.join(PEERS)}, got {self.peer!r}")
        if self.peer == "pgqueuer" and not pgqueuer_available():
            raise InvalidArgument(
                "--peer pgqueuer needs pgqueuer installed: the bench extra (pip install -e "
                "'.[bench]' in the pgqueue checkout)"
            )


def parse_int_list(text: str, name: str) -> tuple[int, ...]:
    """``"1,2,4"`` → ``(1, 2, 4)``; raises :class:`InvalidArgument` on anything else."""
    try:
        values = tuple(int(x) for x in text.split(","))
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
