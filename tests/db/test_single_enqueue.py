"""Whatever path a single job takes, the books (DRR inbox, queue counts, NOTIFY, the tenant's
lock) must end the same. Revision 0019 kept them in try_enqueue's own statement and skipped the
insert trigger; revision 0041 (issue 32: a producer could forge the skip) runs the trigger for
every insert again, whatever the session sets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import pgqueue
from tests.db.tenant_support import delete_after_commit

PAYLOAD = {
    "model": "claude-haiku-4-5",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "hi"}],
}
RAW_INSERT = (
    "INSERT INTO pgqueue.jobs (tenant_id, origin, priority, payload)"
    " VALUES (%s, 'user_action', 'critical', '{}'::jsonb)"
)
TRIGGER_CALLS = (
    "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions"
    " WHERE schemaname = 'pgqueue' AND funcname = 'jobs_after_insert'"
)


def _books(c: psycopg.Connection[Any]) -> tuple[dict[Any, int], dict[Any, int]]:
    """(counters, queued jobs), each keyed by (tier, tenant) and (tier, None) for a tier."""
    counters = dict(
        c.execute(
            "SELECT (tier::text, tenant_id), sum(queued)::int FROM pgqueue.queue_counts"
            " GROUP BY 1 HAVING sum(queued) <> 0"
        ).fetchall()
    )
    queued = dict(
        c.execute(
            "SELECT (priority::text, tenant_id), count(*)::int FROM pgqueue.jobs"
            " WHERE state = 'queued' GROUP BY GROUPING SETS ((priority, tenant_id), (priority))"
        ).fetchall()
    )
    return counters, queued


def _register(dsn: str, *tenants: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for tenant in tenants:
            c.execute("SELECT pgqueue.ensure_tenant(%s)", (tenant,))


def test_every_path_of_a_single_enqueue_keeps_the_same_books(db_dsn: str) -> None:
    _register(db_dsn, "a", "b")
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("SET track_functions = 'pl'")
        with c.transaction():
            pgqueue.enqueue(c, tenant_id="a", origin="user_action", payload=PAYLOAD)
            pgqueue.enqueue(c, tenant_id="b", origin="scheduled", payload=PAYLOAD, sla_seconds=60)
            pgqueue.enqueue(c, tenant_id="a", origin="batch_job", payload=PAYLOAD)
            # The trigger ran for each of the three (revision 0019 skipped it).
            assert c.execute(TRIGGER_CALLS).fetchone() == (3,)
        # The other paths: a new tenant, a dedupe key, REPEATABLE READ, a demoted tenant, a
        # capped tier, a job due later, and a plain INSERT.
        pgqueue.enqueue(c, tenant_id="new", origin="user_action", payload=PAYLOAD)
        pgqueue.enqueue(c, tenant_id="a", origin="user_action", payload=PAYLOAD, dedupe_key="k")
        c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pgqueue.enqueue(c, tenant_id="b", origin="user_action", payload=PAYLOAD)
        c.execute("COMMIT")
        c.execute(
            "INSERT INTO pgqueue.demotions (tenant_id, reason, expires_at)"
            " VALUES ('b', 'test', now() + interval '1 hour')"
        )
        pgqueue.enqueue(c, tenant_id="b", origin="user_action", payload=PAYLOAD)
        c.execute("SELECT pgqueue.admission_set('standard', 100, NULL, 'reject')")
        pgqueue.enqueue(c, tenant_id="a", origin="scheduled", payload=PAYLOAD, sla_seconds=60)
        later = datetime.now(UTC) + timedelta(hours=1)
        pgqueue.enqueue(c, tenant_id="a", origin="user_action", payload=PAYLOAD, run_at=later)
        c.execute(RAW_INSERT, ("b",))
        counters, queued = _books(c)
        assert counters == queued
        assert sum(n for (tier, tenant), n in queued.items() if tenant is None) == 10


def test_the_trigger_still_runs_for_the_rest_of_the_transaction(db_dsn: str) -> None:
    """Later inserts in the same transaction are counted, after a failed statement too, and
    no setting made by hand skips the trigger (revision 0019's mark included)."""
    _register(db_dsn, "a")
    with psycopg.connect(db_dsn) as c:
        pgqueue.enqueue(c, tenant_id="a", origin="user_action", payload=PAYLOAD)
        c.execute(RAW_INSERT, ("a",))
        assert c.execute("SELECT current_setting('pgqueue.insert_bookkept', true)").fetchone()[
            0
        ] in ("", None)
        with pytest.raises(psycopg.errors.CheckViolation), c.transaction():
            # Past the range a job's run_at may take: the one statement fails with the
            # setting on, and the savepoint takes both back.
            c.execute(
                "SELECT * FROM pgqueue.try_enqueue('a', 'user_action', %s::jsonb,"
                " run_at => 'infinity')",
                (psycopg.types.json.Jsonb(PAYLOAD),),
            )
        c.execute(RAW_INSERT, ("a",))
        c.commit()
        # Set by hand, for the session or the transaction, the setting never skips the trigger.
        c.execute("SET pgqueue.insert_bookkept = on")
        c.execute(RAW_INSERT, ("a",))
        c.execute("SELECT set_config('pgqueue.insert_bookkept', '1', true)")
        c.execute(RAW_INSERT, ("a",))
        c.execute(
            "SELECT set_config('pgqueue.insert_bookkept', pg_current_xact_id()::text || '/0', true)"
        )
        c.execute(RAW_INSERT, ("a",))
        c.commit()
        counters, queued = _books(c)
        assert counters == queued == {("critical", "a"): 6, ("critical", None): 6}


@pytest.mark.timeout(60)
def test_a_registered_tenant_is_held_until_the_enqueue_commits(db_dsn: str) -> None:
    _register(db_dsn, "a")
    with psycopg.connect(db_dsn) as producer:
        pgqueue.enqueue(producer, tenant_id="a", origin="user_action", payload=PAYLOAD)
        error = delete_after_commit(db_dsn, producer, "a")
    assert isinstance(error, psycopg.errors.ForeignKeyViolation)


def test_a_single_enqueue_wakes_workers_on_commit(db_dsn: str) -> None:
    _register(db_dsn, "a")
    with psycopg.connect(db_dsn, autocommit=True) as listener, psycopg.connect(db_dsn) as conn:
        listener.execute("LISTEN pgqueue_jobs")
        pgqueue.enqueue(conn, tenant_id="a", origin="scheduled", payload=PAYLOAD, sla_seconds=60)
        conn.commit()
        got = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.payload for n in got] == ["standard"]


def test_counter_rows_held_by_others_get_new_rows(db_dsn: str) -> None:
    _register(db_dsn, "a")
    with psycopg.connect(db_dsn, autocommit=True) as c:
        pgqueue.enqueue(c, tenant_id="a", origin="user_action", payload=PAYLOAD)
    with psycopg.connect(db_dsn) as holder, psycopg.connect(db_dsn, autocommit=True) as c:
        holder.execute("SELECT 1 FROM pgqueue.queue_counts FOR UPDATE")
        c.execute("SET lock_timeout = '5s'")
        pgqueue.enqueue(c, tenant_id="a", origin="user_action", payload=PAYLOAD)  # no wait
        holder.commit()
        rows = c.execute("SELECT count(*) FROM pgqueue.queue_counts").fetchone()[0]
        counters, queued = _books(c)
    assert rows == 4  # two keys, each with its held row and a new one
    assert counters == queued == {("critical", "a"): 2, ("critical", None): 2}


def test_triggers_of_the_users_own_keep_the_books(db_dsn: str) -> None:
    """An enqueue made by a user's trigger on another table is counted once (by the insert
    trigger), and so is a job that a user's row trigger on pgqueue.jobs inserts during an
    enqueue."""
    _register(db_dsn, "a")
    payload = psycopg.types.json.Jsonb(PAYLOAD)
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute(
            """
            CREATE TABLE public.docs (id serial, tenant text);
            CREATE FUNCTION public.docs_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM * FROM pgqueue.try_enqueue(NEW.tenant, 'user_action',
                    '{"model": "m", "max_tokens": 5,
                      "messages": [{"role": "user", "content": "hi"}]}'::jsonb);
                RETURN NULL;
            END $$;
            CREATE TRIGGER docs_enqueue AFTER INSERT ON public.docs
                FOR EACH ROW EXECUTE FUNCTION public.docs_enqueue();
            """
        )
        c.execute("SET track_functions = 'pl'")
        with c.transaction():
            c.execute("INSERT INTO public.docs (tenant) VALUES ('a'), ('a')")
            assert c.execute(TRIGGER_CALLS).fetchone() == (2,)
        c.execute(
            """
            CREATE FUNCTION public.jobs_follow_up() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.kind = 'anthropic.messages' THEN
                    INSERT INTO pgqueue.jobs (tenant_id, origin, priority, payload, kind)
                    VALUES (NEW.tenant_id, 'user_action', 'critical', '{}', 'follow-up');
                END IF;
                RETURN NULL;
            END $$;
            CREATE TRIGGER jobs_follow_up AFTER INSERT ON pgqueue.jobs
                FOR EACH ROW EXECUTE FUNCTION public.jobs_follow_up();
            """
        )
        c.execute("SELECT * FROM pgqueue.try_enqueue('a', 'user_action', %s)", (payload,))
        counters, queued = _books(c)
    assert counters == queued == {("critical", "a"): 4, ("critical", None): 4}


def test_before_triggers_of_the_users_own_keep_the_books(db_dsn: str) -> None:
    """Found by a tester: the one statement counted the job it meant to insert, not the row a
    user's BEFORE trigger on pgqueue.jobs made of it (another tenant or tier, or no row), and a
    trigger that enqueued a companion job cleared the setting of the statement that fired it,
    so that job was counted twice."""
    _register(db_dsn, "a", "A", "c")
    payload = psycopg.types.json.Jsonb(PAYLOAD)
    enqueue = "SELECT * FROM pgqueue.try_enqueue(%s, 'scheduled', %s, 60, %s)"
    triggers = {
        "upper_tenant": "NEW.tenant_id := upper(NEW.tenant_id); RETURN NEW;",
        "to_batch": "IF NEW.kind = 'bulk' THEN NEW.priority := 'batch'; END IF; RETURN NEW;",
        "drop_ignored": "IF NEW.kind = 'ignored' THEN RETURN NULL; END IF; RETURN NEW;",
        "companion": "IF NEW.kind = 'main' THEN PERFORM pgqueue.enqueue(NEW.tenant_id,"
        " 'scheduled', '{\"c\": 1}'::jsonb, 60, 'companion'); END IF; RETURN NEW;",
        # a tenant the trigger registers itself, after the statement's snapshot was taken
        "org_tenant": "NEW.tenant_id := 'org:' || NEW.tenant_id;"
        " PERFORM pgqueue.ensure_tenant(NEW.tenant_id); RETURN NEW;",
    }
    with psycopg.connect(db_dsn, autocommit=True) as c:
        for name, body in triggers.items():
            c.execute(
                f"CREATE FUNCTION public.{name}() RETURNS trigger LANGUAGE plpgsql"
                f" AS $$ BEGIN {body} END $$"
            )
            c.execute(
                f"CREATE TRIGGER {name} BEFORE INSERT ON pgqueue.jobs"
                f" FOR EACH ROW EXECUTE FUNCTION public.{name}()"
            )
            if name == "upper_tenant":
                c.execute(enqueue, ("a", payload, "k"))  # counted for 'A'
                with pytest.raises(psycopg.errors.ForeignKeyViolation, match="'C'"):
                    c.execute(enqueue, ("c", payload, "k"))  # 'C' is not registered
            elif name == "to_batch":
                c.execute(enqueue, ("c", payload, "bulk"))
            elif name == "drop_ignored":
                row = c.execute(enqueue, ("c", payload, "ignored")).fetchone()
                assert row is not None and row[0] is None  # no job, as on the other paths
            elif name == "companion":
                c.execute(enqueue, ("c", payload, "main"))
            else:
                c.execute(enqueue, ("c", payload, "k"))  # counted for 'org:c'
            c.execute(f"DROP TRIGGER {name} ON pgqueue.jobs")
            counters, queued = _books(c)
            assert counters == queued, name
    assert queued == {
        ("standard", "A"): 1,
        ("batch", "c"): 1,
        ("standard", "c"): 2,
        ("standard", "org:c"): 1,
        ("standard", None): 4,
        ("batch", None): 1,
    }


def test_rules_on_jobs_keep_single_enqueue_working(db_dsn: str) -> None:
    """Found by a tester: a DO ALSO rule of the user's on pgqueue.jobs made every single
    enqueue fail (a statement with data-modifying CTEs cannot run with rules); such a table
    takes the trigger's path."""
    _register(db_dsn, "a")
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE public.job_audit (tenant text)")
        c.execute(
            "CREATE RULE jobs_audit AS ON INSERT TO pgqueue.jobs"
            " DO ALSO INSERT INTO public.job_audit (tenant) VALUES (NEW.tenant_id)"
        )
        pgqueue.enqueue(c, tenant_id="a", origin="user_action", payload=PAYLOAD)
        counters, queued = _books(c)
        assert c.execute("SELECT tenant FROM public.job_audit").fetchall() == [("a",)]
    assert counters == queued == {("critical", "a"): 1, ("critical", None): 1}
