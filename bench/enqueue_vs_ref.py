"""Single enqueue, this schema against a reference one (e.g. main), interleaved. Not in pytest.

Two scratch databases on one server: ``ref`` migrated by the pgqueue package found in
``--ref`` (a source tree, e.g. ``git archive <commit> pgqueue | tar -x -C /tmp/ref``), ``new`` by
this checkout. Both are driven by this checkout's Python ``pgqueue.enqueue`` (one job per
autocommit transaction, the benchmark's jobs of ``pgqueue.bench.common._job``), so only the
server side differs. Rounds alternate the order; each sample is ``--calls`` jobs on one
connection after a warm-up. Figures: jobs per second and the backend's CPU per job
(``/proc/<pid>/schedstat``), medians, and new / ref. ``--as-producer`` runs the enqueues as a
login role of ``pgqueue_producer`` (after ``pgqueue grant``), not as the databases' owner.

    python bench/enqueue_vs_ref.py --dsn postgresql://root@127.0.0.1/postgres --ref /tmp/ref
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgqueue
from pgqueue.bench.common import _job
from pgqueue.db import migrate, queries


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def _sample(dsn: str, jobs: list[dict[str, Any]]) -> tuple[float, float]:
    """(jobs per second, server CPU seconds per job) for one pass over ``jobs``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for job in jobs[:3]:
            pgqueue.enqueue(conn, **job)
        pid = conn.info.backend_pid
        cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
        for job in jobs:
            pgqueue.enqueue(conn, **job)
        wall, cpu = time.perf_counter() - t0, _cpu_seconds(pid) - cpu0
    return len(jobs) / wall, cpu / len(jobs)


def _migrate_ref(dsn: str, ref: str) -> None:
    code = (
        "import sys, pgqueue; from pgqueue.db import migrate; "
        "assert pgqueue.__file__.startswith(sys.argv[2]), pgqueue.__file__; "
        "migrate.upgrade(sys.argv[1])"
    )
    env = {**os.environ, "PYTHONPATH": ref}
    subprocess.run([sys.executable, "-c", code, dsn, ref], check=True, env=env, cwd=ref)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dsn", required=True, help="server DSN (scratch databases go there)")
    parser.add_argument("--ref", required=True, help="source tree holding the reference pgqueue")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--prefix", default="pgq_cmp", help="scratch database name prefix")
    parser.add_argument("--as-producer", action="store_true")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    tag = f"{args.prefix}_{uuid.uuid4().hex[:6]}"
    names = {"ref": f"{tag}_ref", "new": f"{tag}_new"}
    role = f"{tag}_producer"
    dsns = {k: make_conninfo(args.dsn, dbname=v) for k, v in names.items()}
    jobs = [_job(i, args.tenants) for i in range(args.calls)]
    samples: dict[str, list[tuple[float, float]]] = {"ref": [], "new": []}
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        for name in names.values():
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        _migrate_ref(dsns["ref"], args.ref)
        migrate.upgrade(dsns["new"])
        if args.as_producer:
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
            for key, dsn in dsns.items():
                with psycopg.connect(dsn, autocommit=True) as conn:
                    queries.run(conn, "security_grant")
                    conn.execute(
                        sql.SQL("GRANT pgqueue_producer TO {}").format(sql.Identifier(role))
                    )
                dsns[key] = make_conninfo(dsn, user=role)
        for r in range(args.rounds):
            for key in ("ref", "new") if r % 2 == 0 else ("new", "ref"):
                samples[key].append(_sample(dsns[key], jobs))
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            for name in names.values():
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
            if args.as_producer:
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
    rate = {k: statistics.median(s[0] for s in v) for k, v in samples.items()}
    cpu = {k: statistics.median(s[1] for s in v) for k, v in samples.items()}
    who = "producer role" if args.as_producer else "owner"
    print(f"single enqueue as {who}, {args.rounds} x {args.calls} jobs, medians")
    for k in ("ref", "new"):
        print(f"  {k}: {rate[k]:8,.0f} jobs/s  {cpu[k] * 1e6:7.1f} server us/job")
    print(
        f"  new/ref: {rate['new'] / rate['ref']:.3f} x jobs/s, "
        f"{cpu['new'] / cpu['ref']:.3f} x server CPU per job"
    )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": vars(args), "samples": samples}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
