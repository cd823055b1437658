"""Workers on four simulated hosts share one schedule through Postgres alone (issue 8, scale-out).

Each ``pgqueue work`` process runs in its own network namespace with its own hostname
(``tests/apps/hosts.py``): it cannot reach the test machine's 127.0.0.1 and talks to Postgres
over a veth link, as a worker on another machine would. Nothing coordinates the four but the
database. Checked:

- every job runs exactly once, on its first attempt, and every host runs some;
- ``worker_id`` names the host that ran the job;
- the jobs all four hosts ran follow ONE Deficit Round Robin schedule: with four
  backlogged tenants of equal weight and jobs of cost 1, the jobs, taken in the order of the
  DRR keys they were claimed with (scheduler v2; concurrent claims' ``started_at`` need not
  follow the keys), come in turns of exactly one quantum (5) per tenant, the tenants in the
  same cyclic order every round. Four separate schedules would interleave their turns.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import psycopg
import pytest

import pgqueue
from tests.apps import hosts
from tests.apps.harness import (
    count_by_state,
    dispatch_turns,
    jobs,
    records_by_pid,
    run_held_burst_workers,
)

N_HOSTS = 4
TENANTS = ("acme", "globex", "initech", "umbrella")
PER_TENANT = 300
QUANTUM = 5  # the default base quantum (DESIGN.md), cost units; each job costs 1
APP_PREFIX = "pgq-host-test-"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0, reason="needs root"),
]


@pytest.mark.timeout(240)
def test_workers_on_four_hosts_share_one_schedule(db_dsn: str, tmp_path: Path) -> None:
    why = hosts.unavailable()
    if why is not None:
        pytest.skip(why)
    record_base = tmp_path / "record"
    with psycopg.connect(db_dsn) as conn:  # one transaction
        ids = pgqueue.enqueue_many(
            conn,
            [
                # 50 ms each: the drain takes about 2 s, so that a host whose first claim met
                # another's fold still finds work (found in CI: with no-op jobs three hosts
                # took all 1,200 before the fourth claimed again)
                pgqueue.JobSpec(tenant, "scheduled", {"n": i, "seconds": 0.05}, 300, "test.slow")
                for i in range(PER_TENANT)
                for tenant in TENANTS
            ],
        )
        # Held back (within the burst horizon) until every host is up.
        conn.execute("UPDATE pgqueue.jobs SET run_at = now() + interval '45 seconds'")
    n_jobs = len(TENANTS) * PER_TENANT
    assert len(set(ids)) == n_jobs

    with hosts.simulated_hosts(db_dsn, N_HOSTS, tmp_path / "net") as made:
        # A host has no route to the test machine's loopback: only its link reaches Postgres.
        probe = made.hosts[0].argv(
            [
                "python3",
                "-c",
                "import socket; socket.create_connection(('127.0.0.1', 5432), timeout=2)",
            ]
        )
        assert os.spawnvp(os.P_WAIT, probe[0], probe) != 0
        procs, codes = run_held_burst_workers(
            db_dsn,
            [host.dsn for host in made.hosts],
            log_dir=tmp_path / "logs",
            record_base=record_base,
            app_prefix=APP_PREFIX,
            wraps=[host.argv for host in made.hosts],
            timeout=150,
        )
    assert codes == [0] * N_HOSTS, "\n".join(proc.stderr() for proc in procs)

    # Every job succeeded on its first and only attempt, each run by exactly one process.
    rows = jobs(db_dsn)
    assert count_by_state(db_dsn) == {"succeeded": n_jobs}
    assert Counter(r["attempts"] for r in rows) == {1: n_jobs}
    ran_by = records_by_pid(record_base)
    all_runs = [job_id for ran in ran_by.values() for job_id in ran]
    assert sorted(all_runs) == sorted(ids)

    # worker_id is "host:pid:random": the host that ran the job, and every host ran some.
    host_of_pid = {proc.pid: f"host-{i}" for i, proc in enumerate(procs)}
    pid_of_job = {job_id: pid for pid, ran in ran_by.items() for job_id in ran}
    per_host: Counter[str] = Counter()
    for r in rows:
        host, pid, _tag = r["worker_id"].split(":")
        assert host == host_of_pid[int(pid)]
        assert int(pid) == pid_of_job[r["id"]]
        per_host[host] += 1
    assert set(per_host) == set(host_of_pid.values()), f"jobs per host: {dict(per_host)}"

    # One DRR schedule: turns of one quantum each, the tenants in one cyclic order.
    turns = dispatch_turns(db_dsn, by="key")
    assert [length for _tenant, length in turns] == [QUANTUM] * (n_jobs // QUANTUM), turns[:12]
    cycle = [tenant for tenant, _length in turns[: len(TENANTS)]]
    assert sorted(cycle) == sorted(TENANTS)
    assert [tenant for tenant, _length in turns] == cycle * (len(turns) // len(TENANTS))
