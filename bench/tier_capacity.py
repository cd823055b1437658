"""Tier-1 capacity scenario (issue 28, done-when 3): does critical keep its 2 s SLO, and does
batch keep its share of the tokens, while standard and batch are backlogged at the provider's
limits?

    python bench/tier_capacity.py --dsn postgresql://root@127.0.0.1:5432/postgres \
        --minutes 5 --label "main at 4c62d55 (drr_dispatch)" --json-out bench/tier_capacity.json

Set-up, all through the public interfaces (so it runs on any version of the claim):
- a scratch database ``scr28b_tier_<random>`` (migrated; dropped at the end unless ``--keep``);
- ``pgqueue sandbox`` in this process at Tier-1 limits (50 RPM, 40,000 input and 8,000 output
  tokens per minute, its buckets full at the start), latency 0.1 s + 2 ms per output token;
  the shared limiter set to the same limits (``pgqueue limits set``);
- ``--workers`` real ``pgqueue work --concurrency N`` processes running the built-in
  ``anthropic.messages`` handler against the sandbox (``ANTHROPIC_BASE_URL``, a dummy key);
- load, from ``--tenants`` tenants that each send all three tiers: standard (``scheduled``,
  SLA 300 s) and batch (``batch_job``, no SLA) topped up every second to ``--backlog`` queued
  jobs each, so both stay backlogged; critical (``user_action``) arriving as a Poisson process
  whose input tokens are ``--critical-share`` of the input-token limit.

Job sizes are real: (input, output) token counts drawn from the Azure LLM inference trace 2023
(``pgqueue/data/azure_llm_conv_2023.csv``, CC-BY 4.0; Patel et al., "Splitwise: Efficient
generative LLM inference using phase splitting", ISCA 2024). Critical draws from requests of at
most 4,000 input tokens (a chat turn); 30 % of standard jobs are long documents of 5,000-8,000
input tokens (the trace has 0.4 % of those); output is the recorded count capped at 400 tokens,
so that input tokens are the binding limit (the trace's output/input ratio, 0.18, would
otherwise bring output within reach of its 8,000-token limit).

Reports: critical latency (enqueue -> start, enqueue -> finish; p50/p95/p99/max, and how many
met 2 s), the input tokens each tier got among the jobs started in the window, the offered
critical demand, the 429s and 529s the sandbox answered, the least queued depth of standard and
batch seen (> 0: they stayed backlogged) and demotions. Verdicts against issue 28: critical p99
(enqueue -> finish) <= 2 s, batch >= 4 % of the input tokens. ``--tier-policy`` sets
``pgqueue.tier_policy`` on the scratch database (by default it is left at ``weighted``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

import pgqueue
from pgqueue import JobSpec
from pgqueue.db import migrate, queries
from pgqueue.sandbox import SandboxConfig, running_sandbox
from pgqueue.sandbox.messages import filler_text
from pgqueue.trace import load_trace

MODEL = "claude-haiku-4-5"
RPM, ITPM, OTPM = 50, 40_000, 8_000
SLO_SECONDS = 2.0
BATCH_SHARE_TARGET = 0.04
CRITICAL_MAX_INPUT = 4_000
LONG_DOC_SHARE, LONG_DOC_TOKENS = 0.30, (5_000, 8_000)
OUTPUT_CAP = 400
STANDARD_SLA = 300.0
GRACE_SECONDS = 60.0


@dataclass(frozen=True)
class Size:
    """One job's size: input and output (``max_tokens``) tokens."""

    input_tokens: int
    output_tokens: int


class Sizes:
    """Draws job sizes per tier from the trace, with a seeded RNG (see the module doc)."""

    def __init__(self, seed: int) -> None:
        trace = load_trace(None)
        self.all = [Size(max(16, r.input_tokens), r.output_tokens) for r in trace]
        self.small = [s for s in self.all if s.input_tokens <= CRITICAL_MAX_INPUT]
        self.rng = random.Random(seed)

    def _out(self, size: Size) -> Size:
        return Size(size.input_tokens, max(1, min(OUTPUT_CAP, size.output_tokens)))

    def critical(self) -> Size:
        return self._out(self.rng.choice(self.small))

    def standard(self) -> Size:
        size = self._out(self.rng.choice(self.all))
        if self.rng.random() < LONG_DOC_SHARE:
            return Size(self.rng.randint(*LONG_DOC_TOKENS), size.output_tokens)
        return size

    def batch(self) -> Size:
        return self._out(self.rng.choice(self.all))

    def critical_mean_input(self) -> float:
        return sum(s.input_tokens for s in self.small) / len(self.small)


def _payload(size: Size) -> dict[str, Any]:
    content = filler_text(size.input_tokens)
    return {
        "model": MODEL,
        "max_tokens": size.output_tokens,
        "messages": [{"role": "user", "content": content}],
    }


def _spec(tier: str, tenant: str, size: Size) -> JobSpec:
    if tier == "critical":
        return JobSpec(tenant, "user_action", _payload(size))
    if tier == "standard":
        return JobSpec(tenant, "scheduled", _payload(size), STANDARD_SLA)
    return JobSpec(tenant, "batch_job", _payload(size))


def _critical_arrivals(args: argparse.Namespace, sizes: Sizes) -> list[tuple[float, Size]]:
    """Poisson arrivals over the window at the rate whose mean input tokens are the share."""
    rate = args.critical_share * ITPM / 60.0 / sizes.critical_mean_input()  # jobs per second
    rng = random.Random(args.seed + 1)
    arrivals: list[tuple[float, Size]] = []
    at = rng.expovariate(rate)
    while at < args.minutes * 60.0:
        arrivals.append((at, sizes.critical()))
        at += rng.expovariate(rate)
    return arrivals


def _start_workers(args: argparse.Namespace, dsn: str, base_url: str, logs: Path) -> list[Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGQUEUE_", "ANTHROPIC_"))}
    env.update(ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY="sandbox-key")
    procs = []
    for n in range(args.workers):
        argv = [sys.executable, "-c", "from pgqueue.cli import app; app()", "work"]
        argv += ["--dsn", dsn, "--concurrency", str(args.concurrency)]
        out = (logs / f"worker{n}.log").open("wb")
        procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT))
    try:
        _wait_listening(dsn, args.workers, logs)
    except BaseException:
        _stop_workers(procs)
        raise
    return procs


def _wait_listening(dsn: str, workers: int, logs: Path) -> None:
    """Until each worker's LISTEN connection is up: it is idle, waiting for jobs."""
    deadline = time.monotonic() + 90
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'pgqueue-listen'"
            ).fetchone()
            if row is not None and row[0] >= workers:
                time.sleep(1.0)  # its first claims found nothing
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers did not start; logs in {logs}")
            time.sleep(0.2)


def _stop_workers(procs: list[Any]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def _queued(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT priority::text, count(*) FROM pgqueue.jobs WHERE state = 'queued' GROUP BY 1"
    ).fetchall()
    return {tier: int(n) for tier, n in rows}


def _drive(args: argparse.Namespace, dsn: str, sizes: Sizes) -> dict[str, Any]:
    """Enqueue for the window: critical on time, standard and batch topped up every second."""
    arrivals = _critical_arrivals(args, sizes)
    tenants = [f"t{k}" for k in range(args.tenants)]
    rng = random.Random(args.seed + 2)
    least = {"standard": math.inf, "batch": math.inf}
    offered = sum(s.input_tokens for _at, s in arrivals)
    with psycopg.connect(dsn, autocommit=True) as conn:
        since = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
        start = time.monotonic()
        next_topup, index = 0.0, 0
        while (now := time.monotonic() - start) < args.minutes * 60.0:
            if now >= next_topup:
                depth = _queued(conn)
                specs = []
                for tier in ("standard", "batch"):
                    if next_topup > 0:
                        least[tier] = min(least[tier], depth.get(tier, 0))
                    draw = sizes.standard if tier == "standard" else sizes.batch
                    for _ in range(args.backlog - depth.get(tier, 0)):
                        specs.append(_spec(tier, rng.choice(tenants), draw()))
                if specs:
                    pgqueue.enqueue_many(conn, specs)
                next_topup += 1.0
            due = []
            while index < len(arrivals) and arrivals[index][0] <= now:
                due.append(_spec("critical", rng.choice(tenants), arrivals[index][1]))
                index += 1
            if due:
                pgqueue.enqueue_many(conn, due)
            time.sleep(0.02)
        until = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
        deadline = time.monotonic() + GRACE_SECONDS
        while time.monotonic() < deadline:  # let the critical jobs of the window finish
            left = conn.execute(
                "SELECT count(*) FROM pgqueue.jobs WHERE origin = 'user_action'"
                " AND state IN ('queued', 'running')"
            ).fetchone()
            if left is not None and left[0] == 0:
                break
            time.sleep(0.5)
    return {
        "since": since,
        "until": until,
        "critical_jobs_offered": len(arrivals),
        "critical_input_tokens_offered": offered,
        "critical_share_offered": offered / (ITPM * args.minutes),
        "least_queued": {k: (None if v == math.inf else int(v)) for k, v in least.items()},
    }


def _pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1); inf counts as a value (an unfinished job)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _summary(values: list[float]) -> dict[str, Any]:
    def num(v: float | None) -> float | None:
        return None if v is None or math.isinf(v) else round(v, 3)

    return {
        "p50": num(_pct(values, 0.5)),
        "p95": num(_pct(values, 0.95)),
        "p99": num(_pct(values, 0.99)),
        "max": num(max(values, default=None)),  # type: ignore[type-var]
        "within_slo": sum(1 for v in values if v <= SLO_SECONDS),
    }


def _collect(dsn: str, drive: dict[str, Any], sandbox_stats: dict[str, Any]) -> dict[str, Any]:
    window = {"since": drive["since"], "until": drive["until"]}
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        crit = conn.execute(
            "SELECT state::text AS state, priority::text AS tier, est_input_tokens,"
            " extract(epoch FROM started_at - enqueued_at)::float8 AS start,"
            " extract(epoch FROM finished_at - enqueued_at)::float8 AS finish"
            " FROM pgqueue.jobs WHERE origin = 'user_action'"
            " AND enqueued_at >= %(since)s AND enqueued_at < %(until)s",
            window,
        ).fetchall()
        tiers = conn.execute(
            "SELECT priority::text AS tier, count(*) AS jobs,"
            " sum(coalesce(input_tokens, est_input_tokens))::float8 AS input_tokens,"
            " sum(coalesce(output_tokens, 0))::float8 AS output_tokens"
            " FROM pgqueue.jobs WHERE started_at >= %(since)s AND started_at < %(until)s"
            " GROUP BY 1 ORDER BY 1",
            window,
        ).fetchall()
        throttled = conn.execute(
            "SELECT coalesce(sum(throttle_retries), 0)::int AS n FROM pgqueue.jobs"
        ).fetchone()
        demotions = conn.execute("SELECT count(*)::int AS n FROM pgqueue.demotions").fetchone()
    starts = [math.inf if r["start"] is None else r["start"] for r in crit]
    finishes = [math.inf if r["finish"] is None else r["finish"] for r in crit]
    worst = max(crit, key=lambda r: math.inf if r["start"] is None else r["start"], default=None)
    total = sum(t["input_tokens"] for t in tiers) or 1.0
    seconds = (drive["until"] - drive["since"]).total_seconds()
    share = {t["tier"]: t["input_tokens"] / total for t in tiers}
    critical = {
        "jobs": len(crit),
        "unfinished": sum(1 for r in crit if r["finish"] is None),
        "not_critical_tier": sum(1 for r in crit if r["tier"] != "critical"),
        "enqueue_to_start_seconds": _summary(starts),
        "enqueue_to_finish_seconds": _summary(finishes),
        "worst_wait": None
        if worst is None
        else {"input_tokens": worst["est_input_tokens"], "wait_seconds": worst["start"]},
    }
    p99 = critical["enqueue_to_finish_seconds"]["p99"]
    return {
        "window_seconds": round(seconds, 1),
        "critical": critical,
        "tiers": {
            t["tier"]: {
                "jobs_started": t["jobs"],
                "input_tokens": t["input_tokens"],
                "input_share": round(share[t["tier"]], 4),
                "output_tokens": t["output_tokens"],
            }
            for t in tiers
        },
        "input_tokens_per_minute": round(total / seconds * 60.0, 1),
        "input_quota_use": round(total / (ITPM + ITPM / 60.0 * seconds), 3),
        "sandbox": {k: sandbox_stats.get(k) for k in ("requests", "ok", "429", "529", "5xx")},
        "throttle_retries": throttled["n"] if throttled else None,
        "demotions": demotions["n"] if demotions else None,
        "verdict": {
            "critical_p99_finish_within_2s": p99 is not None and p99 <= SLO_SECONDS,
            "batch_share_at_least_4pct": share.get("batch", 0.0) >= BATCH_SHARE_TARGET,
        },
    }


def _sandbox_stats(base_url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"{base_url}/_sandbox/stats", timeout=10) as answer:
        data: dict[str, Any] = json.loads(answer.read())
    return data


def _commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
        check=False,
    )
    return out.stdout.strip() or "unknown"


def run(args: argparse.Namespace) -> dict[str, Any]:
    name = f"scr28b_tier_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(args.dsn, dbname=name)
    logs = Path(tempfile.mkdtemp(prefix="tier_capacity_"))
    try:
        migrate.upgrade(dsn)
        if args.tier_policy is not None:  # GUC pgqueue.tier_policy for every new session
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(
                    sql.SQL("ALTER DATABASE {} SET pgqueue.tier_policy = {}").format(
                        sql.Identifier(name), sql.Literal(args.tier_policy)
                    )
                )
        with psycopg.connect(dsn) as conn:
            queries.run(
                conn, "ratelimit_set", {"model": MODEL, "rpm": RPM, "itpm": ITPM, "otpm": OTPM}
            )
        sizes = Sizes(args.seed)
        config = SandboxConfig(
            requests_per_minute=RPM,
            input_tokens_per_minute=ITPM,
            output_tokens_per_minute=OTPM,
            seconds_per_output_token=0.002,
            base_latency_seconds=0.1,
            seed=args.seed,
        )
        with running_sandbox(config) as base_url:
            procs = _start_workers(args, dsn, base_url, logs)
            try:
                drive = _drive(args, dsn, sizes)
            finally:
                _stop_workers(procs)
            stats = _sandbox_stats(base_url)
        result = _collect(dsn, drive, stats)
        result.update(
            label=args.label,
            commit=_commit(),
            at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            tier_policy=args.tier_policy or "weighted (default)",
            critical_share_offered=round(drive["critical_share_offered"], 3),
            critical_jobs_offered=drive["critical_jobs_offered"],
            least_queued=drive["least_queued"],
            options={k: v for k, v in vars(args).items() if k not in ("dsn", "json_out")},
        )
        return result
    finally:
        if not args.keep:
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dsn", default=os.environ.get("PGQUEUE_DSN", "postgresql://root@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument(
        "--critical-share", type=float, default=0.5, help="of the input-token limit"
    )
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--backlog", type=int, default=20, help="queued jobs kept per lower tier")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tier-policy", choices=["weighted", "probabilistic", "strict"], help="default: weighted"
    )
    parser.add_argument("--label", default="")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()
    result = run(args)
    print(json.dumps(result, indent=2, default=str))
    if args.json_out is not None:
        doc: dict[str, Any] = {"runs": []}
        if args.json_out.exists():
            doc = json.loads(args.json_out.read_text())
        doc["runs"].append(result)
        args.json_out.write_text(json.dumps(doc, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
