"""Server instructions per single enqueue, this schema against a reference one, counted by
valgrind (callgrind): a repeatable A/B where the wall-clock one (``enqueue_vs_ref.py``) swings
with the shared machine's load. Not part of pytest.

A private PostgreSQL cluster (``claim_instructions.Cluster``: a temporary directory, fsync
and autovacuum off, a Unix socket only) holds two template databases: ``ref`` migrated by the
pgqueue package of ``--ref`` (a source tree, e.g. ``git archive <commit> pgqueue | tar -x -C
/tmp/ref``), ``new`` by this checkout; each with ``--tenants`` tenants registered and
``--warm`` jobs enqueued. With the server stopped, a fresh copy of each template runs, in one
single-user backend under callgrind, N statements ``SELECT pgqueue.enqueue(<tenant>,
<origin>, <payload>, <sla>, 'noop')`` (the benchmark's jobs of ``pgqueue.bench.common._job``;
each its own transaction); instructions per enqueue = (count at ``--long`` − count at
``--short``) / (``--long`` − ``--short``). ``--as-producer`` runs them after ``pgqueue grant``
as a login role of ``pgqueue_producer`` (``SET SESSION AUTHORIZATION``).

    .venv/bin/python bench/enqueue_instructions.py --ref /tmp/ref --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from claim_instructions import _REFS, Cluster, _cluster

import pgqueue
from pgqueue.bench.common import _job
from pgqueue.db import migrate, queries

_PRODUCER = "bench_producer"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _statement(i: int, tenants: int) -> str:
    job = _job(i, tenants)
    sla = "NULL" if job["sla_seconds"] is None else repr(float(job["sla_seconds"]))
    return (
        f"SELECT pgqueue.enqueue({_literal(job['tenant_id'])}, {_literal(job['origin'])}, "
        f"{_literal(json.dumps(job['payload']))}::jsonb, {sla}, {_literal(job['kind'])});"
    )


def _prepare(
    cluster: Cluster, db: str, ref: str | None, *, tenants: int, warm: int, producer: bool
) -> None:
    with psycopg.connect(cluster.dsn("postgres"), autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{db}"')
    dsn = cluster.dsn(db)
    if ref is None:
        migrate.upgrade(dsn)
    else:
        code = (
            "import sys, pgqueue; from pgqueue.db import migrate; "
            "assert pgqueue.__file__.startswith(sys.argv[2]), pgqueue.__file__; "
            "migrate.upgrade(sys.argv[1])"
        )
        env = {**os.environ, "PYTHONPATH": ref}
        subprocess.run([sys.executable, "-c", code, dsn, ref], check=True, env=env, cwd=ref)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(max(warm, tenants)):
            pgqueue.enqueue(conn, **_job(i, tenants))
        if producer:
            queries.run(conn, "security_grant")
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (_PRODUCER,))
            if exists.fetchone() is None:
                conn.execute(f"CREATE ROLE {_PRODUCER} LOGIN IN ROLE pgqueue_producer")
        conn.execute("VACUUM ANALYZE")


def _instructions(
    cluster: Cluster, template: str, n: int, *, tenants: int, producer: bool, out: Path
) -> int:
    cluster.single_user(
        "postgres",
        f"DROP DATABASE IF EXISTS cg_run;\nCREATE DATABASE cg_run TEMPLATE {template};\n",
    )
    lines = [f"SET SESSION AUTHORIZATION {_PRODUCER};"] if producer else []
    lines += [_statement(1000 + i, tenants) for i in range(n)]
    output = cluster.single_user("cg_run", "\n".join(lines) + "\n", valgrind_out=out)
    if "ERROR" in output:
        raise RuntimeError(f"{template}: an error in the run:\n{output[-3000:]}")
    m = _REFS.search(output)
    if m is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{output[-2000:]}")
    return int(m.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--ref", required=True, help="source tree holding the reference pgqueue")
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--warm", type=int, default=200)
    parser.add_argument("--short", type=int, default=20)
    parser.add_argument("--long", type=int, default=220)
    parser.add_argument("--as-producer", action="store_true")
    parser.add_argument("--bindir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    bindir = args.bindir or Path(
        subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    results: dict[str, Any] = {}
    with _cluster(bindir) as cluster:
        cluster.start()
        try:
            for name, ref in (("ref", args.ref), ("new", None)):
                _prepare(
                    cluster,
                    f"tpl_{name}",
                    ref,
                    tenants=args.tenants,
                    warm=args.warm,
                    producer=args.as_producer,
                )
        finally:
            cluster.stop()
        for name in ("ref", "new"):
            counts = [
                _instructions(
                    cluster,
                    f"tpl_{name}",
                    n,
                    tenants=args.tenants,
                    producer=args.as_producer,
                    out=cluster.root / f"cg_{name}_{n}.out",
                )
                for n in (args.short, args.long)
            ]
            results[name] = (counts[1] - counts[0]) / (args.long - args.short)
    who = "a producer role" if args.as_producer else "the owner"
    print(f"instructions per single enqueue, as {who}:")
    for name in ("ref", "new"):
        print(f"  {name}: {results[name]:12,.0f}")
    print(f"  new/ref: {results['new'] / results['ref']:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"args": {**vars(args), "json": str(args.json),
                                                  "bindir": str(bindir)},
                                         "instructions": results}, indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
