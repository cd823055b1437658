"""Claim speed after many finished jobs versus a fresh table (issue 8, "bloat"). Not part of pytest.

Three template databases on one server, same schema (pgqueue at head), same ``--tenants``:

- ``fresh``: ``--jobs`` queued no-op jobs, then ``VACUUM ANALYZE``;
- ``aged``: first ``--finished`` finished jobs (succeeded, 5 % failed, every column a real
  finished job has: payload, model, tokens, result or last_error, timestamps over the past
  ``--history-hours``), inserted with one ``INSERT … SELECT generate_series``, then the same
  queued jobs as ``fresh``, then ``VACUUM ANALYZE`` (the steady state once autovacuum has run);
- ``unvacuumed`` (``--variants``): the finished jobs went through the queue first (inserted
  queued, then one ``UPDATE`` to their final state, triggers on: the queued-only partial
  indexes keep an entry for every one of them), then the queued jobs; never vacuumed nor
  analyzed (the state before autovacuum gets to the table).

Autovacuum is off on ``pgqueue.jobs`` in every template (so a run never meets a vacuum that
another variant missed). Each measured run clones a template (``CREATE DATABASE … TEMPLATE``,
then ``CHECKPOINT`` so that writing the clone out does not land in the run), drains its queue
with ``--procs`` worker-like processes (claim up to ``--batch`` jobs with the named query
``job_claim`` = ``pgqueue.claim_admitted``, commit, record them all with ``job_complete_many``,
commit; as ``pgqueue work`` does with its group-commit completer) and drops the clone.
Variants are interleaved, rotating the order each repeat, so that machine noise hits them
alike; the ratio (variant time / fresh time) is computed per repeat and its median reported,
with the median claim and completion latencies (less noisy than wall time on a shared
machine). ``--explain`` lists, for one claim + completion in each template (after a few
warm-up cycles), every scan of ``pgqueue.jobs`` with its rows and buffers (auto_explain,
nested statements, ANALYZE + BUFFERS); ``--explain-plans`` prints the whole plans.

    python bench/bloat.py --dsn postgresql://root@127.0.0.1/postgres \
        --jobs 20000 --finished 1000000 --repeats 5 --json bench/bloat.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import statistics
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgqueue.db import migrate, queries
from pgqueue.worker.completer import success_batch

ORIGINS = "(ARRAY['user_action', 'scheduled', 'batch_job'])[1 + g %% 3]::pgqueue.origin"
TIERS = "(ARRAY['critical', 'standard', 'batch'])[1 + g %% 3]::pgqueue.tier"
PAYLOAD = """jsonb_build_object(
    'model', 'claude-haiku-4-5', 'max_tokens', 512,
    'messages', jsonb_build_array(jsonb_build_object(
        'role', 'user',
        'content',
        'Summarise support ticket ' || g || ': ' || md5(g::text) || md5((g + 1)::text))))"""

# Finished jobs as pgqueue leaves them: 95 % succeeded (result, tokens), 5 % failed after
# their attempts (last_error); finished over the past `hours`, in id order. Column -> value.
FAILED = "g %% 20 = 0"
FINISHED = {
    "tenant_id": "'t' || (g %% %(tenants)s)",
    "kind": "'anthropic.messages'",
    "origin": ORIGINS,
    "sla_seconds": "(CASE g %% 3 WHEN 1 THEN 3600 END)::double precision",
    "priority": TIERS,
    "state": f"(CASE WHEN {FAILED} THEN 'failed' ELSE 'succeeded' END)::pgqueue.job_state",
    "payload": PAYLOAD,
    "model": "'claude-haiku-4-5'",
    "est_input_tokens": "200 + g %% 800",
    "max_output_tokens": "512",
    "cost": "1 + (g %% 4)",
    "attempts": f"CASE WHEN {FAILED} THEN 5 ELSE 1 END",
    "run_at": "fin - interval '3 seconds'",
    "enqueued_at": "fin - interval '3 seconds'",
    "started_at": "fin - interval '2 seconds'",
    "finished_at": "fin",
    "lease_token": "gen_random_uuid()",
    "worker_id": "'host-' || (g %% 4) || ':' || (1000 + g %% 7)",
    "result": f"""CASE WHEN NOT {FAILED} THEN jsonb_build_object(
        'id', 'msg_' || md5(g::text), 'type', 'message', 'role', 'assistant',
        'model', 'claude-haiku-4-5', 'stop_reason', 'end_turn',
        'content', jsonb_build_array(jsonb_build_object(
            'type', 'text', 'text', 'Summary: ' || md5((g * 7)::text) || md5((g * 11)::text))),
        'usage', jsonb_build_object('input_tokens', 200 + g %% 800,
                                    'output_tokens', 20 + g %% 300)) END""",
    "last_error": f"CASE WHEN {FAILED} THEN 'HTTP 500: overloaded (attempt 5 of 5)' END",
    "input_tokens": f"CASE WHEN NOT {FAILED} THEN 200 + g %% 800 END",
    "output_tokens": f"CASE WHEN NOT {FAILED} THEN 20 + g %% 300 END",
    "dedupe_key": "CASE WHEN g %% 5 = 0 THEN 'order-' || g END",
}
# What a job that is still queued has instead (the unvacuumed variant inserts these first).
AS_QUEUED = {
    "state": "'queued'::pgqueue.job_state",
    "attempts": "0",
    "started_at": "NULL::timestamptz",
    "finished_at": "NULL::timestamptz",
    "lease_token": "NULL::uuid",
    "worker_id": "NULL::text",
    "result": "NULL::jsonb",
    "last_error": "NULL::text",
    "input_tokens": "NULL::integer",
    "output_tokens": "NULL::integer",
}
FROM_SERIES = """
FROM generate_series(1, %(n)s) g,
     LATERAL (SELECT now() - make_interval(
                         secs => %(hours)s * 3600 * (1 - g::double precision / %(n)s)) AS fin) f
"""


def _insert_finished(queued: bool) -> str:
    values = {**FINISHED, **(AS_QUEUED if queued else {})}
    return (
        f"INSERT INTO pgqueue.jobs ({', '.join(values)}) "
        f"SELECT {', '.join(values.values())} {FROM_SERIES}"
    )


def _finish_in_place() -> str:
    """The unvacuumed variant: its queued 'finished' jobs finish (one UPDATE, triggers on)."""
    moved = [c for c in AS_QUEUED]
    return (
        f"UPDATE pgqueue.jobs j SET {', '.join(f'{c} = f.{c}' for c in moved)} "
        f"FROM (SELECT g AS id, {', '.join(f'{FINISHED[c]} AS {c}' for c in moved)} "
        f"{FROM_SERIES}) f WHERE j.id = f.id"
    )


QUEUED = f"""
INSERT INTO pgqueue.jobs (tenant_id, kind, origin, priority, payload, cost, est_input_tokens)
SELECT 't' || (g %% %(tenants)s), 'pgqueue.noop', {ORIGINS}, {TIERS}, {PAYLOAD}, 1 + (g %% 4),
       200 + g %% 800
FROM generate_series(1, %(n)s) g
"""


def _admin(server: str, statement: sql.Composed) -> None:
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(statement)


def _create(server: str, name: str, template: str | None = None) -> str:
    stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        stmt = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template)
        )
    _admin(server, stmt)
    return make_conninfo(server, dbname=name)


def _drop(server: str, name: str) -> None:
    _admin(server, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _build(server: str, name: str, variant: str, args: argparse.Namespace) -> float:
    """Create template ``name`` for ``variant``; returns the seconds it took."""
    t0 = time.perf_counter()
    dsn = _create(server, name)
    migrate.upgrade(dsn)
    params = {"tenants": args.tenants, "n": args.finished, "hours": args.history_hours}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE pgqueue.jobs SET (autovacuum_enabled = off)")
        conn.execute(
            "INSERT INTO pgqueue.tenants (tenant_id) SELECT 't' || g FROM generate_series(0, %s) g",
            (args.tenants - 1,),
        )
        if variant == "aged":
            conn.execute(_insert_finished(queued=False), params)
        elif variant == "unvacuumed":
            # Through the queue: inserted queued (enqueue triggers), then finished in place.
            conn.execute(_insert_finished(queued=True), params)
            moved = conn.execute(_finish_in_place(), params).rowcount
            if moved != args.finished:
                raise RuntimeError(f"finished {moved} of {args.finished} jobs")
        # The new jobs (highest ids), enqueued after the finished ones; the first claim folds
        # their tenants into the DRR round.
        conn.execute(QUEUED, {"tenants": args.tenants, "n": args.jobs})
        if variant != "unvacuumed":
            conn.execute("VACUUM ANALYZE pgqueue.jobs")
        conn.execute("CHECKPOINT")
    return time.perf_counter() - t0


def _completion(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``job_complete_many`` parameters recording every claimed row as a success, as the
    worker's completer does (a small result, token counts 0)."""
    return success_batch(
        (r["id"], r["tenant_id"], r["lease_token"], {"ok": True}, 0, 0) for r in rows
    )


def _worker(dsn: str, jobs: int, batch: int, start_at: float) -> dict[str, Any]:
    """Claim and complete until the queue is empty (or ``jobs`` done), like one worker."""
    worker = f"bloat-{os.getpid()}"
    claim_ms: list[float] = []
    complete_ms: list[float] = []
    with psycopg.connect(dsn) as conn:
        queries.run(
            conn,
            "job_claim",
            {"limit": 0, "worker_id": worker, "lease_seconds": 60, "skip_kinds": []},
        )
        conn.commit()
        while time.time() < start_at:
            time.sleep(0.001)
        start = time.perf_counter()
        done = 0
        while done < jobs:
            t0 = time.perf_counter()
            rows = [
                r
                for r in queries.run(
                    conn,
                    "job_claim",
                    {
                        "limit": min(batch, jobs - done),
                        "worker_id": worker,
                        "lease_seconds": 60,
                        "skip_kinds": [],
                    },
                )
                if r["id"] is not None
            ]
            conn.commit()
            t1 = time.perf_counter()
            claim_ms.append((t1 - t0) * 1000)
            if not rows:
                break
            got = queries.run(conn, "job_complete_many", _completion(rows))
            conn.commit()
            complete_ms.append((time.perf_counter() - t1) * 1000)
            if len(got) != len(rows):
                raise RuntimeError(f"{len(rows) - len(got)} completions lost their lease")
            done += len(rows)
        end = time.perf_counter()
    return {
        "start": start,
        "end": end,
        "done": done,
        "claim_ms": claim_ms,
        "complete_ms": complete_ms,
    }


def _measure(server: str, template: str, args: argparse.Namespace, ctx: Any) -> dict[str, float]:
    name = f"{template}_run"
    dsn = _create(server, name, template)
    # The clone was written through the WAL: flush it now, not during the measured run.
    _admin(server, sql.Composed([sql.SQL("CHECKPOINT")]))
    try:
        start_at = time.time() + 1.0
        with ctx.Pool(args.procs) as pool:
            out = pool.starmap(_worker, [(dsn, args.jobs, args.batch, start_at)] * args.procs)
        with psycopg.connect(dsn) as conn:
            left = conn.execute(
                "SELECT count(*) FROM pgqueue.jobs WHERE state IN ('queued', 'running')"
            ).fetchone()
        if left is None or left[0] != 0:
            raise RuntimeError(f"{template}: {left} jobs not finished")
    finally:
        _drop(server, name)
    wall = max(o["end"] for o in out) - min(o["start"] for o in out)
    done = sum(o["done"] for o in out)
    claims = [ms for o in out for ms in o["claim_ms"]]
    completes = [ms for o in out for ms in o["complete_ms"]]
    return {
        "seconds": wall,
        "jobs": done,
        "jobs_per_s": done / wall,
        "claim_ms_median": statistics.median(claims),
        "complete_ms_median": statistics.median(completes),
    }


_BUFFERS = re.compile(r"Buffers: shared ((?:\w+=\d+ ?)+)")
_NODE = re.compile(
    r"^(?P<indent>\s*)(?:->\s+)?(?P<node>(?:Bitmap Heap|Bitmap Index|Index Only|Index|Seq) Scan"
    r"(?: using (?P<index>\w+))? on (?P<table>\w+)).*?\(actual rows=(?P<rows>\d+(?:\.\d+)?) "
    r"loops=(?P<loops>\d+)\)"
)


def _buffers(line: str) -> dict[str, int]:
    m = _BUFFERS.search(line)
    if m is None:
        return {}
    return {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


def _scans(plan: str) -> list[dict[str, Any]]:
    """The scan nodes on pgqueue.jobs (or its indexes) of one plan, with rows and buffers."""
    lines = plan.splitlines()
    found = []
    for i, line in enumerate(lines):
        m = _NODE.match(line)
        if m is None or not (m["table"] == "jobs" or (m["index"] or "").startswith("jobs_")):
            continue
        depth = len(m["indent"])
        buffers: dict[str, int] = {}
        for below in lines[i + 1 :]:
            if below.strip().startswith("->") or len(below) - len(below.lstrip()) <= depth:
                break
            if "Buffers:" in below:
                buffers = _buffers(below)
                break
        found.append(
            {
                "node": m["node"],
                "rows": round(float(m["rows"])),  # Postgres 18: "1.00"
                "loops": int(m["loops"]),
                "buffers": buffers,
            }
        )
    return found


def _cycle(conn: psycopg.Connection[Any], batch: int) -> None:
    """One claim (committed) and the completion of what it took (committed)."""
    with conn.transaction():
        rows = [
            r
            for r in queries.run(
                conn,
                "job_claim",
                {"limit": batch, "worker_id": "x", "lease_seconds": 60, "skip_kinds": []},
            )
            if r["id"] is not None
        ]
    with conn.transaction():
        queries.run(conn, "job_complete_many", _completion(rows))


def _explain(dsn: str, batch: int, warmup: int = 5) -> dict[str, Any]:
    """Plans (ANALYZE, BUFFERS) of every statement of one claim+complete cycle that reads
    pgqueue.jobs, after ``warmup`` cycles; and, per scan node on jobs, rows and buffers."""
    plans: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(warmup):
            _cycle(conn, batch)
        conn.execute("LOAD 'auto_explain'")
        for setting in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_analyze = on",
            "auto_explain.log_buffers = on",
            "auto_explain.log_timing = off",
            "auto_explain.log_nested_statements = on",
            "auto_explain.log_level = notice",
            "client_min_messages = notice",
        ):
            conn.execute(f"SET {setting}")
        conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
        _cycle(conn, batch)
    statements: list[dict[str, Any]] = [{"plan": p, "scans": _scans(p)} for p in plans]
    statements = [st for st in statements if st["scans"]]
    total: dict[str, int] = {}
    for st in statements:
        for scan in st["scans"]:
            for k, v in scan["buffers"].items():
                total[k] = total.get(k, 0) + v
    return {"statements": statements, "jobs_scan_buffers": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("PGQUEUE_DSN", ""))
    parser.add_argument("--jobs", type=int, default=20_000, help="queued no-op jobs per run")
    parser.add_argument("--finished", type=int, default=1_000_000, help="finished jobs (aged)")
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--history-hours", type=float, default=24.0)
    parser.add_argument("--variants", default="aged,unvacuumed", help="compared with fresh")
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=10, help="claim limit (free slots)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--explain", action="store_true", help="scans on jobs of one claim+complete, buffers"
    )
    parser.add_argument("--explain-plans", action="store_true", help="and print whole plans")
    parser.add_argument("--json", default="bench/bloat.json")
    args = parser.parse_args()
    ctx = multiprocessing.get_context("spawn")
    tag = uuid.uuid4().hex[:6]
    variants = ["fresh", *[v for v in args.variants.split(",") if v]]
    templates = {v: f"pgq_bloat_{tag}_{v}" for v in variants}
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    ratios: dict[str, list[float]] = {v: [] for v in variants if v != "fresh"}
    built: dict[str, float] = {}
    explained: dict[str, dict[str, Any]] = {}
    try:
        for v in variants:
            built[v] = _build(args.dsn, templates[v], v, args)
            print(f"built {v} in {built[v]:.0f} s", flush=True)
        if args.explain:
            for v in variants:
                clone = f"{templates[v]}_x"
                try:
                    explained[v] = _explain(_create(args.dsn, clone, templates[v]), args.batch)
                finally:
                    _drop(args.dsn, clone)
                if args.explain_plans:
                    for st in explained[v]["statements"]:
                        print(f"--- {v}\n{st['plan']}\n")
                for st in explained[v]["statements"]:
                    for scan in st["scans"]:
                        print(
                            f"{v:<12} {scan['node']:<60} rows={scan['rows']:<4} "
                            f"loops={scan['loops']:<3} {scan['buffers']}"
                        )
                print(f"{v:<12} buffers of all scans on jobs: {explained[v]['jobs_scan_buffers']}")
        for r in range(args.repeats):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for v in order:
                runs[v].append(_measure(args.dsn, templates[v], args, ctx))
            line = []
            for v in variants:
                line.append(f"{v} {runs[v][-1]['seconds']:.1f} s")
                if v != "fresh":
                    ratios[v].append(runs[v][-1]["seconds"] / runs["fresh"][-1]["seconds"])
                    line[-1] += f" ({ratios[v][-1]:.2f}x)"
            print(f"repeat {r + 1}: " + ", ".join(line), flush=True)
    finally:
        for v in variants:
            _drop(args.dsn, templates[v])
    summary: dict[str, Any] = {
        "command": "python bench/bloat.py "
        + " ".join(
            f"--{k.replace('_', '-')} {v}"
            for k, v in vars(args).items()
            if k not in ("dsn", "explain", "explain_plans", "json")
        ),
        "jobs": args.jobs,
        "finished": args.finished,
        "tenants": args.tenants,
        "procs": args.procs,
        "batch": args.batch,
        "repeats": args.repeats,
        "build_seconds": {v: round(s, 1) for v, s in built.items()},
        "variants": {},
    }
    print(
        f"{'variant':<12} {'median s':>9} {'jobs/s':>8} {'claim ms':>9} {'complete ms':>12} "
        f"{'time / fresh':>13}"
    )
    for v in variants:
        med = {k: statistics.median(run[k] for run in runs[v]) for k in runs[v][0]}
        ratio = statistics.median(ratios[v]) if v in ratios else 1.0
        summary["variants"][v] = {
            "median_seconds": round(med["seconds"], 3),
            "median_jobs_per_s": round(med["jobs_per_s"], 1),
            "median_claim_ms": round(med["claim_ms_median"], 3),
            "median_complete_ms": round(med["complete_ms_median"], 3),
            "time_ratio_vs_fresh": round(ratio, 3),
            "runs": [{k: round(x, 3) for k, x in run.items()} for run in runs[v]],
            "ratios": [round(x, 3) for x in ratios.get(v, [])],
        }
        if v in explained:
            summary["variants"][v]["explain"] = {
                "jobs_scan_buffers": explained[v]["jobs_scan_buffers"],
                "scans": [sc for st in explained[v]["statements"] for sc in st["scans"]],
            }
        print(
            f"{v:<12} {med['seconds']:>9.2f} {med['jobs_per_s']:>8.0f} "
            f"{med['claim_ms_median']:>9.2f} {med['complete_ms_median']:>12.2f} {ratio:>13.2f}"
        )
    with open(args.json, "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
