"""A tenant's own role (``pgqueue grant``, bound in ``pgqueue.tenant_roles``) attacking the
shared books and limits with what it may set and call (issue 32, found by a hostile tester).

Whatever the session sets, the queue counters stay exact (never negative), a tier's cap holds
for every tenant, the payload cap and ``require_known_tenant`` are the admin's, and a full tier
does not tell a producer how many jobs other tenants have queued.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

import pgqueue
from pgqueue.db import queries
from tests.db.tenant_support import bound_producer

PAYLOAD = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
FORGE_INSERT_MARK = (
    "SELECT set_config('pgqueue.insert_bookkept', pg_current_xact_id()::text || '/0', true)"
)
FORGE_CLAIM_MARK = "SELECT set_config('pgqueue.claim_counted', pg_current_xact_id()::text, true)"
# Every SQL way in for one job of tenant evil (batch tier), and for two.
ENQUEUE_ONE = (
    "SELECT pgqueue.enqueue('evil', 'batch_job', %(p)s)",
    "SELECT id FROM pgqueue.try_enqueue('evil', 'batch_job', %(p)s)",
)
ENQUEUE_TWO = (
    "SELECT pgqueue.enqueue_many(ARRAY['evil', 'evil'], ARRAY['batch_job', 'batch_job'],"
    " ARRAY[%(p)s, %(p)s]::jsonb[])",
    "SELECT id FROM pgqueue.try_enqueue_batch(ARRAY['evil', 'evil'],"
    " ARRAY['batch_job', 'batch_job'], jsonb_build_array(%(p)s, %(p)s))",
    "SELECT id FROM pgqueue.try_enqueue_many(ARRAY['evil', 'evil'],"
    " ARRAY['batch_job', 'batch_job'], ARRAY[%(p)s, %(p)s]::jsonb[])",
)


@pytest.fixture
def evil(db_dsn: str) -> Iterator[str]:
    """The DSN of a producer role bound to tenant evil."""
    with bound_producer(db_dsn, "evil") as dsn:
        yield dsn


def _books(db_dsn: str) -> tuple[dict[Any, int], dict[Any, int], int]:
    """(counters, queued jobs, the lowest counter), each keyed by (tier, tenant) and by
    (tier, None) for a tier; read as the owner."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        rows = c.execute(
            "SELECT (tier::text, tenant_id), sum(queued)::int FROM pgqueue.queue_counts GROUP BY 1"
        ).fetchall()
        queued = dict(
            c.execute(
                "SELECT (priority::text, tenant_id), count(*)::int FROM pgqueue.jobs"
                " WHERE state = 'queued'"
                " GROUP BY GROUPING SETS ((priority, tenant_id), (priority))"
            ).fetchall()
        )
    counters = {key: n for key, n in rows if n != 0}
    return counters, queued, min((n for _, n in rows), default=0)


def _fill(db_dsn: str, tenant: str, n: int) -> int:
    """Enqueue batch jobs for ``tenant`` as the owner until the tier refuses one; how many
    were admitted (at most ``n``)."""
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        for k in range(n):
            try:
                pgqueue.enqueue(owner, tenant_id=tenant, origin="batch_job", payload=PAYLOAD)
            except pgqueue.QueueFull:
                return k
    return n


def test_a_forged_insert_mark_leaves_no_job_uncounted(db_dsn: str, evil: str) -> None:
    """Before: the mark ``<xact>/0`` set by hand skipped the insert trigger for enqueue_many;
    those jobs were never counted, and cancelling them drove the tier's count to -N, so the
    tier admitted N jobs past its cap, for every tenant."""
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        owner.execute("SELECT pgqueue.admission_set('batch', 8, NULL, 'reject')")
    with psycopg.connect(evil) as conn:
        for call in ENQUEUE_ONE + ENQUEUE_TWO:
            conn.execute(FORGE_INSERT_MARK)
            conn.execute(call, {"p": Jsonb(PAYLOAD)})
        conn.commit()
        counters, queued, lowest = _books(db_dsn)
        assert counters == queued == {("batch", "evil"): 8, ("batch", None): 8}
        conn.execute(FORGE_INSERT_MARK)
        assert conn.execute("SELECT pgqueue.cancel_queued('evil')").fetchone() == (8,)
        conn.commit()
    counters, queued, lowest = _books(db_dsn)
    assert counters == queued == {}
    assert lowest >= 0
    assert _fill(db_dsn, "globex", 20) == 8  # the cap holds for everyone


def test_a_forged_claim_mark_does_not_keep_cancelled_jobs_counted(db_dsn: str, evil: str) -> None:
    """Before: the claim's mark set by hand made the update trigger skip a producer's
    cancels; the cancelled jobs stayed counted and filled the tier's cap for every tenant."""
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        owner.execute("SELECT pgqueue.admission_set('batch', 4, NULL, 'reject')")
    with psycopg.connect(evil) as conn:
        ids = [
            pgqueue.enqueue(conn, tenant_id="evil", origin="batch_job", payload=PAYLOAD)
            for _ in range(4)
        ]
        conn.commit()
        conn.execute(FORGE_CLAIM_MARK)
        assert conn.execute("SELECT pgqueue.cancel(%s)", (ids[0],)).fetchone() == ("cancelled",)
        conn.execute(FORGE_CLAIM_MARK)
        assert conn.execute("SELECT pgqueue.cancel_queued('evil')").fetchone() == (3,)
        conn.commit()
    counters, queued, lowest = _books(db_dsn)
    assert counters == queued == {}
    assert lowest >= 0
    assert _fill(db_dsn, "globex", 10) == 4


BIG = {**PAYLOAD, "pad": "x" * 1_500_000}  # over the default cap of 1 MiB
RAISE_CAP = (
    "SET pgqueue.max_payload_bytes = 100000000000",
    "SELECT set_config('pgqueue.max_payload_bytes', '100000000000', false)",
    "SELECT set_config('pgqueue.max_payload_bytes', '100000000000', true)",
)


def _payload_calls(payload: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c, {"p": Jsonb(payload)}) for c in ENQUEUE_ONE + ENQUEUE_TWO]


def test_a_producer_cannot_raise_the_payload_cap(db_dsn: str, evil: str) -> None:
    """Before: SET pgqueue.max_payload_bytes = 1e11 let a tenant's role enqueue 1.5 MB."""
    with psycopg.connect(evil, autocommit=True) as conn:
        for setting in RAISE_CAP:
            conn.execute(setting)
            for call, args in _payload_calls(BIG):
                with pytest.raises(psycopg.Error) as info:
                    conn.execute(call, args)
                assert info.value.sqlstate == "PQ002"
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        assert owner.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (0,)


def test_the_admins_payload_cap_binds_producers_both_ways(db_dsn: str, evil: str) -> None:
    """The cap a producer gets is the one set for the database (ALTER DATABASE ... SET),
    lower or higher than the default, whatever the session sets."""
    dbname = psycopg.conninfo.conninfo_to_dict(db_dsn)["dbname"]
    small = {**PAYLOAD, "pad": "x" * 3000}

    def alter(value: int) -> None:
        with psycopg.connect(db_dsn, autocommit=True) as owner:
            owner.execute(
                sql.SQL("ALTER DATABASE {} SET pgqueue.max_payload_bytes = {}").format(
                    sql.Identifier(str(dbname)), sql.Literal(str(value))
                )
            )

    alter(2000)
    with psycopg.connect(evil, autocommit=True) as conn:
        conn.execute("SET pgqueue.max_payload_bytes = 100000000000")
        for call, args in _payload_calls(small):
            with pytest.raises(psycopg.Error) as info:
                conn.execute(call, args)
            assert info.value.sqlstate == "PQ002"
    alter(4_000_000)
    with psycopg.connect(evil, autocommit=True) as conn:
        conn.execute("SET pgqueue.max_payload_bytes = 100")
        for call, args in _payload_calls(BIG):
            conn.execute(call, args)
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        assert owner.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (8,)


def test_a_producer_cannot_switch_off_require_known_tenant(db_dsn: str, evil: str) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(db_dsn)["dbname"]
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        owner.execute(
            sql.SQL("ALTER DATABASE {} SET pgqueue.require_known_tenant = on").format(
                sql.Identifier(str(dbname))
            )
        )
    with psycopg.connect(evil, autocommit=True) as conn:
        conn.execute("SET pgqueue.require_known_tenant = off")
        for call, args in _payload_calls(PAYLOAD):
            with pytest.raises(psycopg.Error) as info:
                conn.execute(call, args)
            assert info.value.sqlstate == "PQ007"
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        assert owner.execute("SELECT count(*) FROM pgqueue.tenants").fetchone() == (0,)


def test_a_full_tier_tells_a_producer_its_cap_not_others_depth(db_dsn: str, evil: str) -> None:
    """Before: 'queue full: tier standard holds 3 queued jobs' told evil globex's backlog."""
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        owner.execute("SELECT pgqueue.admission_set('standard', 3, NULL, 'reject')")
        owner.execute("SELECT pgqueue.admission_set('batch', 3, NULL, 'drop')")
        for origin, sla in (("scheduled", 60.0), ("batch_job", None)):
            for _ in range(3):
                pgqueue.enqueue(
                    owner, tenant_id="globex", origin=origin, payload=PAYLOAD, sla_seconds=sla
                )
    with psycopg.connect(evil, autocommit=True) as conn:
        with pytest.raises(pgqueue.QueueFull) as info:
            pgqueue.enqueue(
                conn, tenant_id="evil", origin="scheduled", payload=PAYLOAD, sla_seconds=60
            )
        err = info.value
        assert (err.tier, err.scope, err.depth, err.cap) == ("standard", "tier", None, 3)
        assert "holds" not in str(err)
        with pytest.raises(pgqueue.QueueFull) as info:
            pgqueue.enqueue_many(
                conn, [pgqueue.JobSpec("evil", "scheduled", PAYLOAD, sla_seconds=60)]
            )
        assert (info.value.depth, info.value.cap) == (None, 3)
        with pytest.raises(psycopg.Error) as sql_info:
            conn.execute("SELECT pgqueue.enqueue('evil', 'scheduled', %s, 60)", (Jsonb(PAYLOAD),))
        assert sql_info.value.sqlstate == "PQ010"
        assert sql_info.value.diag.message_primary == (
            "queue full: tier standard is at its cap of queued jobs (cap 3, policy reject)"
        )
        assert '"depth" : null' in str(sql_info.value.diag.message_detail)
        rows = [
            conn.execute(
                "SELECT outcome, depth, cap FROM pgqueue.try_enqueue('evil', 'scheduled', %s, 60)",
                (Jsonb(PAYLOAD),),
            ).fetchone(),
            conn.execute(
                "SELECT outcome, depth, cap FROM pgqueue.try_enqueue('evil', 'batch_job', %s)",
                (Jsonb(PAYLOAD),),
            ).fetchone(),
            *conn.execute(
                "SELECT outcome, depth, cap FROM pgqueue.try_enqueue_many(ARRAY['evil'],"
                " ARRAY['scheduled'], ARRAY[%s]::jsonb[], ARRAY[60::float8])",
                (Jsonb(PAYLOAD),),
            ).fetchall(),
            *conn.execute(
                "SELECT outcome, depth, cap FROM pgqueue.try_enqueue_batch(ARRAY['evil'],"
                " ARRAY['batch_job'], jsonb_build_array(%s::jsonb))",
                (Jsonb(PAYLOAD),),
            ).fetchall(),
        ]
        assert rows == [
            ("full", None, 3),
            ("dropped", None, 3),
            ("full", None, 3),
            ("dropped", None, 3),
        ]


SCHEDULER_LOCK = 7310575183440224370  # drr_dispatch's advisory lock key
TAKE_LOCK = (
    f"SELECT pg_advisory_lock({SCHEDULER_LOCK})",
    f"SELECT pg_try_advisory_lock({SCHEDULER_LOCK})",
    f"SELECT pg_advisory_lock_shared({SCHEDULER_LOCK})",
    "SELECT pg_advisory_lock(1, 2)",
)


def test_advisory_locks_can_be_kept_from_producers(db_dsn: str, evil: str) -> None:
    """Found by a hostile tenant: pg_advisory_lock(<the scheduler's key>) as a producer stopped
    every claim of every worker until its session ended. After `pgqueue grant
    --restrict-advisory-locks` it is refused, and a worker role still claims."""
    worker = f"pq_w_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        queries.run(owner, "security_restrict_advisory_locks")
        owner.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE pgqueue_worker").format(sql.Identifier(worker))
        )
        pgqueue.enqueue(owner, tenant_id="globex", origin="user_action", payload=PAYLOAD)
    try:
        with psycopg.connect(evil, autocommit=True) as conn:
            for call in TAKE_LOCK:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(call)
        with psycopg.connect(make_conninfo(db_dsn, user=worker), autocommit=True) as conn:
            claimed = queries.run(
                conn,
                "job_claim",
                {"limit": 5, "worker_id": "w", "lease_seconds": 60, "skip_kinds": []},
            )
            assert [job["tenant_id"] for job in claimed] == ["globex"]
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as owner:
            owner.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(worker)))
            owner.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(worker)))


# The advisory lock keys the rescuer, the pruner and a tenant's demotion took before revision
# 0041 (hashtextextended('pgqueue.demote:' || tenant, 0) for the demotion).
RESCUE_KEY, PRUNE_KEY = 0x7067_7175_6575_5253, 0x7067_7175_6575_5052


def test_advisory_locks_held_by_a_producer_stop_no_rescue_prune_or_demotion(
    db_dsn: str, evil: str
) -> None:
    """Found by a hostile tenant: holding the rescuer's key (pg_advisory_lock) made every
    rescue skip its round, the pruner's every prune, and globex's demotion key made each
    completion that demoted globex wait. They now lock rows a producer may not lock."""
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        lost, old = (
            pgqueue.enqueue(owner, tenant_id="globex", origin="batch_job", payload=PAYLOAD)
            for _ in range(2)
        )
        owner.execute(
            "UPDATE pgqueue.jobs SET state = 'running', lease_token = gen_random_uuid(),"
            " lease_expires_at = now() - interval '1 minute' WHERE id = %s",
            (lost,),
        )
        owner.execute(
            "UPDATE pgqueue.jobs SET state = 'succeeded', finished_at = now() - interval '2 days'"
            " WHERE id = %s",
            (old,),
        )
        owner.execute(
            "INSERT INTO pgqueue.usage_daily (tenant_id, day, requests, input_tokens)"
            " VALUES ('globex', pgqueue.budget_day(), 1, 10000000)"
        )
    with psycopg.connect(evil, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_advisory_lock(%s), pg_advisory_lock(%s),"
            " pg_advisory_lock(hashtextextended('pgqueue.demote:globex', 0))",
            (RESCUE_KEY, PRUNE_KEY),
        )
        with psycopg.connect(db_dsn, autocommit=True) as owner:
            owner.execute("SET lock_timeout = '2s'")
            rescued = queries.run(owner, "job_rescue", {"limit": 10})
            pruned = queries.run(owner, "job_prune", {"older_than_seconds": 3600, "limit": 10})
            why = owner.execute("SELECT pgqueue.demotion_check('globex')").fetchone()
            demoted = owner.execute("SELECT pgqueue.is_demoted('globex')").fetchone()
    assert [(r["id"], r["state"]) for r in rescued] == [(lost, "queued")]
    assert pruned == {"deleted": 1}
    assert why is not None and why[0] is not None
    assert demoted == (True,)
