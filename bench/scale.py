"""Scale of the claim (issue 28, done-when 5). Not part of pytest.

    .venv/bin/python bench/scale.py --dsn postgresql://root@127.0.0.1:5432/postgres

Every database is a scratch database named ``scale_<fingerprint>_<name>`` (the fingerprint
hashes pgqueue's schema, migrations and named queries, so a changed scheduler rebuilds them);
templates are built once (``--keep`` keeps them for the next run) and each measurement runs on
a clone (``CREATE DATABASE … TEMPLATE``). All jobs are ``pgqueue.noop`` jobs (one lane), origin
``scheduled`` with a 300 s SLA (tier standard), cost 1, enqueued with ``pgqueue.enqueue_many``
in batches of 100,000. The worker step is the product's: the named query ``job_claim`` (limit
10, ``pgqueue.claim_admitted``) on an autocommit connection, then ``job_complete_many`` of the
jobs it got. Phases (one line each):

- (a) claim statement time at 1,000,000 queued over 10,000 tenants vs 10,000 over 10: both
  templates folded once (the first fold is timed while building), ``--claims`` claims on each,
  alternated claim by claim after 20 warm-up claims; median and p90; per-function time
  (``track_functions = all``); then auto_explain (ANALYZE, BUFFERS, nested statements) of one
  claim and one completion at 1M/10k: every scan of ``pgqueue.jobs`` with rows and buffers.
- (b) one tenant's 1,000,000 jobs committed in one transaction (never vacuumed nor analyzed
  afterwards, as right after the commit), a claim loop in a thread; new tenants enqueue one
  job each (the first at once, then every 0.25 s): time from each job's commit until a claim
  returned it. Then 1,000 new tenants' 100,000 jobs arrive at once, one more tenant's job right
  after: the longest claim after the arrival (it folds them) and that job's wait.
- (c) 500,000 succeeded rows (vacuumed) vs none, 5,000 queued over 10 tenants in each: both
  drained claim by claim, alternated; claim median and drain time (sum of claim + completion
  cycles), ratio aged / fresh; ``--repeats`` times.

The box is shared: the ratios come from the same run, interleaved; ``meta.load`` records the
load average.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from pgqueue.db import migrate, queries
from pgqueue.worker.completer import success_batch

ROOT = Path(__file__).resolve().parent.parent
BUILD = "4"  # bump when a template's content changes
LANE, TIER = "pgqueue.noop", "standard"
ENQUEUE = """
SELECT count(*) FROM pgqueue.enqueue_many(
    ARRAY(SELECT %(prefix)s || (g %% %(tenants)s::int)
          FROM generate_series(%(lo)s::int, %(hi)s::int) g),
    array_fill('scheduled'::text, ARRAY[%(n)s::int]),
    ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(%(lo)s::int, %(hi)s::int) g),
    array_fill(300::float8, ARRAY[%(n)s::int]),
    array_fill('pgqueue.noop'::text, ARRAY[%(n)s::int]))
"""
FINISHED = """
INSERT INTO pgqueue.jobs (tenant_id, kind, origin, sla_seconds, priority, state, payload, cost,
                          attempts, run_at, enqueued_at, started_at, finished_at, lease_token,
                          worker_id, result, input_tokens, output_tokens)
SELECT 't' || (g %% 10), 'pgqueue.noop', 'scheduled', 300, 'standard', 'succeeded',
       jsonb_build_object('n', g), 1, 1, f - interval '3 s', f - interval '3 s', f - interval '2 s',
       f, gen_random_uuid(), 'w', jsonb_build_object('ok', md5(g::text)), 100, 20
FROM generate_series(1, %(n)s) g, LATERAL (SELECT now() - (%(n)s - g) * interval '10 ms') x(f)
"""


def fingerprint() -> str:
    h = hashlib.sha256(BUILD.encode())
    for folder in ("pgqueue/sql/schema", "pgqueue/sql/queries", "pgqueue/migrations/versions"):
        for f in sorted((ROOT / folder).glob("*")):
            if f.suffix in (".sql", ".py"):
                h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:8]


def median_p90(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {
        "median": round(statistics.median(s), 3),
        "p90": round(s[int(len(s) * 0.9)], 3),
        "n": len(s),
    }


class Server:
    """Scratch databases on one server (names ``scale_<fingerprint>_<name>``)."""

    def __init__(self, dsn: str, keep: bool) -> None:
        self.dsn, self.keep, self.fp = dsn, keep, fingerprint()

    def name(self, what: str) -> str:
        return f"scale_{self.fp}_{what}"

    def url(self, what: str) -> str:
        return make_conninfo(self.dsn, dbname=self.name(what))

    def admin(self, sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            cur = c.execute(sql)
            return cur.fetchall() if cur.description else []

    def ready(self, what: str) -> bool:
        return bool(
            self.admin(
                "SELECT 1 FROM pg_database d JOIN pg_shdescription s ON s.objoid = d.oid"
                f" WHERE d.datname = '{self.name(what)}' AND s.description = 'ready'"
            )
        )

    def drop(self, what: str) -> None:
        self.admin(f"DROP DATABASE IF EXISTS {self.name(what)} WITH (FORCE)")

    def clone(self, template: str, what: str) -> str:
        self.drop(what)
        self.admin(
            f"CREATE DATABASE {self.name(what)} TEMPLATE {self.name(template)} STRATEGY FILE_COPY"
        )
        return self.url(what)

    def template(
        self, what: str, build: Callable[[str], dict[str, Any]], base: str | None = "base"
    ) -> dict[str, Any]:
        """Build template ``what`` (from ``base``) unless a ready one exists; its build notes."""
        if self.ready(what):
            return {"reused": True}
        start = time.perf_counter()
        if base is None:
            self.drop(what)
            self.admin(f"CREATE DATABASE {self.name(what)}")
        else:
            self.clone(base, what)
        notes = build(self.url(what))
        notes["build_s"] = round(time.perf_counter() - start, 1)
        self.admin(f"COMMENT ON DATABASE {self.name(what)} IS 'ready'")
        return notes

    def drop_all(self) -> None:
        for (name,) in self.admin("SELECT datname FROM pg_database WHERE datname LIKE 'scale\\_%'"):
            self.admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def enqueue(c: psycopg.Connection[Any], prefix: str, tenants: int, n: int) -> float:
    """``n`` jobs round-robin over ``prefix0..`` in the caller's transaction; seconds."""
    start = time.perf_counter()
    for lo in range(1, n + 1, 100_000):
        hi = min(n, lo + 99_999)
        c.execute(
            ENQUEUE, {"prefix": prefix, "tenants": tenants, "lo": lo, "hi": hi, "n": hi - lo + 1}
        )
    return time.perf_counter() - start


def vacuum(url: str) -> None:
    """What autovacuum would have done by now (it is off on the shared test server): every
    table of the database vacuumed and analyzed (flows included: without statistics a fold
    read all 10,000 flows three times, 25 ms)."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("VACUUM ANALYZE")


def timed_fold(url: str) -> dict[str, float]:
    """The first fold, then the next ones until one stamps nothing (a fold stamps a joiner's
    first job, then at most pgqueue.stamp_slice_flows flows' horizon): the template starts
    stamped up to the horizon, as a queue that has been claimed from."""
    times, jobs = [], []
    with psycopg.connect(url, autocommit=True) as c:
        while True:
            start = time.perf_counter()
            row = c.execute("SELECT pgqueue.fold(%s, %s)", (LANE, TIER)).fetchone()
            times.append((time.perf_counter() - start) * 1000)
            jobs.append(row[0] if row else 0)
            if not jobs[-1]:
                break
    return {
        "first_fold_ms": round(times[0], 1),
        "first_fold_jobs": jobs[0],
        "folds_to_horizon": len(times) - 1,
        "folds_total_ms": round(sum(times), 1),
        "folds_max_ms": round(max(times), 1),
        "jobs_stamped": sum(jobs),
    }


def build_base(url: str) -> dict[str, Any]:
    migrate.upgrade(url)
    with psycopg.connect(url) as c:
        c.execute(
            "INSERT INTO pgqueue.tenants (tenant_id) SELECT 't' || g"
            " FROM generate_series(0, 9999) g UNION ALL SELECT 'n' || g"
            " FROM generate_series(0, 999) g UNION ALL SELECT 'p' || g"
            " FROM generate_series(0, 99) g UNION ALL SELECT 'big'"
        )
    return {}


def build_queued(
    queued: int, tenants: int, finished: int = 0, fold: bool = True
) -> Callable[[str], dict[str, Any]]:
    def build(url: str) -> dict[str, Any]:
        with psycopg.connect(url) as c:
            if finished:
                c.execute(FINISHED, {"n": finished})
            seconds = enqueue(c, "t", tenants, queued)
        vacuum(url)
        notes: dict[str, Any] = {"enqueue_s": round(seconds, 1)}
        if fold:
            notes |= timed_fold(url)
            vacuum(url)
        return notes

    return build


def build_big(url: str) -> dict[str, Any]:
    with psycopg.connect(url) as c:
        seconds = enqueue(c, "big", 1, 1_000_000)  # one transaction
    return {"enqueue_s": round(seconds, 1)}


@contextmanager
def worker(url: str) -> Iterator[Callable[[], tuple[float, list[int]]]]:
    """A connection as a worker uses it; yields step(): claim 10 (timed, ms), complete them;
    returns (ms, the ids claimed)."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SET track_functions = 'all'")

        def step() -> tuple[float, list[int]]:
            start = time.perf_counter()
            rows = queries.run(
                c,
                "job_claim",
                {"limit": 10, "worker_id": "scale", "lease_seconds": 60, "skip_kinds": []},
            )
            ms = (time.perf_counter() - start) * 1000
            rows = [r for r in rows if r["id"] is not None]
            if rows:
                queries.run(
                    c,
                    "job_complete_many",
                    success_batch(
                        (r["id"], r["tenant_id"], r["lease_token"], None, None, None) for r in rows
                    ),
                )
            return ms, [r["id"] for r in rows]

        yield step


def function_times(url: str) -> dict[str, list[float]]:
    time.sleep(0.7)  # the session's counters reach the view when it idles
    with psycopg.connect(url) as c:
        return {
            r[0]: [r[1], round(r[2], 1), round(r[3], 1)]
            for r in c.execute(
                "SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions"
                " WHERE schemaname = 'pgqueue' ORDER BY total_time DESC LIMIT 8"
            )
        }


def phase_a(srv: Server, claims: int) -> dict[str, Any]:
    urls = {"10k/10": srv.clone("small", "a_small"), "1M/10k": srv.clone("large", "a_large")}
    times: dict[str, list[float]] = {k: [] for k in urls}
    with worker(urls["10k/10"]) as small, worker(urls["1M/10k"]) as large:
        steps = {"10k/10": small, "1M/10k": large}
        for i in range(20 + claims):
            for label in list(steps) if i % 2 else list(reversed(steps)):
                ms, got = steps[label]()
                assert len(got) == 10, (label, got)
                if i >= 20:
                    times[label].append(ms)
    out: dict[str, Any] = {k: median_p90(v) for k, v in times.items()}
    out["ratio_median"] = round(out["1M/10k"]["median"] / out["10k/10"]["median"], 2)
    out["ratio_p90"] = round(out["1M/10k"]["p90"] / out["10k/10"]["p90"], 2)
    out["functions"] = {k: function_times(u) for k, u in urls.items()}
    out["explain_1M/10k"] = explain(urls["1M/10k"])
    for what in ("a_small", "a_large"):
        srv.drop(what)
    return out


def explain(url: str) -> dict[str, list[dict[str, Any]]]:
    """auto_explain (ANALYZE, BUFFERS, nested statements) of one claim + completion: per
    statement its duration and the scans of jobs, flows and cursors. `sweep`: the first claim
    of a session (the once-a-second sweep is due); `steady`: the claim right after it."""
    out: dict[str, list[dict[str, Any]]] = {}
    plans: list[str] = []
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("LOAD 'auto_explain'")
        for s in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_analyze = on",
            "auto_explain.log_buffers = on",
            "auto_explain.log_timing = on",
            "auto_explain.log_nested_statements = on",
            "client_min_messages = log",
        ):
            c.execute(f"SET {s}")
        c.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
        for label in ("sweep", "steady"):
            plans.clear()
            rows = queries.run(
                c,
                "job_claim",
                {"limit": 10, "worker_id": "x", "lease_seconds": 60, "skip_kinds": []},
            )
            queries.run(
                c,
                "job_complete_many",
                success_batch(
                    (r["id"], r["tenant_id"], r["lease_token"], None, None, None) for r in rows
                ),
            )
            out[label] = [_plan_summary(p) for p in plans]
    return out


def _plan_summary(plan: str) -> dict[str, Any]:
    lines = plan.splitlines()
    text = next((ln.split("Query Text:", 1)[1].strip() for ln in lines if "Query Text:" in ln), "")
    scans = [
        ln.rstrip()
        for i, ln in enumerate(lines)
        if any(t in ln for t in (" on jobs", " on flows", " on cursors", " on lane_tiers"))
        or (" Buffers:" in ln and i > 0 and " on jobs" in lines[i - 1])
    ]
    return {"duration": lines[0].strip() if lines else "", "query": text[:160], "scans": scans}


def phase_b(srv: Server, analyze: bool) -> dict[str, Any]:
    """(b) on a clone of the 1M-job template: as committed (no statistics on the new rows,
    as in the minute before autovacuum analyzes them), or after ANALYZE."""
    url = srv.clone("big", "b_big")
    if analyze:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("ANALYZE pgqueue.jobs")
    seen: dict[int, float] = {}
    claims: list[tuple[float, float, int]] = []
    functions: dict[str, list[float]] = {}
    stop = threading.Event()

    def loop() -> None:
        with worker(url) as step:
            while not stop.is_set():
                start = time.perf_counter()
                ms, got = step()
                claims.append((start, ms, len(got)))
                for job_id in got:
                    seen.setdefault(job_id, start + ms / 1000)
        functions.update(function_times(url))

    def probe(c: psycopg.Connection[Any], tenant: str) -> tuple[int, float]:
        job_id = c.execute(
            "SELECT pgqueue.enqueue(%s, 'scheduled', %s::jsonb, 300, 'pgqueue.noop')",
            (tenant, '{"probe": 1}'),
        ).fetchone()
        c.commit()
        assert job_id is not None
        return int(job_id[0]), time.perf_counter()

    def wait_for(jobs: list[tuple[int, float]], limit: float) -> list[dict[str, Any]]:
        deadline = time.perf_counter() + limit
        while time.perf_counter() < deadline and not all(j in seen for j, _ in jobs):
            time.sleep(0.02)
        out: list[dict[str, Any]] = []
        for j, t in jobs:
            if j not in seen:
                out.append({"wait_s": None})
                continue
            before = [n for s, ms, n in claims if t < s + ms / 1000 < seen[j]]
            out.append(
                {
                    "wait_s": round(seen[j] - t, 3),
                    "claims_before": len(before),
                    "jobs_before": sum(before),
                }
            )
        return out

    thread = threading.Thread(target=loop, daemon=True)
    with psycopg.connect(url) as c:
        thread.start()
        jobs = [probe(c, "p0")]
        for i in range(1, 12):
            time.sleep(0.25)
            jobs.append(probe(c, f"p{i}"))
        waits = wait_for(jobs, 30)
        arrived = time.perf_counter()
        seconds = enqueue(c, "n", 1000, 100_000)
        c.commit()
        arrived_commit = time.perf_counter()
        # their run_at (the enqueue's start) is older than the last fold: the sweep finds them
        time.sleep(2.5)
        stamped = c.execute(
            "SELECT count(*) FROM pgqueue.flows WHERE tenant_id LIKE 'n%%'"
        ).fetchone()
        c.commit()
        late = wait_for([probe(c, "p50")], 15)
        time.sleep(0.3)
    stop.set()
    thread.join()
    after = [ms for s, ms, _ in claims if s + ms / 1000 >= arrived_commit]
    srv.drop("b_big")
    valid = [w["wait_s"] for w in waits if w["wait_s"] is not None]
    return {
        "statistics": "analyzed" if analyze else "none since the 1M commit",
        "probes": waits,
        "max_wait_s": max(valid) if valid else None,
        "median_wait_s": statistics.median(valid) if valid else None,
        "claims_ms": median_p90([ms for _, ms, _ in claims]),
        "arrivals_enqueue_s": round(seconds, 2),
        "arrivals_commit_s": round(arrived_commit - arrived, 2),
        "first_claims_after_arrivals_ms": [round(ms, 1) for ms in after[:5]],
        "arrivals_with_a_flow_after_2.5_s": stamped[0] if stamped else None,
        "longest_claim_after_arrivals_ms": round(max(after), 1) if after else None,
        "probe_after_arrivals": late[0],
        "functions": functions,
    }


def phase_c(srv: Server, repeats: int) -> dict[str, Any]:
    runs: list[dict[str, dict[str, Any]]] = []
    for r in range(repeats):
        urls = {"fresh": srv.clone("fresh", "c_fresh"), "aged": srv.clone("aged", "c_aged")}
        times: dict[str, list[float]] = {k: [] for k in urls}
        rest: dict[str, list[float]] = {k: [] for k in urls}
        drain: dict[str, float] = dict.fromkeys(urls, 0.0)
        with worker(urls["fresh"]) as fresh, worker(urls["aged"]) as aged:
            steps = {"fresh": fresh, "aged": aged}
            live = set(steps)
            i = 0
            while live:
                order = list(steps) if (i + r) % 2 else list(reversed(steps))
                for label in order:
                    if label not in live:
                        continue
                    start = time.perf_counter()
                    ms, got = steps[label]()
                    cycle = time.perf_counter() - start
                    drain[label] += cycle
                    if not got:
                        live.discard(label)
                    else:
                        times[label].append(ms)
                        rest[label].append(cycle * 1000 - ms)
                i += 1
        runs.append(
            {
                k: {
                    "claim_ms": median_p90(times[k]),
                    "complete_ms": median_p90(rest[k]),
                    "drain_s": round(drain[k], 3),
                    "functions": function_times(urls[k]),
                }
                for k in urls
            }
        )
        for what in ("c_fresh", "c_aged"):
            srv.drop(what)
    ratio_claim = [x["aged"]["claim_ms"]["median"] / x["fresh"]["claim_ms"]["median"] for x in runs]
    ratio_drain = [x["aged"]["drain_s"] / x["fresh"]["drain_s"] for x in runs]
    return {
        "runs": runs,
        "ratio_claim_median": round(statistics.median(ratio_claim), 2),
        "ratio_drain": round(statistics.median(ratio_drain), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--json", default=str(ROOT / "bench" / "scale.json"))
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--phases", default="abc")
    parser.add_argument("--keep", action="store_true", help="keep the templates for a re-run")
    parser.add_argument("--drop", action="store_true", help="only drop every scale_ database")
    args = parser.parse_args()
    srv = Server(args.dsn, args.keep)
    if args.drop:
        srv.drop_all()
        return
    t0 = time.perf_counter()
    out: dict[str, Any] = {
        "meta": {
            "fingerprint": srv.fp,
            "cores": os.cpu_count(),
            "load_before": os.getloadavg(),
            "shared_box": True,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    }
    builds: dict[str, Any] = {"base": srv.template("base", build_base, base=None)}
    if "a" in args.phases:
        builds["small"] = srv.template("small", build_queued(10_000, 10))
        builds["large"] = srv.template("large", build_queued(1_000_000, 10_000))
    if "b" in args.phases:
        builds["big"] = srv.template("big", build_big)
    if "c" in args.phases:
        builds["fresh"] = srv.template("fresh", build_queued(5_000, 10, fold=False))
        builds["aged"] = srv.template("aged", build_queued(5_000, 10, 500_000, fold=False))
    out["builds"] = builds
    print(f"build: {json.dumps(builds)}", flush=True)
    if "a" in args.phases:
        a = out["a"] = phase_a(srv, args.claims)
        print(
            f"(a) claim ms 10k/10 {a['10k/10']} 1M/10k {a['1M/10k']} ratio median "
            f"{a['ratio_median']} p90 {a['ratio_p90']} (target <= 1.5)",
            flush=True,
        )
    if "b" in args.phases:
        out["b"] = {}
        for analyze in (False, True):
            b = out["b"]["analyzed" if analyze else "stale"] = phase_b(srv, analyze)
            print(
                f"(b, {b['statistics']}) a new tenant's job behind 1M: wait max "
                f"{b['max_wait_s']} s median {b['median_wait_s']} s (target <= 1), claims "
                f"{b['claims_ms']} ms; 1,000 tenants arrive: first claims after "
                f"{b['first_claims_after_arrivals_ms']} ms, a new job after them "
                f"{b['probe_after_arrivals']}",
                flush=True,
            )
    if "c" in args.phases:
        c = out["c"] = phase_c(srv, args.repeats)
        print(
            f"(c) 500k finished vs none: claim median ratio {c['ratio_claim_median']}, "
            f"drain ratio {c['ratio_drain']} (target <= 1.2)",
            flush=True,
        )
    out["meta"]["load_after"] = os.getloadavg()
    out["meta"]["seconds"] = round(time.perf_counter() - t0, 1)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    if not args.keep:
        srv.drop_all()
    print(f"done in {out['meta']['seconds']} s, wrote {args.json}", flush=True)


if __name__ == "__main__":
    main()
