"""Instructions per job of the claim and completion path, pgqueue vs pgqueuer, counted by
callgrind (issue 28, speed): bench/claim_cpu.py's drains, in instructions. Not part of pytest.

CPU time on the shared 2-core box moved by 2x between repeats of the same code; instruction
counts do not (two runs of the same code agree within 0.5 %), so a change worth a few percent
can be measured. The drains are bench/claim_cpu.py's (one connection, claims of ``--batch``
with ``job_claim`` then ``job_complete_many``; pgqueuer's ``dequeue`` and ``log_jobs``), run
against a private server started in a temporary directory under ``valgrind --tool=callgrind``
(every backend, collecting only inside ``PostgresMain``). A backend's count includes its
connection start (``--jobs 1500``: about 1 % of a run), taken off by a connection that does
nothing. ``--variant FILE`` runs pgqueue again with that SQL applied to its copy first (a
function's old text, say): variants and systems alternate, one drain each.

``--conns N`` runs N drains of the same database at once (threads, one connection each; an
empty claim ends a drain only when no job is left queued, else it claims again) and sums their
backends' counts, each less the idle connection's; the JSON gives each connection's jobs and
instructions, and the claims made. A session plans its statements and fills its caches once:
in a drain of 3,000 jobs that is about 20k instructions a job for pgqueue, paid once per
connection, so N connections show it N times. ``--warm K`` leaves it out: each backend's
counts start again from zero (``SELECT pg_stat_clear_snapshot()``, which callgrind is told
to dump a part before) after its first K claims that took jobs and their
completions, which are not counted, and the idle connection's count is then its end alone.
``--keep DIR`` copies each drain's callgrind file to ``DIR/<system>.c<N>.<pid>`` for
``callgrind_annotate``.

Needs valgrind and the server binaries (``pg_config --bindir``); runs the server as user
``postgres`` when run as root. A drain takes 20-60 s under callgrind. (bench/claim_instructions.py
compares schema revisions instead, by a single-user backend running the claim functions without
the worker's named queries and without the peer.)

    python bench/claim_instructions_peer.py --jobs 1500 --variant /tmp/old.sql \
        --out bench/claim_instructions_peer.json
    python bench/claim_instructions_peer.py --jobs 3000 --conns 2 --keep /tmp/cg
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from claim_cpu import _recreate, build, drain_pgqueue, drain_pgqueuer


def _as_server_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _instructions(path: Path) -> int:
    """The event total of one callgrind output file."""
    for line in path.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise ValueError(f"no totals in {path}")


def _wait_for(path: Path, seconds: float = 30.0) -> Path:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0 and "totals:" in path.read_text()[-4000:]:
            return path
        time.sleep(0.5)
    raise TimeoutError(f"callgrind did not write {path}")


# Callgrind writes a part (cg.<pid>.1) and starts counting again from zero when a backend enters
# this function (--dump-before): the SQL-callable one, which nothing else calls.
_DUMP_FUNCTION = "pg_stat_clear_snapshot"
_ZERO = f"SELECT {_DUMP_FUNCTION}()"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1500)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--port", type=int, default=5499)
    parser.add_argument("--variant", type=Path, action="append", default=[])
    parser.add_argument("--no-peer", action="store_true", help="pgqueue (and variants) only")
    parser.add_argument(
        "--conns", type=int, default=1, help="drains run at once, one connection each"
    )
    parser.add_argument(
        "--warm", type=int, default=0, help="count each backend from its (K+1)th claim on"
    )
    parser.add_argument("--keep", type=Path, help="copy the drains' callgrind files here")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    bindir = Path(subprocess.check_output(["pg_config", "--bindir"], text=True).strip())
    work = Path(tempfile.mkdtemp(prefix="claim_ir_"))
    shutil.chown(work, "postgres") if os.geteuid() == 0 else None
    data = work / "data"
    subprocess.run(
        _as_server_user([str(bindir / "initdb"), "-D", str(data), "-U", "root", "-A", "trust"]),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    server = subprocess.Popen(
        _as_server_user(
            [
                "valgrind",
                "--tool=callgrind",
                "--trace-children=yes",
                "--collect-atstart=no",
                "--toggle-collect=PostgresMain",
                f"--dump-before={_DUMP_FUNCTION}",
                f"--callgrind-out-file={work}/cg.%p",
                str(bindir / "postgres"),
                "-D",
                str(data),
                "-p",
                str(args.port),
                "-k",
                str(work),
                "-c",
                "listen_addresses=",
                "-c",
                "autovacuum=off",
                "-c",
                "fsync=off",
            ]
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    dsn = f"host={work} port={args.port} user=root dbname=postgres"
    results: dict[str, Any] = {}
    try:
        for _ in range(120):
            try:
                psycopg.connect(dsn).close()
                break
            except psycopg.OperationalError:
                time.sleep(1)
        with psycopg.connect(dsn) as conn:  # what a connection alone costs
            idle_pid = conn.info.backend_pid
            if args.warm > 0:  # its end alone, as the drains' counts are zeroed
                conn.execute(_ZERO)
        idle = _instructions(_wait_for(work / f"cg.{idle_pid}"))
        print(f"building {args.jobs} jobs x 2 systems", flush=True)
        build(dsn, "ir", args.jobs, args.tenants)
        runs: list[tuple[str, Path | None]] = [("pgqueue", None)]
        runs += [(f"pgqueue+{v.name}", v) for v in args.variant]
        if not args.no_peer:
            runs.append(("pgqueuer", None))
        for name, variant in runs:
            peer = name == "pgqueuer"
            clone = _recreate(dsn, "ir_run", "ir_pgqueuer_tpl" if peer else "ir_pgqueue_tpl")
            if variant is not None:
                with psycopg.connect(clone, autocommit=True) as conn:
                    conn.execute(variant.read_text())  # type: ignore[arg-type]
                    conn.execute("VACUUM ANALYZE")
            drain = drain_pgqueuer if peer else drain_pgqueue
            with ThreadPoolExecutor(args.conns) as pool:
                shared = args.conns > 1
                running = [
                    pool.submit(drain, clone, args.batch, shared, args.warm, _ZERO)
                    for _ in range(args.conns)
                ]
                drains = [r.result() for r in running]
            jobs = sum(int(d["jobs"]) for d in drains)
            counts = []
            for d in drains:
                path = _wait_for(work / f"cg.{int(d['pid'])}")
                counts.append(_instructions(path) - idle)
                if args.keep is not None:
                    shutil.copy(path, args.keep / f"{name}.c{args.conns}.{int(d['pid'])}")
            results[name] = {
                "jobs": jobs,
                "instructions": sum(counts),
                "claims": sum(int(d["claims"]) for d in drains),
                "per_connection": [
                    [int(d["jobs"]), c] for d, c in zip(drains, counts, strict=True)
                ],
            }
            per_job = sum(counts) / jobs
            print(f"{name:30} {per_job / 1e3:8.1f} k instructions per job", flush=True)
    finally:
        server.terminate()
        server.wait(120)
        shutil.rmtree(work, ignore_errors=True)
    if "pgqueuer" in results:
        peer_per_job = results["pgqueuer"]["instructions"] / results["pgqueuer"]["jobs"]
        for r in results.values():
            r["ratio_to_pgqueuer"] = round(r["instructions"] / r["jobs"] / peer_per_job, 3)
    print(json.dumps(results, indent=2))
    if args.out is not None:
        args.out.write_text(
            json.dumps(
                {
                    "options": {"jobs": args.jobs, "conns": args.conns, "warm": args.warm},
                    "runs": results,
                }
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
