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
- **Postgres:** utime + stime of every process named ``postgres`` plus the cutime + cstime of
  the ones that reaped children (the postmaster accounts for the backends that exited), from
  ``/proc/<pid>/stat`` (fields 14–17, clock ticks), read when the fill has committed and again
  when every job is done. The fill is outside it; autovacuum, the checkpointer and any other
  database's sessions are inside it: run it on a server nothing else uses.

Systems alternate (the order reversed every other repeat). Linux only.

    python bench/cpu_per_job.py --dsn postgresql://root@127.0.0.1/postgres \\
        --systems pgqueue,pgqueuer,plain --procs 1 --jobs 20000 --repeats 2
"""

from __future__ import annotations

import argparse
import os
import resource
from typing import Any

from pgqueue.bench import measure
from pgqueue.bench.common import BenchOptions, Scratch

_TICKS = os.sysconf("SC_CLK_TCK")
_STARTUP_JOBS = 20


def postgres_cpu_seconds() -> float:
    """CPU seconds of every ``postgres`` process and of the backends they reaped."""
    ticks = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        if stat[stat.index("(") + 1 : stat.rindex(")")] != "postgres":
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / _TICKS


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


def drain(scratch: Scratch, system: str, procs: int, jobs: int) -> tuple[float, float, float]:
    """One drain of ``jobs`` no-op jobs: (jobs/s, worker CPU seconds, Postgres CPU seconds)."""
    options = BenchOptions(jobs=jobs, peer="pgqueuer")
    with scratch.clone() as dsn:
        workers_before = children_cpu_seconds()
        result = measure.consume_once(dsn, system, procs, options)
        postgres_after = postgres_cpu_seconds()
        workers_after = children_cpu_seconds()
    return (
        float(result["jobs_per_s"]),
        workers_after - workers_before,
        postgres_after - _after_fill["postgres"],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="server DSN (scratch databases go there)")
    parser.add_argument("--systems", default="pgqueue,pgqueuer,plain")
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    _watch_the_fill()
    scratch = Scratch(args.dsn, "pgqueuer" if "pgqueuer" in systems else None)
    scratch.create_template()
    try:
        startup = {s: drain(scratch, s, args.procs, _STARTUP_JOBS)[1] for s in systems}
        for repeat in range(args.repeats):
            for system in systems if repeat % 2 == 0 else systems[::-1]:
                rate, worker, postgres = drain(scratch, system, args.procs, args.jobs)
                per_job_worker = (worker - startup[system]) / (args.jobs - _STARTUP_JOBS)
                print(
                    f"{system:9s} procs={args.procs} {rate:8,.0f} jobs/s  "
                    f"worker {per_job_worker * 1e6:6.1f} us/job  "
                    f"postgres {postgres / args.jobs * 1e6:6.1f} us/job",
                    flush=True,
                )
    finally:
        scratch.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
