"""Revision 0008's fast enqueue keeps every rule of the slow one.

The batch path validates set-based (pgqueue.job_is_valid) and only asks validate_job for the
error; the token estimate is counted another way; the Python batch is checked by a fast path
with a fallback to check_job. Each test here holds a fast form equal to the rule it replaces.
"""

from __future__ import annotations

import json
import math
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

import pgqueue
from pgqueue import JobSpec, errors
from pgqueue.models import Origin
from pgqueue.validation import check_job
from tests.db.test_validation import (
    EXPONENT_HEAVY,
    kinds,
    nested,
    origins,
    payloads,
    slas,
    tenants,
)

GOOD = {
    "model": "claude-haiku-4-5",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "hi"}],
}

# Revision 0001's estimate, verbatim: four jsonb_path_query calls summed.
ESTIMATE_0001 = """
SELECT ceil(coalesce(sum(char_length(t #>> '{}')), 0) / 4.0)::integer
FROM (
    SELECT jsonb_path_query(%(p)s, 'lax $.system ? (@.type() == "string")') AS t
    UNION ALL
    SELECT jsonb_path_query(%(p)s, 'lax $.system[*].text ? (@.type() == "string")')
    UNION ALL
    SELECT jsonb_path_query(%(p)s, 'lax $.messages[*].content ? (@.type() == "string")')
    UNION ALL
    SELECT jsonb_path_query(%(p)s, 'lax $.messages[*].content[*].text ? (@.type() == "string")')
) AS texts
"""

# Strings with what JSON escapes (quotes, backslashes, control characters), non-ASCII text
# and text that looks like an escape.
tricky_text = st.text(
    alphabet=st.sampled_from(["a", "é", "\\", '"', "\n", "\t", "\x01", "\x1f", "u", "0", "😀"]),
    max_size=12,
)
json_any = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), tricky_text),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["text", "type", "content", "x"]), inner, max_size=3),
    ),
    max_leaves=8,
)
blocks = st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(tricky_text, json_any)}),
    max_size=3,
)
estimate_payloads = st.fixed_dictionaries(
    {},
    optional={
        "system": st.one_of(tricky_text, blocks, json_any),
        "messages": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {"role": st.just("user"), "content": st.one_of(tricky_text, blocks, json_any)}
                ),
                max_size=3,
            ),
            json_any,
        ),
    },
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(payload=estimate_payloads)
@example(payload={"system": 'a\\u0041"b', "messages": [{"content": ["x\\", "\x01"]}]})
def test_token_estimate_equals_revision_0001s(conn, payload):
    p = Jsonb(payload)
    old = conn.execute(ESTIMATE_0001, {"p": p}).fetchone()[0]
    new = conn.execute("SELECT e.est FROM pgqueue.input_token_estimate(%s) e", (p,)).fetchone()
    scalar = conn.execute("SELECT pgqueue.estimate_input_tokens(%s)", (p,)).fetchone()[0]
    assert new[0] == scalar == old


def _validate_job_accepts(conn, tenant, origin, payload, sla, kind, max_attempts) -> bool:
    try:
        with conn.transaction():
            conn.execute(
                "SELECT pgqueue.validate_job(%s, %s, %s, %s, %s, %s)",
                (tenant, origin, payload, sla, kind, max_attempts),
            )
    except psycopg.Error as exc:
        assert errors.from_sqlstate(exc.sqlstate, str(exc)) is not None, exc
        return False
    return True


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    tenant=st.one_of(tenants, st.none()),
    origin=st.one_of(origins, st.none()),
    payload=st.one_of(payloads, st.just([1]), st.just("x"), st.none()),
    sla=st.one_of(slas, st.just(math.nan), st.just(math.inf), st.just(-math.inf)),
    kind=st.one_of(kinds, st.none(), st.just("k" * 129)),
    max_attempts=st.one_of(st.none(), st.integers(-2, 1002)),
)
@example(tenant="a", origin="scheduled", payload=None, sla=None, kind="custom", max_attempts=None)
@example(
    tenant="a",
    origin="scheduled",
    payload={"model": "m", "max_tokens": 2**31, "messages": [1]},
    sla=None,
    kind="anthropic.messages",
    max_attempts=None,
)
def test_job_is_valid_is_validate_job_without_the_raise(
    conn, tenant, origin, payload, sla, kind, max_attempts
):
    assume("\\u0000" not in json.dumps(payload))  # jsonb refuses it while reading the parameter
    jb = None if payload is None else Jsonb(payload)
    accepted = _validate_job_accepts(conn, tenant, origin, jb, sla, kind, max_attempts)
    fast = conn.execute(
        "SELECT pgqueue.job_is_valid(%s, %s, %s, %s, %s, %s, 1048576)",
        (tenant, origin, jb, sla, kind, max_attempts),
    ).fetchone()[0]
    assert fast is accepted


def test_job_is_valid_honours_the_payload_cap(conn):
    conn.execute("SET pgqueue.max_payload_bytes = 100")
    big = Jsonb({**GOOD, "system": "x" * 200})
    assert not _validate_job_accepts(conn, "a", "scheduled", big, None, "k", None)
    assert (
        conn.execute(
            "SELECT pgqueue.job_is_valid('a', 'scheduled', %s, NULL, 'k', NULL, 100)", (big,)
        ).fetchone()[0]
        is False
    )


def _batch(conn, tenants_, origins_, payloads_json, slas_=None, kinds_=None):
    return conn.execute(
        "SELECT ord, id, outcome FROM pgqueue.try_enqueue_batch(%s, %s, %s::jsonb, %s, %s)",
        (tenants_, origins_, payloads_json, slas_, kinds_),
    ).fetchall()


@pytest.mark.parametrize(
    ("jobs", "sqlstate"),
    [
        # the first bad job in input order decides, whatever comes after it
        ([("a", "scheduled", 1.0), ("a", "scheduled", -1.0), ("", "urgent", None)], "PQ005"),
        ([("a", "scheduled", 1.0), ("", "urgent", -1.0), ("a", "x", None)], "PQ006"),
        ([("a", "urgent", None), ("a", "scheduled", math.nan)], "PQ004"),
    ],
)
def test_sql_batch_raises_the_first_bad_jobs_error_and_writes_nothing(conn, jobs, sqlstate):
    payload = '[{"x": 1}, {"x": 2}, {"x": 3}]' if len(jobs) == 3 else '[{"x": 1}, {"x": 2}]'
    with pytest.raises(psycopg.Error) as info:
        _batch(
            conn,
            [j[0] for j in jobs],
            [j[1] for j in jobs],
            payload,
            [j[2] for j in jobs],
            ["custom"] * len(jobs),
        )
    assert info.value.sqlstate == sqlstate
    conn.rollback()
    assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM pgqueue.tenants").fetchone()[0] == 0


def test_sql_batch_checks_its_arguments(conn):
    for payloads_json in ('{"x": 1}', '[{"x": 1}, {"x": 2}]'):
        with pytest.raises(psycopg.Error) as info:
            _batch(conn, ["a"], ["scheduled"], payloads_json)
        assert info.value.sqlstate == "PQ009"
        conn.rollback()
    assert _batch(conn, [], [], "[]") == []
    # a payload that is not an object is the job's own error, as in try_enqueue_many
    with pytest.raises(psycopg.Error) as info:
        _batch(conn, ["a"], ["scheduled"], "[null]")
    assert info.value.sqlstate == "PQ001"


def test_sql_enqueue_many_still_takes_jsonb_arrays(conn):
    ids = conn.execute(
        "SELECT pgqueue.enqueue_many(ARRAY['a', 'b'], ARRAY['user_action', 'batch_job'],"
        " ARRAY[%s::jsonb, %s::jsonb])",
        (Jsonb(GOOD), Jsonb(GOOD)),
    ).fetchall()
    rows = conn.execute(
        "SELECT id, tenant_id, priority::text FROM pgqueue.jobs ORDER BY id"
    ).fetchall()
    assert [r[0] for r in ids] == [r[0] for r in rows]
    assert [(r[1], r[2]) for r in rows] == [("a", "critical"), ("b", "batch")]


def test_batch_with_a_cap_near_takes_the_exact_path(conn):
    # 3 of one tenant's jobs fit under a tier cap of 3 only together with nothing else:
    # the batch (2 tenants, 4 jobs in the tier) must admit in input order, then drop.
    conn.execute("SELECT pgqueue.admission_set('batch', 3, NULL, 'drop')")
    ids = pgqueue.enqueue_many(
        conn,
        [
            JobSpec("a", "batch_job", GOOD),
            JobSpec("b", "batch_job", GOOD),
            JobSpec("a", "user_action", GOOD),
            JobSpec("a", "batch_job", GOOD),
            JobSpec("b", "batch_job", GOOD),
        ],
    )
    assert [i is None for i in ids] == [False, False, False, False, True]


# ------------------------------------------------------------------ the Python batch


class Tenant(str):
    """A str subclass: accepted as a tenant id, like any str."""


def test_python_batch_accepts_what_single_enqueue_accepts(conn):
    big = {**GOOD, "system": "é" * 300_000}  # ~600 kB each: two are over the 1 MiB cap
    ids = pgqueue.enqueue_many(
        conn,
        [
            JobSpec(Tenant("a"), Origin.SCHEDULED, GOOD, sla_seconds=60),  # int SLA, enum origin
            {"tenant_id": "b", "origin": "scheduled", "payload": big, "sla_seconds": 5.5},
            JobSpec("c", "scheduled", big, sla_seconds=86_400),
        ],
    )
    rows = conn.execute(
        "SELECT id, tenant_id, origin::text, sla_seconds, priority::text,"
        " octet_length(payload::text) > 500000 FROM pgqueue.jobs ORDER BY id"
    ).fetchall()
    assert [r[0] for r in rows] == ids
    assert [r[1:] for r in rows] == [
        ("a", "scheduled", 60.0, "standard", False),
        ("b", "scheduled", 5.5, "standard", True),
        ("c", "scheduled", 86_400.0, "batch", True),
    ]


malformed_fields = st.one_of(
    st.fixed_dictionaries({"tenant_id": st.one_of(st.just(""), st.just("t" * 129), st.none())}),
    st.fixed_dictionaries({"tenant_id": st.just("a\x00")}),
    st.fixed_dictionaries({"origin": st.one_of(st.just("urgent"), st.none(), st.integers())}),
    st.fixed_dictionaries(
        {"sla_seconds": st.one_of(st.just(-1), st.just(math.nan), st.just(True), st.just("1"))}
    ),
    st.fixed_dictionaries({"kind": st.one_of(st.just(""), st.just("k\x00"), st.just(3))}),
    st.fixed_dictionaries(
        {"payload": st.one_of(st.just([1]), st.none(), st.just({"x": math.inf}))}
    ),
    st.fixed_dictionaries({"payload": st.just({**GOOD, "messages": []})}),
    st.fixed_dictionaries({"payload": st.just({**GOOD, "max_tokens": 1.5})}),
    st.fixed_dictionaries({"payload": st.just({**GOOD, "model": "\x00"})}),
    st.fixed_dictionaries({"payload": st.just({**GOOD, "system": "x" * 1_100_000})}),
    st.fixed_dictionaries({"payload": st.just(EXPONENT_HEAVY)}),  # over the cap once in jsonb
    # What Python cannot hand to the driver: the field's typed error, not UnicodeEncodeError,
    # OverflowError or RecursionError.
    st.fixed_dictionaries({"tenant_id": st.sampled_from(["a\ud800", "\udfff"])}),
    st.fixed_dictionaries({"kind": st.just("k\ud800")}),
    st.fixed_dictionaries({"payload": st.just({**GOOD, "system": "\ud800"})}),
    st.fixed_dictionaries({"sla_seconds": st.sampled_from([10**400, 2**1024])}),
    st.fixed_dictionaries({"payload": st.just({**GOOD, "max_tokens": 10**400})}),
    st.fixed_dictionaries({"payload": st.just({**GOOD, "x": nested(5000)})}),
)


def _single_error(fields: dict[str, Any]) -> type[errors.UsageError]:
    try:
        check_job(**fields)
    except errors.UsageError as exc:
        return type(exc)
    raise AssertionError("expected a usage error")


# 200 examples, each an enqueue against the database: over the suite's 60 s on a loaded
# machine (a fresh-machine trial: the timeout fired mid-example, and hypothesis called it flaky).
@pytest.mark.timeout(300)
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(bad=malformed_fields, where=st.integers(0, 4), also=malformed_fields)
def test_python_batch_raises_what_single_enqueue_raises_for_the_first_bad_job(
    conn, bad, where, also
):
    good = {"tenant_id": "a", "origin": "scheduled", "payload": GOOD, "sla_seconds": 1.0}
    jobs: list[dict[str, Any]] = [dict(good) for _ in range(5)]
    jobs[where].update(bad)
    if where < 4:
        jobs[4].update(also)  # a later bad job never decides
    expected = _single_error(jobs[where])
    with pytest.raises(errors.UsageError) as info:
        pgqueue.enqueue_many(conn, jobs)
    assert type(info.value) is expected
    assert str(info.value).startswith(f"job {where}: ")
    assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()[0] == 0


BOUNDARY_CASES = [
    ({"tenant_id": "a\ud800"}, errors.InvalidTenant),
    ({"kind": "k\ud800"}, errors.InvalidKind),
    (
        {"payload": {**GOOD, "messages": [{"role": "user", "content": "\ud800"}]}},
        errors.InvalidPayload,
    ),
    ({"sla_seconds": 10**400}, errors.InvalidSla),
    ({"payload": {**GOOD, "max_tokens": 10**400}}, errors.InvalidPayload),
    ({"payload": {**GOOD, "x": nested(5000)}}, errors.InvalidPayload),
    ({"payload": EXPONENT_HEAVY}, errors.PayloadTooLarge),
]


@pytest.mark.parametrize(
    ("fields", "error"),
    BOUNDARY_CASES,
    ids=[
        "surrogate-tenant",
        "surrogate-kind",
        "surrogate-payload",
        "huge-sla",
        "huge-max-tokens",
        "deep-payload",
        "exponent-heavy",
    ],
)
def test_python_batch_types_input_the_driver_cannot_send(db_dsn, fields, error):
    with psycopg.connect(db_dsn) as conn:
        conn.execute("CREATE TABLE public.mine (id int)")
        conn.execute("INSERT INTO public.mine VALUES (1)")
        jobs = [{"tenant_id": "a", "origin": "scheduled", "payload": GOOD} for _ in range(3)]
        jobs[1].update(fields)
        with pytest.raises(error, match=r"^job 1: "):
            pgqueue.enqueue_many(conn, jobs)
        conn.execute("INSERT INTO public.mine VALUES (2)")  # the transaction is still usable
        conn.commit()
        assert conn.execute("SELECT count(*) FROM public.mine").fetchone()[0] == 2
        assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()[0] == 0


def test_migrating_keeps_what_pgqueue_grant_set(db_dsn):
    """Revision 0008 replaced the enqueue functions; the migrations re-grant after `pgqueue
    grant`. (Down to the base and up again stands in for 0006 -> 0008, no longer shipped.)"""
    from pgqueue.db import migrate, queries

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        queries.run(conn, "security_grant")
    migrate.downgrade(db_dsn, "base")
    migrate.upgrade(db_dsn)
    with psycopg.connect(db_dsn) as conn:
        rows = conn.execute(
            "SELECT p.proname, p.prosecdef, p.proconfig IS NOT NULL,"
            " has_function_privilege('pgqueue_producer', p.oid, 'EXECUTE'),"
            " has_function_privilege('public', p.oid, 'EXECUTE')"
            " FROM pg_proc p WHERE p.pronamespace = 'pgqueue'::regnamespace"
            " AND p.proname IN ('enqueue', 'enqueue_many', 'try_enqueue', 'try_enqueue_many',"
            " 'try_enqueue_batch', 'job_is_valid', 'input_token_estimate')"
        ).fetchall()
    by_name = {r[0]: r[1:] for r in rows}
    assert len(by_name) == 7
    for name in ("enqueue", "enqueue_many", "try_enqueue", "try_enqueue_many", "try_enqueue_batch"):
        assert by_name[name] == (True, True, True, False), name
    for name in ("job_is_valid", "input_token_estimate"):
        assert by_name[name] == (False, False, False, False), name


def _public_or_invoker(dsn: str) -> list[str]:
    """Enqueue functions that are not SECURITY DEFINER, and functions PUBLIC may execute."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'pgqueue'::regnamespace"
            " AND ((p.proname IN ('enqueue', 'enqueue_many', 'try_enqueue', 'try_enqueue_many',"
            "      'try_enqueue_batch') AND NOT p.prosecdef)"
            "      OR (has_function_privilege('public', p.oid, 'EXECUTE')"
            "          AND p.prorettype <> 'trigger'::regtype))"  # not callable directly
        ).fetchall()
    return sorted(r[0] for r in rows)


def test_downgrade_and_upgrade_keep_what_pgqueue_grant_set(db_dsn):
    """Found by a tester: after `pgqueue grant`, a downgrade across 0008 (whose down file
    replaces the enqueue functions) and back left them SECURITY INVOKER, so producers got
    `permission denied`, and new functions executable by PUBLIC. Migrations re-grant now."""
    from pgqueue.db import migrate, queries

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        queries.run(conn, "security_grant")
    assert _public_or_invoker(db_dsn) == []
    migrate.downgrade(db_dsn, "base")  # 0006 before the baseline replaced the chain
    assert _public_or_invoker(db_dsn) == []
    migrate.upgrade(db_dsn)
    assert _public_or_invoker(db_dsn) == []


@pytest.mark.parametrize(
    "call",
    [
        "pgqueue.enqueue_many('[0:1]={alice,bob}', '{scheduled,scheduled}', ARRAY[%(p)s, %(p)s])",
        "pgqueue.enqueue_many('{alice,bob}', '[0:1]={scheduled,scheduled}', ARRAY[%(p)s, %(p)s])",
        "pgqueue.enqueue_many('{alice,bob}', '{scheduled,scheduled}', ARRAY[%(p)s, %(p)s],"
        " '[0:1]={5,7}')",
        "pgqueue.enqueue_many('{{alice},{bob}}', '{scheduled,scheduled}', ARRAY[%(p)s, %(p)s])",
    ],
)
def test_sql_batch_refuses_arrays_not_indexed_from_one(conn, call):
    """Found by a tester: '[0:1]={5,7}' paired each job with its neighbour's SLA (and tier)."""
    payload = Jsonb(GOOD)
    with pytest.raises(psycopg.Error) as info:
        conn.execute(f"SELECT * FROM {call}", {"p": payload})
    assert info.value.sqlstate == "PQ009", info.value
    conn.rollback()
    assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()[0] == 0
