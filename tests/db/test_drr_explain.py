"""EXPLAIN guard: every statement the claim runs uses an index on a large queue (no seq scan of
pgqueue.jobs), captured with auto_explain on the real claim; and the migration goes both ways."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgqueue.db import queries
from pgqueue.worker.completer import success_batch

QUEUED = 120_000
TENANTS = 1_000


def _load_auto_explain(c: psycopg.Connection[Any]) -> None:
    """LOAD auto_explain in this session, or skip the test."""
    try:
        c.execute("LOAD 'auto_explain'")
    except psycopg.Error:
        pytest.skip("auto_explain is not available on this server")


def _log_plans(c: psycopg.Connection[Any], plans: list[str], *settings: str) -> None:
    """From now on, append the plan of every statement (nested ones too) to ``plans``."""
    for setting in (
        "auto_explain.log_min_duration = 0",
        *settings,
        "auto_explain.log_nested_statements = on",
        "client_min_messages = log",
    ):
        c.execute(f"SET {setting}")
    c.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))


def claim_plans(dsn: str, limit: int = 10, *settings: str) -> list[str]:
    """Plans of every statement pgqueue.claim runs (auto_explain, nested statements, with
    ``settings`` such as ``auto_explain.log_analyze = on``)."""
    plans: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as c:
        _load_auto_explain(c)
        _log_plans(c, plans, *settings)
        rows = c.execute("SELECT id FROM pgqueue.claim(%s, 'explain', 60)", (limit,)).fetchall()
        assert len(rows) == limit
    return plans


@pytest.mark.slow
def test_claim_uses_indexes_at_scale(conn, db_dsn):
    """Scheduler v2: every statement of a claim (lane discovery, fold, stamping, claim in key
    order) uses an index on 120,000 queued jobs of 1,000 tenants in three tiers, in the claim
    that stamps them all (one fold per tier) and in the next ones."""
    conn.execute(
        """
        INSERT INTO pgqueue.tenants (tenant_id)
        SELECT 't' || g FROM generate_series(0, %s - 1) g
        """,
        (TENANTS,),
    )
    conn.execute(
        """
        INSERT INTO pgqueue.jobs (tenant_id, origin, priority, payload, cost)
        SELECT 't' || (g %% %s),
               (ARRAY['user_action', 'scheduled', 'batch_job'])[1 + g %% 3]::pgqueue.origin,
               (ARRAY['critical', 'standard', 'batch'])[1 + g %% 3]::pgqueue.tier,
               '{}'::jsonb, 1 + g %% 7
        FROM generate_series(1, %s) g
        """,
        (TENANTS, QUEUED),
    )
    conn.commit()
    conn.execute("ANALYZE")
    conn.commit()
    plans = claim_plans(db_dsn) + claim_plans(db_dsn) + claim_plans(db_dsn, 50)
    on_jobs = [p for p in plans if "pgqueue.jobs" in p or " on jobs" in p]
    assert on_jobs, plans
    for plan in plans:
        assert "Seq Scan on jobs" not in plan, plan
    for index in ("jobs_claim_idx", "jobs_unstamped_idx", "jobs_unstamped_due_idx"):
        assert any(index in p for p in plans), index


FINISHED = 100_000
_SCAN = re.compile(
    r"(?P<node>(?:Bitmap Heap|Index Only|Index|Seq|Tid) Scan(?: using \w+)? on jobs\b).*?"
    # Postgres 18 prints the average rows per loop with two decimals (`rows=1.00`)
    r"\(actual rows=(?P<rows>\d+(?:\.\d+)?) loops=(?P<loops>\d+)\)"
)


def _jobs_scans(plan: str) -> list[tuple[str, int, int, int]]:
    """(node, rows, loops, shared buffers hit + read) of each scan of pgqueue.jobs in a plan."""
    lines = plan.splitlines()
    scans = []
    for i, line in enumerate(lines):
        m = _SCAN.search(line)
        if m is None:
            continue
        depth = len(line) - len(line.lstrip())
        pages = 0
        for below in lines[i + 1 :]:
            if below.strip().startswith("->") or len(below) - len(below.lstrip()) <= depth:
                break
            if "Buffers: shared" in below:
                pages = sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", below))
                break
        scans.append((m["node"], round(float(m["rows"])), int(m["loops"]), pages))
    return scans


def _page_bound(node: str, rows: int, loops: int) -> int:
    """Pages an index probe may read: a few index pages per loop, and per row it returns one
    heap page and, for a scan with an array of keys (``id = ANY(...)``), one descent. A TID
    scan (``ctid = ANY(ARRAY(SELECT ... FOR UPDATE SKIP LOCKED))``: the batched completion and
    the heartbeat) counts, besides its own heap pages, the pages of the subquery that locked
    the same rows by primary key, run lazily inside it (that scan is bounded on its own too)."""
    bound = 4 * loops + 5 * rows * loops + 4  # EXPLAIN's rows are per loop
    return 2 * bound if node.startswith("Tid Scan") else bound


@pytest.mark.slow
def test_claim_path_does_not_read_finished_jobs(conn, db_dsn):
    """Issue 8 (bloat): with many finished jobs in the table (vacuumed, as autovacuum leaves
    it), every scan of pgqueue.jobs in a claim and a batched completion reads a few pages per
    row it returns, never pages of finished jobs (bench/bloat.py measures the speed)."""
    conn.execute(
        "INSERT INTO pgqueue.tenants (tenant_id) SELECT 't' || g FROM generate_series(0, 99) g"
    )
    conn.execute(
        """
        INSERT INTO pgqueue.jobs (tenant_id, origin, priority, state, payload, cost, attempts,
                                  run_at, enqueued_at, started_at, finished_at, worker_id,
                                  lease_token, result, input_tokens, output_tokens)
        SELECT 't' || (g %% 100), 'scheduled', (%s::pgqueue.tier[])[1 + g %% 3],
               (CASE WHEN g %% 20 = 0 THEN 'failed' ELSE 'succeeded' END)::pgqueue.job_state,
               '{}'::jsonb, 1, 1, f, f, f, f, 'w', gen_random_uuid(), '{"ok": true}'::jsonb, 10, 10
        FROM generate_series(1, %s) g,
             LATERAL (SELECT now() - make_interval(secs => %s - g) AS f) t
        """,
        (["critical", "standard", "batch"], FINISHED, FINISHED),
    )
    conn.execute(
        """
        INSERT INTO pgqueue.jobs (tenant_id, origin, priority, payload, cost)
        SELECT 't' || (g %% 100), 'scheduled', (%s::pgqueue.tier[])[1 + g %% 3],
               '{}'::jsonb, 1 + g %% 4
        FROM generate_series(1, 3000) g
        """,
        (["critical", "standard", "batch"],),
    )
    conn.commit()
    conn.autocommit = True
    conn.execute("VACUUM ANALYZE pgqueue.jobs")
    plans: list[str] = []
    with psycopg.connect(db_dsn, autocommit=True) as c:
        _load_auto_explain(c)
        for _ in range(2):  # the first claim stamps the 300 new (tenant, tier) flows
            queries.run(
                c,
                "job_claim",
                {"limit": 10, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []},
            )
        # As autovacuum would after the first fold's thousands of stamps: the index entries of
        # their unstamped versions go, so that a fold's once-a-second look at every flow (due
        # when this test runs slowly, on a loaded machine) steps over only what the claims
        # below move, not over the first fold's (a CI failure: 861 pages in 50 loops).
        c.execute("VACUUM pgqueue.jobs")
        for setting in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_analyze = on",
            "auto_explain.log_buffers = on",
            "auto_explain.log_timing = off",
            "auto_explain.log_nested_statements = on",
            "auto_explain.log_level = notice",
            "client_min_messages = notice",
        ):
            c.execute(f"SET {setting}")
        c.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
        for _ in range(3):
            rows = queries.run(
                c,
                "job_claim",
                {"limit": 10, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []},
            )
            assert len(rows) == 10
            done = queries.run(
                c,
                "job_complete_many",
                success_batch(
                    (r["id"], r["tenant_id"], r["lease_token"], None, 1, 1) for r in rows
                ),
            )
            assert len(done) == 10
    scans = [s for p in plans for s in _jobs_scans(p)]
    assert any("jobs_claim_idx" in s[0] for s in scans), plans
    for node, rows, loops, pages in scans:
        assert "Seq Scan" not in node, plans
        # The scheduler's partial indexes keep the entries of the jobs stamped or claimed since
        # the last vacuum (the jobs this test moves, none of the finished ones: the claims
        # measured also stamp the horizon of the flows the first folds' slice left at their
        # first job, revision 0045): a scan from the head of a lane and tier steps over them.
        slack = 60 if "jobs_unstamped" in node or "jobs_claim_idx" in node else 0
        assert pages <= _page_bound(node, rows, loops) + slack, (node, rows, loops, pages)


@pytest.mark.slow
def test_batched_completion_probes_jobs_by_primary_key(conn, db_dsn):
    """A completion batch read as ``jsonb_array_elements(...)`` was planned for 100 rows and
    hash-joined every job whose ``jobs_running_lease_idx`` entry said running, dead entries
    included (nothing vacuums between claims): after a few thousand jobs each completion read
    thousands of entries, and ``pgqueue bench`` fell from ~7,100 to ~5,300 jobs/s with one
    process (the binary arrays before it had the same plan on a young table, and so did the
    heartbeat). The generic plans the worker's prepared statements get must probe
    ``jobs_pkey``."""
    conn.execute(
        "INSERT INTO pgqueue.tenants (tenant_id) SELECT 't' || g FROM generate_series(0, 9) g"
    )
    conn.execute(
        """
        INSERT INTO pgqueue.jobs (tenant_id, origin, priority, payload, cost)
        SELECT 't' || (g % 10), 'scheduled', 'standard', '{}'::jsonb, 1
        FROM generate_series(1, 2000) g
        """
    )
    conn.commit()

    def cycle(c: psycopg.Connection[Any]) -> int:
        rows = queries.run(
            c, "job_claim", {"limit": 10, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []}
        )
        held = {
            "held": Jsonb({str(r["id"]): [r["tenant_id"], r["lease_token"]] for r in rows}),
            "lease_seconds": 60,
        }
        assert len(queries.run(c, "job_heartbeat", held)) == 10
        batch = success_batch(
            (r["id"], r["tenant_id"], r["lease_token"], {"ok": True}, None, None) for r in rows
        )
        return len(queries.run(c, "job_complete_many", batch))

    plans: list[str] = []
    with psycopg.connect(db_dsn, autocommit=True) as c:
        for _ in range(150):  # 1,500 dead entries in the running-lease index
            assert cycle(c) == 10
        _load_auto_explain(c)
        _log_plans(
            c,
            plans,
            "plan_cache_mode = force_generic_plan",
            "auto_explain.log_analyze = on",
            "auto_explain.log_buffers = on",
            "auto_explain.log_timing = off",
        )
        assert cycle(c) == 10
    completion = [p for p in plans if "jsonb_object_keys" in p or "jsonb_array_elements" in p]
    assert len(completion) == 2, plans  # the heartbeat and the completion
    nodes = [n for p in completion for n in re.findall(r"(?:Scan on|Scan using) \w+", p)]
    assert not any("jobs_running_lease_idx" in n for n in nodes), nodes
    assert not any(re.search(r"Seq Scan on jobs\b", p) for p in completion), completion
    assert "Scan on jobs_pkey" in nodes or "Scan using jobs_pkey" in nodes, nodes
    scans = [s for p in completion for s in _jobs_scans(p)]
    assert scans, completion
    for node, rows, loops, pages in scans:
        assert pages <= _page_bound(node, rows, loops), (node, rows, loops, pages)


def test_a_session_that_claimed_on_an_empty_queue_still_claims_by_index(db_dsn):
    """A worker started on an empty queue keeps the plans of its first claims (plpgsql caches
    them): once jobs arrive, its claims still take them by index, never a sequential scan."""
    plans: list[str] = []
    with psycopg.connect(db_dsn, autocommit=True) as c:
        _load_auto_explain(c)
        for _ in range(8):  # the worker idles on an empty queue: plans are made and kept
            assert c.execute("SELECT id FROM pgqueue.claim(10, 'w', 60)").fetchall() == []
        with psycopg.connect(db_dsn, autocommit=True) as producer:
            producer.execute(
                "INSERT INTO pgqueue.tenants (tenant_id) SELECT 't' || g"
                " FROM generate_series(0, 9) g"
            )
            producer.execute(
                "INSERT INTO pgqueue.jobs (tenant_id, origin, priority, payload)"
                " SELECT 't' || (g % 10), 'user_action', 'critical', '{}'::jsonb"
                " FROM generate_series(1, 5000) g"
            )
        _log_plans(c, plans)
        for _ in range(2):
            assert len(c.execute("SELECT id FROM pgqueue.claim(10, 'w', 60)").fetchall()) == 10
    writes = [p for p in plans if "Update on jobs" in p]
    assert writes, plans
    for plan in plans:
        assert "Seq Scan on jobs" not in plan, plan


def _plans_of_one_claim(dsn: str, *settings: str) -> list[str]:
    """Nested plans (auto_explain) of one claim of 10 from a queue of 20 jobs of one tenant,
    in a session with ``settings`` applied first."""
    plans: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as c:
        _load_auto_explain(c)
        for setting in settings:
            c.execute(f"SET {setting}")
        c.execute("INSERT INTO pgqueue.tenants (tenant_id) VALUES ('t')")
        c.execute(
            "INSERT INTO pgqueue.jobs (tenant_id, origin, priority, payload)"
            " SELECT 't', 'user_action', 'critical', '{}'::jsonb FROM generate_series(1, 20)"
        )
        _log_plans(c, plans)
        assert len(c.execute("SELECT id FROM pgqueue.claim(10, 'w', 60)").fetchall()) == 10
    return plans


def test_the_claim_is_never_jit_compiled(db_dsn):
    """The stamper plans with enable_seqscan = off, which adds its penalty to the cost of the
    statements that have no index to use; past jit_above_cost Postgres JIT-compiled them at
    every claim (~250 ms a claim, revision 0011). The claim's functions turn JIT off."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        if not c.execute("SELECT pg_jit_available()").fetchone()[0]:
            pytest.skip("this server has no JIT")
    # JIT whatever the cost, wherever it is allowed
    plans = _plans_of_one_claim(db_dsn, "jit_above_cost = 0")
    nested = [p for p in plans if "pgqueue.claim" not in p]
    assert nested, plans
    assert not [p for p in nested if "JIT:" in p]
