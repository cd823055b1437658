"""Server instructions per claim and completion, counted by valgrind (callgrind): a repeatable
A/B of the claim path between schema revisions. Not part of pytest.

On the benchmark machine (2 cores shared with Postgres, other VMs) the same wall-clock A/B
swings by 10-20 % from run to run, more than most changes to the claim are worth. Callgrind
counts the instructions the backend executes, which do not depend on what else the machine is
doing (run twice, the figures agree to a few hundred instructions in millions).

How it measures:

- A private PostgreSQL cluster in a temporary directory (``initdb``; ``fsync``, ``autovacuum``
  off; a Unix socket only), one template database per revision in ``--revisions``, migrated to
  that revision, filled with ``--jobs`` no-op jobs of the benchmark's shape (``pgqueue bench``:
  ``--tenants`` tenants, 10 by default, the three tiers, one payload), then ``--warm`` claims
  and completions so that the DRR rounds are in their steady state.
- With the server stopped, for each revision and for N in (``--short``, ``--long``): a fresh
  copy of its template (``CREATE DATABASE … TEMPLATE``) and one single-user backend
  (``postgres --single``) under ``valgrind --tool=callgrind`` running N cycles of the worker's
  claim and a completion of what it claimed::

      SELECT count(*) FROM pgqueue.claim_admitted(<batch>, 'w', 120, '{}');
      UPDATE pgqueue.jobs SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL
      WHERE state = 'running' AND worker_id = 'w';

  (``--claims-only`` leaves the completion out.) Instructions per cycle are
  (count at ``--long`` − count at ``--short``) / (``--long`` − ``--short``): the backend's
  start-up and shut-down cancel out. Every claim must take ``--batch`` jobs, or the run fails.

It needs valgrind and the PostgreSQL server binaries (``--bindir``, default
``pg_config --bindir``); run as root, it runs the server as the ``postgres`` user. A run of
two revisions takes about 30 seconds. Run it with the project's environment (the one
``pip install -e .`` went into):

    .venv/bin/python bench/claim_instructions.py --revisions 0030,head \
        --json bench/claim_instructions.json

(Revisions before the baseline 0030 are no longer shipped: the figures measured against them,
in docs/bench.md and bench/claim_instructions*.json, were taken before issue 27.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

import pgqueue
from pgqueue.bench.common import _chunks, _job
from pgqueue.db import migrate, queries
from pgqueue.worker.completer import success_batch

_USER = "bench"
_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")
_COMPLETE = (
    "UPDATE pgqueue.jobs SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL "
    "WHERE state = 'running' AND worker_id = 'w';"
)


def _as_server_user() -> list[str]:
    """The prefix that runs a server binary: ``runuser -u postgres --`` when we are root
    (PostgreSQL refuses to run as root), nothing otherwise."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Cluster:
    """A throwaway PostgreSQL cluster in ``root`` (data directory, socket, log)."""

    def __init__(self, root: Path, bindir: Path) -> None:
        self.root = root
        self.bindir = bindir
        self.data = root / "data"
        self.port = _free_port()

    def _run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*_as_server_user(), *args], input=stdin, text=True, capture_output=True, check=True
        )

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, user="postgres")
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", _USER)

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses='' -c fsync=off "
            "-c autovacuum=off -c full_page_writes=off"
        )
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", options,
            "-l", str(self.root / "log"), "-w", "start",
        )  # fmt: skip

    def stop(self) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def dsn(self, db: str) -> str:
        return f"host={self.root} port={self.port} user={_USER} dbname={db}"

    def single_user(self, db: str, script: str, *, valgrind_out: Path | None = None) -> str:
        """Run ``script`` in a single-user backend on ``db`` (one statement per line); with
        ``valgrind_out``, under callgrind. Returns stdout + stderr."""
        cmd = [str(self.bindir / "postgres"), "--single", "-D", str(self.data), db]
        if valgrind_out is not None:
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={valgrind_out}", *cmd]
        done = subprocess.run(
            [*_as_server_user(), *cmd], input=script, text=True, capture_output=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"single-user backend failed: {done.stderr[-2000:]}")
        return done.stdout + done.stderr


def _prepare(
    cluster: Cluster, db: str, revision: str, *, jobs: int, warm: int, batch: int, tenants: int
) -> None:
    """Template ``db``: pgqueue at ``revision``, ``jobs`` queued no-op jobs over ``tenants``
    tenants, ``warm`` cycles."""
    with psycopg.connect(cluster.dsn("postgres"), autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{db}"')
    dsn = cluster.dsn(db)
    migrate.upgrade(dsn, revision)
    with psycopg.connect(dsn) as conn:
        for part in _chunks(jobs, 1000):
            pgqueue.enqueue_many(conn, [pgqueue.JobSpec(**_job(i, tenants)) for i in part])
        conn.commit()
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        params = {"limit": batch, "worker_id": "warm", "lease_seconds": 120, "skip_kinds": []}
        for _ in range(warm):
            rows = [r for r in queries.run(conn, "job_claim", params) if r["id"] is not None]
            done = ((r["id"], r["tenant_id"], r["lease_token"], None, None, None) for r in rows)
            queries.run(conn, "job_complete_many", success_batch(done))
        conn.execute("VACUUM ANALYZE")


def _instructions(
    cluster: Cluster, template: str, cycles: int, *, batch: int, claims_only: bool, out: Path
) -> int:
    """Instructions of one single-user backend running ``cycles`` claims (and completions) on
    a fresh copy of ``template``."""
    cluster.single_user(
        "postgres",
        f"DROP DATABASE IF EXISTS cg_run;\nCREATE DATABASE cg_run TEMPLATE {template};\n",
    )
    claim = f"SELECT count(*) FROM pgqueue.claim_admitted({batch}, 'w', 120, '{{}}');"
    script = "\n".join([claim] if claims_only else [claim, _COMPLETE]) + "\n"
    output = cluster.single_user("cg_run", script * cycles, valgrind_out=out)
    taken = output.count(f'count = "{batch}"')
    if taken != cycles:
        raise RuntimeError(f"{template}: {taken} of {cycles} claims took {batch} jobs:\n{output}")
    if "ERROR" in output:
        raise RuntimeError(f"{template}: an error in the run:\n{output[-3000:]}")
    m = _REFS.search(output)
    if m is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{output[-2000:]}")
    return int(m.group(1).replace(",", ""))


@contextlib.contextmanager
def _cluster(bindir: Path) -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="pgqueue-callgrind-"))
    try:
        cluster = Cluster(root, bindir)
        cluster.init()
        yield cluster
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--revisions", default="head", help="comma-separated, e.g. 0019,head")
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--batch", type=int, default=10, help="jobs per claim")
    parser.add_argument("--tenants", type=int, default=10, help="tenants the jobs are spread over")
    parser.add_argument("--warm", type=int, default=100, help="cycles before the template")
    parser.add_argument("--short", type=int, default=10)
    parser.add_argument("--long", type=int, default=60)
    parser.add_argument("--claims-only", action="store_true")
    parser.add_argument("--bindir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            parser.error("run as root, this needs a 'postgres' user to run the server as")
    if args.tenants < 1:
        parser.error("--tenants must be at least 1")
    if args.long <= args.short or args.jobs < args.batch * (args.warm + args.long):
        parser.error("need --long > --short and --jobs >= --batch * (--warm + --long)")
    bindir = args.bindir or Path(
        subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    revisions = [r.strip() for r in args.revisions.split(",") if r.strip()]
    unknown = [r for r in revisions if r != "head" and r not in migrate.known_revisions()]
    if unknown or not revisions:
        known = ", ".join(sorted(migrate.known_revisions()))
        parser.error(f"unknown revision(s) {', '.join(unknown) or '(none)'}; known: {known}, head")
    results: dict[str, Any] = {}
    with _cluster(bindir) as cluster:
        cluster.start()
        try:
            for i, revision in enumerate(revisions):
                _prepare(
                    cluster,
                    f"tpl{i}",
                    revision,
                    jobs=args.jobs,
                    warm=args.warm,
                    batch=args.batch,
                    tenants=args.tenants,
                )
        finally:
            cluster.stop()
        for i, revision in enumerate(revisions):
            counts = {
                n: _instructions(
                    cluster,
                    f"tpl{i}",
                    n,
                    batch=args.batch,
                    claims_only=args.claims_only,
                    out=cluster.root / f"callgrind.{i}.{n}",
                )
                for n in (args.short, args.long)
            }
            per_cycle = (counts[args.long] - counts[args.short]) / (args.long - args.short)
            results[revision] = {"instructions_per_cycle": round(per_cycle), "counts": counts}
            what = "claim" if args.claims_only else "claim + completion"
            print(f"{revision}: {per_cycle:,.0f} instructions per {what} of {args.batch}")
    base = results[revisions[0]]["instructions_per_cycle"]
    for revision in revisions[1:]:
        ratio = results[revision]["instructions_per_cycle"] / base
        print(f"{revision} / {revisions[0]}: {ratio:.3f}")
    if args.json is not None:
        meta = {k: v for k, v in vars(args).items() if k not in ("json", "bindir")}
        args.json.write_text(json.dumps({"options": meta, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
