"""CPU per job of a claim + complete drain, worker and Postgres apart (issue 8). Not part of pytest.

Where a no-op job's CPU goes decides the throughput ratios of ``pgqueue bench`` once the two
cores are full (two or more worker processes): this splits it between the worker processes and
the database server, per system, with the bench's own worker commands, fill and scratch
databases (``pgqueue.bench.measure.consume_once``).

How it measures, for each system and drain:

- **Worker:** the CPU (user + system seconds) of the worker processes, from the rusage of this
  process's reaped children (``RUSAGE_CHILDREN``) before and after the drain. Their start-up
  (imports, connections, schema check) is taken out with a drain of 20 jobs per system, run
  first: (CPU of the drain − CPU of the 20-job drain) / jobs.
- **Postgres:** utime + stime of the server's postmaster and of its children (found as the
  parent of one of our backends, so another cluster on the host is not counted) plus the
  cutime + cstime of the ones that reaped children (the postmaster accounts for the backends
  that exited), from ``/proc/<pid>/stat`` (fields 14–17, clock ticks), read when the fill has
  committed and again when every job is done. The fill is outside it; autovacuum, the
  checkpointer and any other database's sessions are inside it: run it on a server nothing
  else uses. A drain during which other databases committed says so (``other_commits``;
  ``pg_stat_database`` lags by up to a second).

``pgqueue-floor`` is pgqueue with the scheduler's decisions taken out
(``bench/claim_floor.sql`` replaces ``pgqueue.claim_lanes`` in that system's scratch databases
only): the same worker, claim entry points, jobs table, triggers, counters and completion, the
oldest due jobs taken as a plain queue takes them. Its drain prices everything but the
scheduler (lanes, stamping, keys, the tier pick).

Systems alternate (the order reversed every other repeat). Linux only.

    python bench/cpu_per_job.py --dsn postgresql://root@127.0.0.1/postgres \\
        --systems pgqueue,pgqueue-floor,pgqueuer,plain --procs 1 --jobs 20000 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
from pathlib import Path
from typing import Any

import psycopg

from pgqueue.bench import measure
from pgqueue.bench.common import BenchOptions, Scratch

_TICKS = os.sysconf("SC_CLK_TCK")
# pgqueue with pgqueue.claim_lanes replaced, in that system's scratch databases only
_VARIANTS = {
    "pgqueue-floor": Path(__file__).with_name("claim_floor.sql"),
}
_STARTUP_JOBS = 20


_server: dict[str, int] = {}


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:  # gone meanwhile
        return None
    return stat[stat.rindex(")") + 2 :].split()


def find_server(dsn: str) -> int:
    """The pid of the postmaster serving ``dsn``: the parent of a backend of ours. Only its
    processes are counted, not another cluster's on the same host (the embedded test
    server) — found by a reviewer."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    fields = _stat_fields(int(row[0]))
    assert fields is not None
    return int(fields[1])  # field 4: ppid


def postgres_cpu_seconds() -> float:
    """CPU seconds of the postmaster found by :func:`find_server`, of its live children (the
    backends and background processes) and of the children it reaped (``cutime``,
    ``cstime``: backends that exited), from ``/proc/<pid>/stat`` (fields 14–17)."""
    postmaster = _server["pid"]
    ticks = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        fields = _stat_fields(pid)
        if fields is None or (int(pid) != postmaster and int(fields[1]) != postmaster):
            continue
        ticks += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / _TICKS


def other_commits(dsn: str, scratch_prefix: str) -> int:
    """Commits counted in the server's other databases (not ours, not ``postgres``, where
    the scratch databases are made): work that a drain's Postgres CPU would include."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(xact_commit), 0)::bigint FROM pg_stat_database "
            "WHERE datname IS NOT NULL AND NOT starts_with(datname, %s) "
            "AND datname <> 'postgres'",
            (scratch_prefix,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def children_cpu_seconds() -> float:
    """CPU seconds of this process's reaped children (the worker processes)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


_after_fill: dict[str, float] = {}


def _watch_the_fill() -> None:
    """Note the server's CPU when the fill returns (it has committed; the drain starts)."""
    fill_sync, fill_async = measure._fill_sync, measure._fill_pgqueuer_async

    def sync(*args: Any, **kwargs: Any) -> float:
        t0 = fill_sync(*args, **kwargs)
        _after_fill["postgres"] = postgres_cpu_seconds()
        return t0

    async def asynchronous(*args: Any, **kwargs: Any) -> float:
        t0 = await fill_async(*args, **kwargs)
        _after_fill["postgres"] = postgres_cpu_seconds()
        return t0

    measure._fill_sync = sync
    measure._fill_pgqueuer_async = asynchronous


def drain(scratch: Scratch, system: str, procs: int, jobs: int) -> tuple[float, float, float, int]:
    """One drain of ``jobs`` no-op jobs: (jobs/s, worker CPU seconds, Postgres CPU seconds,
    commits meanwhile in the server's other databases)."""
    options = BenchOptions(jobs=jobs, peer="pgqueuer")
    others_before = other_commits(scratch.server_dsn, scratch.prefix)
    with scratch.clone() as dsn:
        if system in _VARIANTS:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(_VARIANTS[system].read_text())
        workers_before = children_cpu_seconds()
        result = measure.consume_once(
            dsn, "pgqueue" if system in _VARIANTS else system, procs, options
        )
        postgres_after = postgres_cpu_seconds()
        workers_after = children_cpu_seconds()
    return (
        float(result["jobs_per_s"]),
        workers_after - workers_before,
        postgres_after - _after_fill["postgres"],
        other_commits(scratch.server_dsn, scratch.prefix) - others_before,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="server DSN (scratch databases go there)")
    parser.add_argument("--systems", default="pgqueue,pgqueuer,plain")
    parser.add_argument("--procs", default="1", help="worker processes, e.g. 1,2,4")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json-out", default=None, help="write every drain's figures here")
    args = parser.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    procs_list = [int(p) for p in args.procs.split(",") if p.strip()]
    _watch_the_fill()
    _server["pid"] = find_server(args.dsn)
    scratch = Scratch(args.dsn, "pgqueuer" if "pgqueuer" in systems else None)
    scratch.create_template()
    rows: list[dict[str, Any]] = []
    try:
        for procs in procs_list:
            startup = {s: drain(scratch, s, procs, _STARTUP_JOBS)[1] for s in systems}
            for repeat in range(args.repeats):
                for system in systems if repeat % 2 == 0 else systems[::-1]:
                    rate, worker, postgres, others = drain(scratch, system, procs, args.jobs)
                    per_job_worker = (worker - startup[system]) / (args.jobs - _STARTUP_JOBS)
                    row = {
                        "system": system,
                        "procs": procs,
                        "repeat": repeat,
                        "jobs_per_s": round(rate, 1),
                        "worker_us_per_job": round(per_job_worker * 1e6, 1),
                        "postgres_us_per_job": round(postgres / args.jobs * 1e6, 1),
                        "other_commits": others,
                    }
                    rows.append(row)
                    print(
                        f"{system:21s} procs={procs} {rate:8,.0f} jobs/s  "
                        f"worker {row['worker_us_per_job']:6.1f} us/job  "
                        f"postgres {row['postgres_us_per_job']:6.1f} us/job"
                        + (f"  (other databases: {others} commits)" if others else ""),
                        flush=True,
                    )
    finally:
        scratch.close()
    _summary(rows)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"jobs": args.jobs, "repeats": args.repeats, "drains": rows}, f, indent=1)
    return 0


def _summary(rows: list[dict[str, Any]]) -> None:
    """Medians per system and process count, and each against pgqueuer's when it ran."""
    keys = sorted({(r["procs"], r["system"]) for r in rows})
    peer = {
        p: statistics.median(
            r["jobs_per_s"] for r in rows if r["procs"] == p and r["system"] == "pgqueuer"
        )
        for p, s in keys
        if s == "pgqueuer"
    }
    print("medians:")
    for procs, system in keys:
        mine = [r for r in rows if r["procs"] == procs and r["system"] == system]
        rate = statistics.median(r["jobs_per_s"] for r in mine)
        ratio = f"{rate / peer[procs]:5.2f}x pgqueuer" if procs in peer else ""
        print(
            f"  {system:21s} procs={procs} {rate:8,.0f} jobs/s  {ratio}  "
            f"worker {statistics.median(r['worker_us_per_job'] for r in mine):6.1f}  "
            f"postgres {statistics.median(r['postgres_us_per_job'] for r in mine):6.1f} us/job"
        )


if __name__ == "__main__":
    raise SystemExit(main())
