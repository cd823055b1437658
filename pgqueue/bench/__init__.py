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

from pgqueue.bench.common import (
    GO_CHANNEL,
    GO_NOTIFY,
    LISTEN_APP,
    NOOP_KIND,
    ORIGINS,
    PARTS,
    PAYLOAD,
    PAYLOAD_BYTES,
    PAYLOAD_JSON,
    PEERS,
    PLAIN_CLAIM,
    PLAIN_COMPLETE,
    PLAIN_DDL,
    PLAIN_INSERT,
    PLAIN_INSERT_MANY,
    READY_APP,
    SENTINEL_TENANT,
    BenchOptions,
    Scratch,
    parse_int_list,
    percentile,
    pgqueuer_available,
)
from pgqueue.bench.measure import ENQUEUE, consume_once, wakeup
from pgqueue.bench.report import plot, render, run
from pgqueue.bench.workers import pgqueuer_worker, plain_worker

__all__ = [
    "ENQUEUE",
    "GO_CHANNEL",
    "GO_NOTIFY",
    "LISTEN_APP",
    "NOOP_KIND",
    "ORIGINS",
    "PARTS",
    "PAYLOAD",
    "PAYLOAD_BYTES",
    "PAYLOAD_JSON",
    "PEERS",
    "PLAIN_CLAIM",
    "PLAIN_COMPLETE",
    "PLAIN_DDL",
    "PLAIN_INSERT",
    "PLAIN_INSERT_MANY",
    "READY_APP",
    "SENTINEL_TENANT",
    "BenchOptions",
    "Scratch",
    "consume_once",
    "parse_int_list",
    "percentile",
    "pgqueuer_available",
    "pgqueuer_worker",
    "plain_worker",
    "plot",
    "render",
    "run",
    "wakeup",
]
