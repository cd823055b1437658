"""Enqueue through every entry point, inside the caller's transaction."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import psycopg.sql
import pytest
from psycopg.types.json import Jsonb
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import pgqueue
from pgqueue import JobSpec

PAYLOAD = {
    "model": "claude-haiku-4-5",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "hi"}],
}


def _count(dsn: str, table: str = "jobs") -> int:
    with psycopg.connect(dsn) as c:
        return c.execute(f"SELECT count(*) FROM pgqueue.{table}").fetchone()[0]


def _sa_url(dsn: str, driver: str = "psycopg") -> str:
    return f"postgresql+{driver}://"


def test_commit_keeps_job_and_rollback_leaves_nothing(db_dsn):
    with psycopg.connect(db_dsn) as conn:
        pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
        conn.rollback()
        assert _count(db_dsn) == 0
        assert _count(db_dsn, "tenants") == 0
        job_id = pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
        conn.commit()
    with psycopg.connect(db_dsn) as c:
        row = c.execute(
            "SELECT tenant_id, origin::text, priority::text, state::text, attempts, cost, model,"
            " max_output_tokens FROM pgqueue.jobs WHERE id = %s",
            (job_id,),
        ).fetchone()
    assert row == ("a", "user_action", "critical", "queued", 0, 1.0, "claude-haiku-4-5", 8)


def test_job_commits_with_the_callers_own_writes(db_dsn):
    with psycopg.connect(db_dsn) as conn:
        conn.execute("CREATE TABLE public.reviews (id int PRIMARY KEY)")
        conn.commit()
        conn.execute("INSERT INTO public.reviews VALUES (1)")
        pgqueue.enqueue(conn, tenant_id="a", origin="scheduled", sla_seconds=60, payload=PAYLOAD)
        conn.rollback()
        conn.execute("INSERT INTO public.reviews VALUES (2)")
        pgqueue.enqueue(conn, tenant_id="a", origin="scheduled", sla_seconds=60, payload=PAYLOAD)
        conn.commit()
        assert conn.execute("SELECT array_agg(id) FROM public.reviews").fetchone()[0] == [2]
    assert _count(db_dsn) == 1


async def test_async_connection(db_dsn):
    async with await psycopg.AsyncConnection.connect(db_dsn) as aconn:
        job_id = await pgqueue.enqueue(aconn, tenant_id="b", origin="batch_job", payload=PAYLOAD)
        ids = await pgqueue.enqueue_many(
            aconn, [JobSpec("b", "scheduled", PAYLOAD, sla_seconds=5)] * 3
        )
        await aconn.commit()
    assert len(ids) == 3 and job_id not in ids
    assert _count(db_dsn) == 4


def test_sqlalchemy_session(db_dsn):
    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(db_dsn))
    try:
        with Session(engine) as session:
            session.execute(text("CREATE TABLE public.notes (id int)"))
            session.execute(text("INSERT INTO public.notes VALUES (7)"))
            job_id = pgqueue.enqueue(
                session, tenant_id="c", origin="scheduled", sla_seconds=3600, payload=PAYLOAD
            )
            session.commit()
        with Session(engine) as session:
            pgqueue.enqueue(session, tenant_id="c", origin="scheduled", payload=PAYLOAD)
            session.rollback()
    finally:
        engine.dispose()
    with psycopg.connect(db_dsn) as c:
        assert c.execute("SELECT id FROM public.notes").fetchall() == [(7,)]
        assert c.execute("SELECT id, priority::text FROM pgqueue.jobs").fetchall() == [
            (job_id, "standard")
        ]


def test_a_sync_session_works_without_greenlet(db_dsn):
    """Found by a tester: SQLAlchemy 2.1 no longer installs greenlet, which its asyncio
    extension needs; pgqueue imported both in one try, so without greenlet even a plain sync
    Session was refused (InvalidArgument)."""
    script = (
        "import sys; sys.modules['greenlet'] = None\n"  # any import of greenlet now fails
        "import psycopg, pgqueue\n"
        "from sqlalchemy import create_engine\n"
        "from sqlalchemy.orm import Session\n"
        "engine = create_engine('postgresql+psycopg://',"
        f" creator=lambda: psycopg.connect({db_dsn!r}))\n"
        "with Session(engine) as s:\n"
        "    pgqueue.enqueue(s, tenant_id='g', origin='user_action', payload={'model': 'm',"
        " 'max_tokens': 8, 'messages': [{'role': 'user', 'content': 'hi'}]})\n"
        "    s.commit()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert _count(db_dsn) == 1


async def test_sqlalchemy_async_session(db_dsn):
    engine = create_async_engine(
        "postgresql+psycopg://",
        async_creator=lambda: psycopg.AsyncConnection.connect(db_dsn),
    )
    try:
        async with AsyncSession(engine) as session:
            job_id = await pgqueue.enqueue(
                session, tenant_id="d", origin="user_action", payload=PAYLOAD
            )
            await session.commit()
    finally:
        await engine.dispose()
    assert isinstance(job_id, int)
    assert _count(db_dsn) == 1


def test_enqueue_many_returns_ids_in_input_order(conn):
    specs = [
        JobSpec("t1", "user_action", PAYLOAD),
        {"tenant_id": "t2", "origin": "scheduled", "payload": PAYLOAD, "sla_seconds": 10},
        JobSpec("t3", "batch_job", PAYLOAD),
        JobSpec("t1", "scheduled", {"anything": [1, 2]}, kind="custom.kind"),
    ]
    ids = pgqueue.enqueue_many(conn, specs)
    rows = conn.execute(
        "SELECT id, tenant_id, priority::text, kind FROM pgqueue.jobs ORDER BY id"
    ).fetchall()
    assert [r[0] for r in rows] == ids
    assert [(r[1], r[2], r[3]) for r in rows] == [
        ("t1", "critical", "anthropic.messages"),
        ("t2", "standard", "anthropic.messages"),
        ("t3", "batch", "anthropic.messages"),
        ("t1", "batch", "custom.kind"),
    ]
    assert pgqueue.enqueue_many(conn, []) == []


def test_bulk_enqueue_of_many_tenants(conn):
    specs = [JobSpec(f"tenant-{i % 50}", "scheduled", PAYLOAD, sla_seconds=60) for i in range(2000)]
    ids = pgqueue.enqueue_many(conn, specs)
    assert len(ids) == len(set(ids)) == 2000
    assert conn.execute("SELECT count(*) FROM pgqueue.tenants").fetchone()[0] == 50


def test_demoted_tenant_goes_to_batch(conn):
    pgqueue.enqueue(conn, tenant_id="runaway", origin="user_action", payload=PAYLOAD)
    conn.execute(
        "INSERT INTO pgqueue.demotions (tenant_id, reason, expires_at)"
        " VALUES ('runaway', 'test', now() + interval '5 minutes')"
    )
    job_id = pgqueue.enqueue(conn, tenant_id="runaway", origin="user_action", payload=PAYLOAD)
    [many_id] = pgqueue.enqueue_many(conn, [JobSpec("runaway", "user_action", PAYLOAD)])
    got = conn.execute(
        "SELECT priority::text FROM pgqueue.jobs WHERE id = ANY(%s) ORDER BY id",
        ([job_id, many_id],),
    ).fetchall()
    assert got == [("batch",), ("batch",)]


def test_cost_is_estimated_from_the_payload(conn):
    text_4000_tokens = "x" * 16_000
    payload = {
        "model": "m",
        "max_tokens": 100,
        "system": [{"type": "text", "text": "y" * 4000}],
        "messages": [
            {"role": "user", "content": text_4000_tokens},
            {"role": "assistant", "content": [{"type": "text", "text": "z" * 4000}]},
        ],
    }
    job_id = pgqueue.enqueue(
        conn, tenant_id="a", origin="scheduled", sla_seconds=1, payload=payload
    )
    est, cost = conn.execute(
        "SELECT est_input_tokens, cost FROM pgqueue.jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert est == 6000
    assert cost == pytest.approx(6.0)


def test_notify_only_on_commit(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as listener, psycopg.connect(db_dsn) as conn:
        listener.execute("LISTEN pgqueue_jobs")
        pgqueue.enqueue(conn, tenant_id="a", origin="user_action", payload=PAYLOAD)
        conn.rollback()
        assert list(listener.notifies(timeout=0.3, stop_after=1)) == []
        pgqueue.enqueue_many(conn, [JobSpec("a", "batch_job", PAYLOAD)] * 5)
        conn.commit()
        got = list(listener.notifies(timeout=5, stop_after=1))
    assert len(got) == 1
    assert got[0].channel == "pgqueue_jobs"
    assert len(got[0].payload) < 64  # a tiny payload: the tiers touched, never the rows
    assert got[0].payload == "batch"


@pytest.mark.parametrize("on", ["on", "ON", "yes", "True ", "1"])
def test_require_known_tenant_reads_the_setting_as_a_boolean(db_dsn, on):
    """Found by a tester: only the exact strings on, true and 1 counted."""
    with psycopg.connect(db_dsn) as conn:
        conn.execute("SELECT set_config('pgqueue.require_known_tenant', %s, false)", (on,))
        with pytest.raises(pgqueue.UnknownTenant):
            pgqueue.enqueue(conn, tenant_id="stranger", origin="user_action", payload=PAYLOAD)


@pytest.mark.parametrize("off", ["off", "OFF", "no", "False", " f ", "0", "n", ""])
def test_require_known_tenant_reads_off_spellings_as_off(db_dsn, off):
    with psycopg.connect(db_dsn) as conn:
        conn.execute("SELECT set_config('pgqueue.require_known_tenant', %s, false)", (off,))
        pgqueue.enqueue(conn, tenant_id="stranger", origin="user_action", payload=PAYLOAD)
        conn.commit()
    assert _count(db_dsn) == 1


@pytest.mark.parametrize("bad", ["maybe", "onn", "2", "enabled"])
def test_an_unrecognised_require_known_tenant_raises_pq012(db_dsn, bad):
    """Found by a tester: ALTER DATABASE d SET pgqueue.require_known_tenant = 'maybe' read as
    off, and a job of an unknown tenant was queued (and the tenant registered). It raises
    PQ012 (InvalidSetting) naming the setting, from Python and SQL; nothing is stored."""
    dbname = psycopg.conninfo.conninfo_to_dict(db_dsn)["dbname"]
    with psycopg.connect(db_dsn, autocommit=True) as owner:
        owner.execute(
            psycopg.sql.SQL("ALTER DATABASE {} SET pgqueue.require_known_tenant = {}").format(
                psycopg.sql.Identifier(str(dbname)), psycopg.sql.Literal(bad)
            )
        )
    try:
        with psycopg.connect(db_dsn) as conn:
            with pytest.raises(pgqueue.InvalidSetting, match="require_known_tenant"):
                pgqueue.enqueue(conn, tenant_id="stranger", origin="user_action", payload=PAYLOAD)
            conn.rollback()
            with pytest.raises(psycopg.Error) as info:
                conn.execute(
                    "SELECT pgqueue.enqueue('stranger', 'user_action', %s)", (Jsonb(PAYLOAD),)
                )
            assert info.value.sqlstate == "PQ012"
            conn.rollback()
            assert conn.execute("SELECT count(*) FROM pgqueue.tenants").fetchone() == (0,)
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as owner:
            owner.execute(
                psycopg.sql.SQL("ALTER DATABASE {} RESET pgqueue.require_known_tenant").format(
                    psycopg.sql.Identifier(str(dbname))
                )
            )
    assert _count(db_dsn) == 0


def test_require_known_tenant(db_dsn):
    with psycopg.connect(db_dsn) as conn:
        conn.execute("SET pgqueue.require_known_tenant = on")
        with pytest.raises(pgqueue.UnknownTenant):
            pgqueue.enqueue(conn, tenant_id="stranger", origin="user_action", payload=PAYLOAD)
        conn.rollback()
        conn.execute("SET pgqueue.require_known_tenant = on")
        conn.execute("INSERT INTO pgqueue.tenants (tenant_id) VALUES ('known')")
        pgqueue.enqueue(conn, tenant_id="known", origin="user_action", payload=PAYLOAD)
        conn.commit()
    assert _count(db_dsn) == 1


@pytest.mark.parametrize("policy", ["drop", "reject"])
def test_an_unknown_tenant_is_refused_before_a_full_tier_has_a_say(db_dsn, policy):
    """Found by a tester: with tenants required, a job of an unknown tenant on a full tier got
    the tier's verdict (dropped, with a counter row for a tenant that does not exist, or
    QueueFull, a "retry later") instead of UnknownTenant."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute(
            "UPDATE pgqueue.admission SET max_queued = 0, policy = %s WHERE tier = 'batch'",
            (policy,),
        )
        c.execute("INSERT INTO pgqueue.tenants (tenant_id) VALUES ('known')")
    for single in (True, False):
        with psycopg.connect(db_dsn) as conn:
            conn.execute("SET pgqueue.require_known_tenant = on")
            with pytest.raises(pgqueue.UnknownTenant, match="stranger"):
                if single:
                    pgqueue.enqueue(conn, tenant_id="stranger", origin="batch_job", payload=PAYLOAD)
                else:
                    pgqueue.enqueue_many(
                        conn,
                        [
                            JobSpec("known", "user_action", PAYLOAD),
                            JobSpec("stranger", "batch_job", PAYLOAD),
                        ],
                    )
    with psycopg.connect(db_dsn) as c:
        assert c.execute(
            "SELECT count(*) FROM pgqueue.queue_counts WHERE tenant_id = 'stranger'"
        ).fetchone() == (0,)
        assert c.execute("SELECT tenant_id FROM pgqueue.tenants").fetchall() == [("known",)]
    assert _count(db_dsn) == 0


def test_wrong_connection_type_is_a_typed_error():
    with pytest.raises(pgqueue.InvalidArgument):
        pgqueue.enqueue(object(), tenant_id="a", origin="user_action", payload=PAYLOAD)  # type: ignore[call-overload]


def test_concurrent_batches_registering_the_same_new_tenants_do_not_deadlock(db_dsn):
    import threading

    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def batch(tenants: list[str]) -> None:
        try:
            with psycopg.connect(db_dsn) as conn:
                barrier.wait(timeout=10)
                pgqueue.enqueue_many(conn, [JobSpec(t, "batch_job", PAYLOAD) for t in tenants])
                conn.commit()
        except BaseException as exc:
            errors.append(exc)

    for round_ in range(25):
        names = [f"r{round_}-{i}" for i in range(8)]
        threads = [
            threading.Thread(target=batch, args=(names,)),
            threading.Thread(target=batch, args=(names[::-1],)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert not errors, errors[:3]
    assert _count(db_dsn, "tenants") == 25 * 8


def test_dedupe_key_returns_the_live_job(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        first = pgqueue.enqueue(
            conn,
            tenant_id="a",
            origin="scheduled",
            sla_seconds=60,
            payload=PAYLOAD,
            dedupe_key="order-42",
        )
        again = pgqueue.enqueue(
            conn,
            tenant_id="a",
            origin="scheduled",
            sla_seconds=60,
            payload=PAYLOAD,
            dedupe_key="order-42",
        )
        other_tenant = pgqueue.enqueue(
            conn, tenant_id="b", origin="scheduled", payload=PAYLOAD, dedupe_key="order-42"
        )
        no_key = pgqueue.enqueue(conn, tenant_id="a", origin="scheduled", payload=PAYLOAD)
        assert again == first and other_tenant != first and no_key != first
        assert _count(db_dsn) == 3
        # SQL callers get the same answer
        sql_again = conn.execute(
            "SELECT pgqueue.enqueue('a', 'scheduled', %s, dedupe_key => 'order-42')",
            (Jsonb(PAYLOAD),),
        ).fetchone()[0]
        assert sql_again == first
        # once the job has finished, the key is free again
        conn.execute(
            "UPDATE pgqueue.jobs SET state = 'succeeded', finished_at = now() WHERE id = %s",
            (first,),
        )
        later = pgqueue.enqueue(
            conn, tenant_id="a", origin="scheduled", payload=PAYLOAD, dedupe_key="order-42"
        )
        assert later not in (first, None)
        with pytest.raises(pgqueue.InvalidArgument):
            pgqueue.enqueue(conn, tenant_id="a", origin="scheduled", payload=PAYLOAD, dedupe_key="")


def test_concurrent_enqueues_of_one_dedupe_key_make_one_job(db_dsn):
    import threading

    ids: list[int | None] = []
    barrier = threading.Barrier(4)

    def producer() -> None:
        with psycopg.connect(db_dsn) as conn:
            barrier.wait(timeout=10)
            ids.append(
                pgqueue.enqueue(
                    conn, tenant_id="a", origin="user_action", payload=PAYLOAD, dedupe_key="k"
                )
            )
            conn.commit()

    threads = [threading.Thread(target=producer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(ids) == 4 and len(set(ids)) == 1
    assert _count(db_dsn) == 1
