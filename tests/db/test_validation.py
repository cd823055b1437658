"""Bad input at the enqueue boundary: a typed error, nothing written, the transaction usable.

The Python checks (pgqueue/validation.py) and the SQL function pgqueue.validate_job apply the
same rules; property tests feed both the same inputs and compare the error classes.
"""

from __future__ import annotations

import json
import math
import unicodedata
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

import pgqueue
from pgqueue import errors
from pgqueue.jsonb_size import jsonb_size, jsonb_text_size, numeric_text_length, to_json_text
from pgqueue.models import Origin
from pgqueue.scheduling.drr import estimate_input_tokens
from pgqueue.scheduling.tiers import classify
from pgqueue.settings import Settings
from pgqueue.validation import check_job, check_tenant_id

GOOD = {
    "model": "claude-haiku-4-5",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "hi"}],
}


def nested(depth: int) -> dict[str, Any]:
    """A JSON object ``depth`` levels deep, built without recursion."""
    inner: dict[str, Any] = {}
    for _ in range(depth):
        inner = {"a": inner}
    return inner


#: 80,000 copies of 1e16: Python writes "1e+16" (~560 kB), jsonb prints 10000000000000000
#: (~1.5 MB, over the 1 MiB cap).
EXPONENT_HEAVY = {**GOOD, "x": [1e16] * 80_000}

BAD_INPUTS: list[tuple[str, dict[str, Any], type[errors.UsageError]]] = [
    ("no model", {"payload": {"max_tokens": 8, "messages": [{}]}}, errors.InvalidPayload),
    ("empty model", {"payload": {**GOOD, "model": ""}}, errors.InvalidPayload),
    ("zero max_tokens", {"payload": {**GOOD, "max_tokens": 0}}, errors.InvalidPayload),
    ("negative max_tokens", {"payload": {**GOOD, "max_tokens": -5}}, errors.InvalidPayload),
    ("fractional max_tokens", {"payload": {**GOOD, "max_tokens": 1.5}}, errors.InvalidPayload),
    ("bool max_tokens", {"payload": {**GOOD, "max_tokens": True}}, errors.InvalidPayload),
    ("string max_tokens", {"payload": {**GOOD, "max_tokens": "8"}}, errors.InvalidPayload),
    ("empty messages", {"payload": {**GOOD, "messages": []}}, errors.InvalidPayload),
    # found by a tester: content "" was queued, and the provider answered 400
    (
        "empty text content",
        {"payload": {**GOOD, "messages": [{"role": "user", "content": ""}]}},
        errors.InvalidPayload,
    ),
    ("messages not a list", {"payload": {**GOOD, "messages": "hi"}}, errors.InvalidPayload),
    ("payload a list", {"payload": [1, 2]}, errors.InvalidPayload),
    ("NaN in payload", {"payload": {**GOOD, "temperature": math.nan}}, errors.InvalidPayload),
    ("not JSON", {"payload": {**GOOD, "x": object()}}, errors.InvalidPayload),
    ("oversize", {"payload": {**GOOD, "system": "x" * 1_100_000}}, errors.PayloadTooLarge),
    (
        "NUL in content",
        {"payload": {**GOOD, "messages": [{"role": "user", "content": "a\x00b"}]}},
        errors.NulCharacter,
    ),
    ("NUL in a key", {"payload": {**GOOD, "k\x00": 1}}, errors.NulCharacter),
    ("NUL in tenant", {"tenant_id": "a\x00"}, errors.NulCharacter),
    ("unknown origin", {"origin": "urgent"}, errors.UnknownOrigin),
    ("origin None", {"origin": None}, errors.UnknownOrigin),
    ("negative SLA", {"sla_seconds": -1}, errors.InvalidSla),
    ("NaN SLA", {"sla_seconds": math.nan}, errors.InvalidSla),
    ("infinite SLA", {"sla_seconds": math.inf}, errors.InvalidSla),
    ("string SLA", {"sla_seconds": "60"}, errors.InvalidSla),
    ("empty tenant", {"tenant_id": ""}, errors.InvalidTenant),
    # found by a tester: tenant " " was queued from the CLI, Python and SQL
    ("blank tenant", {"tenant_id": " "}, errors.InvalidTenant),
    ("white-space tenant", {"tenant_id": "\t\u3000\n"}, errors.InvalidTenant),
    ("oversize tenant", {"tenant_id": "t" * 129}, errors.InvalidTenant),
    ("tenant not a string", {"tenant_id": 42}, errors.InvalidTenant),
    ("empty kind", {"kind": ""}, errors.InvalidKind),
    ("zero max_attempts", {"max_attempts": 0}, errors.InvalidArgument),
    # Over the cap only as Postgres measures it (numbers printed without exponent).
    ("oversize once jsonb prints it", {"payload": EXPONENT_HEAVY}, errors.PayloadTooLarge),
    (
        "oversize with tiny floats",
        {"payload": {**GOOD, "x": [5e-324] * 4_000}},
        errors.PayloadTooLarge,
    ),
    # Input Python cannot even hand to the driver: typed like the field's other errors.
    ("lone surrogate in tenant", {"tenant_id": "a\ud800"}, errors.InvalidTenant),
    ("lone surrogate in kind", {"kind": "k\udfff"}, errors.InvalidKind),
    ("lone surrogate in dedupe_key", {"dedupe_key": "\ud800"}, errors.InvalidArgument),
    (
        "lone surrogate in payload",
        {"payload": {**GOOD, "messages": [{"role": "user", "content": "a\ud800"}]}},
        errors.InvalidPayload,
    ),
    ("lone surrogate in a payload key", {"payload": {**GOOD, "\ud800": 1}}, errors.InvalidPayload),
    ("SLA beyond double precision", {"sla_seconds": 10**400}, errors.InvalidSla),
    ("huge max_tokens", {"payload": {**GOOD, "max_tokens": 10**400}}, errors.InvalidPayload),
    ("payload nested 5000 deep", {"payload": {**GOOD, "x": nested(5000)}}, errors.InvalidPayload),
    ("tenant an int with no repr", {"tenant_id": 10**5000}, errors.InvalidTenant),
    ("origin an int with no repr", {"origin": 10**5000}, errors.UnknownOrigin),
]


def _call(conn: psycopg.Connection[Any], **overrides: Any) -> int:
    args: dict[str, Any] = {"tenant_id": "acme", "origin": "user_action", "payload": GOOD}
    args.update(overrides)
    return pgqueue.enqueue(conn, **args)


@pytest.mark.parametrize(("case", "overrides", "error"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_typed_writes_nothing_and_keeps_the_transaction(
    db_dsn, case, overrides, error
):
    with psycopg.connect(db_dsn) as conn:
        _call(conn, tenant_id="existing")  # stored data that must survive
        conn.commit()
        conn.execute("CREATE TABLE public.mine (id int)")
        conn.execute("INSERT INTO public.mine VALUES (1)")
        with pytest.raises(error) as info:
            _call(conn, **overrides)
        assert isinstance(info.value, pgqueue.UsageError)
        assert isinstance(info.value, ValueError)
        conn.execute("INSERT INTO public.mine VALUES (2)")  # the transaction is still usable
        conn.commit()
        assert conn.execute("SELECT count(*) FROM public.mine").fetchone()[0] == 2
        assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM pgqueue.tenants").fetchone()[0] == 1


def test_bulk_with_one_bad_job_writes_nothing(conn):
    specs = [pgqueue.JobSpec("a", "user_action", GOOD)] * 3 + [
        pgqueue.JobSpec("a", "user_action", {**GOOD, "max_tokens": 0})
    ]
    with pytest.raises(errors.InvalidPayload, match="job 3"):
        pgqueue.enqueue_many(conn, specs)
    with pytest.raises(errors.InvalidArgument):
        pgqueue.enqueue_many(
            conn, [{"tenant_id": "a", "origin": "user_action", "payload": GOOD, "tier": "critical"}]
        )
    assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()[0] == 0


SQL_CASES = [
    ("''", "'user_action'", GOOD, None, "PQ006"),
    ("' '", "'user_action'", GOOD, None, "PQ006"),
    ("'a'", "'urgent'", GOOD, None, "PQ004"),
    ("'a'", "'scheduled'", GOOD, -1.0, "PQ005"),
    ("'a'", "'scheduled'", GOOD, float("nan"), "PQ005"),
    ("'a'", "'user_action'", {**GOOD, "max_tokens": 0}, None, "PQ001"),
    ("'a'", "'user_action'", {"model": "m", "max_tokens": 5}, None, "PQ001"),
    ("'a'", "'scheduled'", {**GOOD, "messages": [{"role": "user", "content": ""}]}, None, "PQ001"),
    ("'a'", "'user_action'", {**GOOD, "system": "x" * 1_100_000}, None, "PQ002"),
]


@pytest.mark.parametrize(("tenant", "origin", "payload", "sla", "sqlstate"), SQL_CASES)
def test_sql_function_raises_its_sqlstate(conn, tenant, origin, payload, sla, sqlstate):
    with pytest.raises(psycopg.Error) as info:
        conn.execute(f"SELECT pgqueue.enqueue({tenant}, {origin}, %s, %s)", (Jsonb(payload), sla))
    assert info.value.sqlstate == sqlstate
    mapped = errors.from_sqlstate(info.value.sqlstate, "x")
    assert mapped is not None and mapped.sqlstate == sqlstate
    conn.rollback()
    assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()[0] == 0


def test_sql_rejects_nul_in_payload(conn):
    with pytest.raises(psycopg.Error) as info:
        conn.execute(
            "SELECT pgqueue.enqueue('a', 'user_action', %s::jsonb)",
            (json.dumps({**GOOD, "system": "a\x00b"}),),
        )
    assert isinstance(errors.from_sqlstate(info.value.sqlstate, "x"), errors.NulCharacter)


def test_a_white_space_tenant_is_refused_alike_by_python_and_sql(conn):
    """Tenant ids of one white-space character each (Python's ``str.isspace``), invisible ones
    (U+200B, U+00AD) and a near miss: the Python check, validate_job and job_is_valid agree."""
    blanks = [chr(c) for c in range(0x3001) if chr(c).isspace()]
    for tenant in [*blanks, "".join(blanks), "\u200b", "\xad", " a "]:
        py = _python_outcome(tenant, "scheduled", GOOD, None, "anthropic.messages")
        sql = _sql_outcome(conn, tenant, "scheduled", GOOD, None, "anthropic.messages")
        valid = conn.execute(
            "SELECT pgqueue.job_is_valid(%s, 'scheduled', %s, NULL, 'anthropic.messages', NULL,"
            " 1048576)",
            (tenant, Jsonb(GOOD)),
        ).fetchone()[0]
        expected = errors.InvalidTenant if tenant.isspace() or tenant in "\u200b\xad" else None
        assert (py, sql, valid) == (expected, expected, expected is None), repr(tenant)
    # Looking a tenant up refuses a blank one too (found by a tester: `tenants set "  "`
    # stored one), in Python as from the command line.
    for blank in ("  ", "\u3000"):
        with pytest.raises(errors.InvalidTenant, match="other than white space"):
            check_tenant_id(blank)
        with pytest.raises(errors.InvalidTenant, match="other than white space"):
            pgqueue.cancel_queued(conn, blank)
        with pytest.raises(errors.InvalidTenant, match="other than white space"):
            pgqueue.set_tenant_max_queued(conn, blank, 5)


def test_a_tenant_id_that_shows_nothing_is_refused_alike_by_python_and_sql(conn):
    """Found by a tester: a tenant id of one U+200B was queued from Python, the command line
    and SQL. Every code point (but U+0000 and surrogates) alone as a tenant id, and after a
    visible one: pgqueue.is_invisible holds exactly those Python's is_invisible holds, and
    job_is_valid refuses exactly those; validate_job raises PQ006 for a few, and enqueue from
    SQL writes nothing."""
    from pgqueue.validation import is_invisible

    refused = {c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF and is_invisible(chr(c))}
    rows = conn.execute(
        "SELECT c, pgqueue.is_invisible(chr(c)),"
        " NOT pgqueue.job_is_valid(chr(c), 'scheduled', '{}', NULL, 'custom', NULL, 1048576)"
        " FROM generate_series(1, 1114111) AS c WHERE c NOT BETWEEN 55296 AND 57343"
    ).fetchall()
    assert {c for (c, invisible, _) in rows if invisible} == refused
    assert {c for (c, _, not_valid) in rows if not_valid} == refused
    # after a visible character, only a control character is refused (the next test)
    mixed = conn.execute(
        "SELECT array_agg(c ORDER BY c) FROM generate_series(1, 1114111) AS c WHERE c NOT"
        " BETWEEN 55296 AND 57343 AND NOT pgqueue.job_is_valid('a' || chr(c), 'scheduled', '{}',"
        " NULL, 'custom', NULL, 1048576)"
    ).fetchone()[0]
    from pgqueue.validation import has_control

    assert mixed == [c for c in range(1, 0x110000) if has_control(chr(c))]
    for tenant in ("\u200b", "\ufeff\u2060", "\x01", "\U000e0041", " \u200b", "\u2800", "\u3164"):
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT pgqueue.enqueue(%s, 'scheduled', %s)", (tenant, Jsonb(GOOD)))
        assert info.value.sqlstate == "PQ006", tenant
        assert _python_outcome(tenant, "scheduled", GOOD, None, "anthropic.messages") is (
            errors.InvalidTenant
        )
        conn.rollback()
    assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()[0] == 0


def test_a_tenant_id_with_a_control_character_is_refused_alike_by_python_and_sql(conn):
    """Found by a tester: tenant ids holding ESC and OSC sequences, or a line break, were
    taken, and the command line's tables sent them to the terminal. Every code point (but
    U+0000 and surrogates) between two visible ones: pgqueue.has_control holds exactly those
    Python's has_control holds (category Cc, and U+2028, U+2029 and the bidi controls, found
    taken later), job_is_valid refuses exactly those, and validate_job raises PQ006 as
    enqueue and enqueue_many do in Python, for a few; nothing is stored."""
    from pgqueue.validation import has_control

    rows = conn.execute(
        "SELECT c, pgqueue.has_control('a' || chr(c) || 'b'),"
        " NOT pgqueue.job_is_valid('a' || chr(c) || 'b', 'scheduled', '{}', NULL, 'custom',"
        " NULL, 1048576)"
        " FROM generate_series(1, 1114111) AS c WHERE c NOT BETWEEN 55296 AND 57343"
    ).fetchall()
    expected = {c for c in range(1, 0x110000) if has_control(f"a{chr(c)}b")}
    breaking = {0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F)}
    breaking |= set(range(0x2066, 0x206A))
    assert expected == breaking | {
        c for c in range(1, 0x110000) if unicodedata.category(chr(c)) == "Cc"
    }
    assert {c for (c, control, _) in rows if control} == expected
    assert {c for (c, _, not_valid) in rows if not_valid} == expected
    for tenant in ("esc\x1b[31mRED\x1b[0m", "\x1b]0;pwned\x07", "a\nb", "a\x9b", "a\x7f",
                   "a\u2028b", "\u202egnp.exe"):  # fmt: skip
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT pgqueue.enqueue(%s, 'scheduled', %s)", (tenant, Jsonb(GOOD)))
        assert info.value.sqlstate == "PQ006", tenant
        conn.rollback()
        with pytest.raises(errors.InvalidTenant, match="control character"):
            pgqueue.enqueue_many(conn, [pgqueue.JobSpec(tenant, "scheduled", GOOD)])
        conn.rollback()
        with pytest.raises(errors.InvalidTenant, match="control character"):
            pgqueue.enqueue(conn, tenant_id=tenant, origin="scheduled", payload=GOOD)
        conn.rollback()
    assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()[0] == 0


@pytest.mark.parametrize(
    ("tenant", "shown"),
    [
        ("esc\x1b[31mRED\x1b[0m", "'esc<U+001B>[31mRED<U+001B>[0m'"),
        ("a\nb", "'a<U+000A>b'"),
        ("a\u2028b", "'a<U+2028>b'"),
        ("\u202egnp.exe", "'<U+202E>gnp.exe'"),
        ("\u200b", "'<U+200B>'"),
        ("  ", "'  '"),
        ("\t\u3000", "'<U+0009><U+3000>'"),
        (" \u2800\u3164", "' <U+2800><U+3164>'"),
        ("\U000e0041\x01", "'<U+E0041><U+0001>'"),
        ("\u200b" * 128, "'" + "<U+200B>" * 40 + "'…"),
    ],
)
def test_a_refused_invisible_tenant_id_is_shown_escaped(conn, tenant, shown):
    """validate_job's PQ006 message printed a tenant id of U+200B as '', and Python's repr
    printed U+3164 or U+2800 blank. Both show each invisible character (but the space) as
    <U+XXXX>, the first 40 characters of a longer id then "…", and raise the same message;
    so for an id with a control character (ESC, a line break) among visible ones."""
    with pytest.raises(errors.InvalidTenant) as python:
        check_tenant_id(tenant)
    with pytest.raises(psycopg.Error) as sql:
        conn.execute(
            "SELECT pgqueue.validate_job(%s, 'scheduled', '{}', NULL, 'custom', NULL)", (tenant,)
        )
    assert sql.value.sqlstate == "PQ006"
    assert str(python.value).endswith(f", got {shown}")
    assert sql.value.diag.message_primary == str(python.value)


def test_is_invisible_is_inlined_into_its_callers(conn):
    """pgqueue.is_invisible and pgqueue.has_control cost no function call: Postgres inlines
    them (LANGUAGE sql, one
    expression, IMMUTABLE), alone and inside job_is_valid, which the batch enqueue runs for
    every job; the plan shows the regular expression match, not the function. PL/pgSQL, SET
    or SECURITY DEFINER would turn that off."""
    for call in (
        "pgqueue.is_invisible(t.tenant_id)",
        "pgqueue.has_control(t.tenant_id)",
        "pgqueue.job_is_valid(t.tenant_id, 'scheduled', '{}', NULL, 'custom', NULL, 1048576)",
    ):
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                f"EXPLAIN (VERBOSE) SELECT {call} FROM pgqueue.tenants t"
            ).fetchall()
        )
        assert "is_invisible" not in plan and "has_control" not in plan and "~" in plan, plan


def test_empty_text_content_is_refused_alike_by_python_and_sql(conn):
    """Found by a tester: content "" was queued from Python and SQL (the CLI refused it), and
    the provider answered 400. The Python check, validate_job (same message) and job_is_valid
    agree; an empty final assistant message is a prefill, and other blocks are left alone."""
    hi = {"role": "user", "content": "hi"}
    cases: list[tuple[list[Any], int | None]] = [
        ([{"role": "user", "content": ""}], 0),
        ([hi, {"role": "user", "content": " \u3000\n"}], 1),
        ([hi, {"role": "user", "content": []}], 1),
        (
            [
                hi,
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "\t"}],
                },
            ],
            1,
        ),
        ([{"role": "assistant", "content": ""}, hi], 0),
        ([hi, {"role": "assistant", "content": " "}], 1),
        ([hi, {"role": "assistant", "content": ""}], None),
        ([hi, {"role": "assistant", "content": []}], None),
        ([{"role": "user", "content": [{"type": "image"}, {"type": "text"}]}], None),
        ([{"role": "user", "content": [{"type": "tool_result", "content": ""}]}], None),
        ([{"role": "user", "content": "\u200b"}, "not an object"], None),
    ]
    blanks = "".join(chr(c) for c in range(0x3001) if chr(c).isspace())
    cases += [([{"role": "user", "content": c}], 0) for c in blanks] + [
        ([{"role": "user", "content": blanks + "x"}], None)
    ]
    for messages, index in cases:
        payload = {**GOOD, "messages": messages}
        py = sql = None
        try:
            check_job(tenant_id="a", origin="scheduled", payload=payload)
        except errors.InvalidPayload as exc:
            py = str(exc)
        try:
            with conn.transaction():
                conn.execute(
                    "SELECT pgqueue.validate_job('a', 'scheduled', %s, NULL,"
                    " 'anthropic.messages', NULL)",
                    (Jsonb(payload),),
                )
        except psycopg.Error as exc:
            assert exc.sqlstate == "PQ001"
            sql = exc.diag.message_primary
        valid = conn.execute(
            "SELECT pgqueue.job_is_valid('a', 'scheduled', %s, NULL, 'anthropic.messages', NULL,"
            " 1048576)",
            (Jsonb(payload),),
        ).fetchone()[0]
        expected = (
            None
            if index is None
            else f"payload.messages[{index}]: text content must not be empty or white space"
        )
        assert (py, sql, valid) == (expected, expected, index is None), repr(messages)


def test_a_batch_names_a_missing_field_and_refuses_a_blank_tenant(conn):
    """Found by a tester: a job's mapping without an origin said "unknown origin None"."""
    job = {"tenant_id": "a", "origin": "scheduled", "payload": GOOD}
    for field, error in (
        ("origin", errors.UnknownOrigin),
        ("tenant_id", errors.InvalidTenant),
        ("payload", errors.InvalidPayload),
    ):
        missing = {k: v for k, v in job.items() if k != field}
        with pytest.raises(error, match=f"job 1: the field '{field}' is missing"):
            pgqueue.enqueue_many(conn, [job, missing])
    with pytest.raises(errors.InvalidTenant, match="job 0: tenant_id must hold a character"):
        pgqueue.enqueue_many(conn, [pgqueue.JobSpec(" ", "scheduled", GOOD)])
    assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()[0] == 0


# ------------------------------------------------------------------ Python ⇔ SQL parity

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10**6),
    st.text(max_size=12),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)
payload_values = st.one_of(
    json_leaf,
    st.lists(json_leaf, max_size=3),
    st.lists(
        st.fixed_dictionaries({"role": st.just("user"), "content": st.text(max_size=20)}),
        max_size=3,
    ),
)
payloads = st.one_of(
    st.dictionaries(
        st.sampled_from(["model", "max_tokens", "messages", "system", "x"]),
        payload_values,
        max_size=5,
    ),
    st.builds(
        lambda model, mt, msgs: {"model": model, "max_tokens": mt, "messages": msgs},
        st.one_of(st.text(max_size=6), st.integers()),
        st.one_of(
            st.integers(-3, 2**31 + 3), st.floats(-2, 10, allow_nan=False), st.text(max_size=3)
        ),
        st.lists(
            st.fixed_dictionaries({"role": st.just("user"), "content": st.text(max_size=20)}),
            max_size=2,
        ),
    ),
)
tenants = st.one_of(
    st.text(min_size=0, max_size=130).filter(lambda s: "\x00" not in s), st.just("t" * 128)
)
origins = st.sampled_from(["user_action", "scheduled", "batch_job", "urgent", ""])
slas = st.one_of(st.none(), st.floats(-10, 200_000, allow_nan=False), st.just(86_400.0))
kinds = st.sampled_from(["anthropic.messages", "custom", ""])


def _python_outcome(tenant, origin, payload, sla, kind):
    try:
        check_job(tenant_id=tenant, origin=origin, payload=payload, sla_seconds=sla, kind=kind)
    except errors.UsageError as exc:
        return type(exc)
    return None


def _sql_outcome(conn, tenant, origin, payload, sla, kind):
    try:
        with conn.transaction():
            conn.execute(
                "SELECT pgqueue.validate_job(%s, %s, %s, %s, %s, NULL)",
                (tenant, origin, Jsonb(payload), sla, kind),
            )
    except psycopg.Error as exc:
        mapped = errors.from_sqlstate(exc.sqlstate, str(exc))
        assert mapped is not None, f"unmapped SQL error {exc.sqlstate}: {exc}"
        return type(mapped)
    return None


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tenant=tenants, origin=origins, payload=payloads, sla=slas, kind=kinds)
@example(tenant="a", origin="urgent", payload={"x": "\x00"}, sla=None, kind="custom")
@example(tenant="", origin="urgent", payload={"model": "\x00"}, sla=-1.0, kind="")
def test_python_and_sql_validation_agree(conn, tenant, origin, payload, sla, kind):
    py = _python_outcome(tenant, origin, payload, sla, kind)
    sql = _sql_outcome(conn, tenant, origin, payload, sla, kind)
    assert py is sql


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    origin=st.sampled_from(list(Origin)),
    sla=st.one_of(st.none(), st.floats(0, 200_000, allow_nan=False), st.just(86_400.0)),
    demoted=st.booleans(),
)
def test_sql_classification_matches_the_reference(conn, origin, sla, demoted):
    got = conn.execute(
        "SELECT pgqueue.classify(%s::pgqueue.origin, %s, %s)::text", (origin.value, sla, demoted)
    ).fetchone()[0]
    assert got == classify(origin, sla, demoted=demoted).value


text_blocks = st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=40)}), max_size=3
)
contents = st.one_of(st.text(max_size=80), text_blocks)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    system=st.one_of(st.none(), st.text(max_size=50), text_blocks),
    messages=st.lists(
        st.fixed_dictionaries({"role": st.just("user"), "content": contents}),
        min_size=1,
        max_size=4,
    ),
)
def test_sql_token_estimate_matches_the_reference(conn, system, messages):
    payload: dict[str, Any] = {"model": "m", "max_tokens": 1, "messages": messages}
    if system is not None:
        payload["system"] = system
    try:
        sql_est = conn.execute(
            "SELECT pgqueue.estimate_input_tokens(%s)", (Jsonb(payload),)
        ).fetchone()[0]
    except psycopg.errors.UntranslatableCharacter:
        conn.rollback()
        return
    assert sql_est == estimate_input_tokens(payload)


malformed = st.one_of(
    st.builds(
        dict,
        tenant_id=st.one_of(
            st.just(""), st.text(min_size=129, max_size=140), st.integers(), st.none()
        ),
    ),
    st.builds(
        dict,
        origin=st.one_of(
            st.text(max_size=10).filter(lambda s: s not in {o.value for o in Origin}), st.integers()
        ),
    ),
    st.builds(
        dict,
        sla_seconds=st.one_of(
            st.floats(max_value=-1e-9), st.just(math.nan), st.just(math.inf), st.text(max_size=3)
        ),
    ),
    st.builds(
        dict,
        payload=st.one_of(
            st.lists(st.integers(), max_size=2), st.text(max_size=5), st.none(), st.integers()
        ),
    ),
    st.builds(
        dict,
        payload=st.fixed_dictionaries(
            {
                "model": st.one_of(st.just(""), st.integers(), st.none()),
                "max_tokens": st.integers(1, 10),
                "messages": st.just([{"role": "user", "content": "x"}]),
            }
        ),
    ),
    st.builds(
        dict,
        payload=st.fixed_dictionaries(
            {
                "model": st.just("m"),
                "max_tokens": st.one_of(
                    st.integers(max_value=0),
                    st.floats(0.1, 0.9),
                    st.text(max_size=2),
                    st.booleans(),
                ),
                "messages": st.just([{"role": "user", "content": "x"}]),
            }
        ),
    ),
    st.builds(
        dict,
        payload=st.fixed_dictionaries(
            {
                "model": st.just("m"),
                "max_tokens": st.just(5),
                "messages": st.one_of(st.just([]), st.text(max_size=3), st.none()),
            }
        ),
    ),
    st.builds(
        dict,
        payload=st.builds(
            lambda s: {**GOOD, "messages": [{"role": "user", "content": s}]},
            st.text(max_size=10).map(lambda s: s + "\x00"),
        ),
    ),
    st.builds(dict, kind=st.one_of(st.just(""), st.text(min_size=129, max_size=130))),
    st.builds(dict, max_attempts=st.one_of(st.integers(max_value=0), st.integers(min_value=1001))),
)


@settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(overrides=malformed)
def test_a_thousand_malformed_inputs_get_typed_errors_and_write_nothing(conn, overrides):
    with pytest.raises(pgqueue.UsageError):
        _call(conn, **overrides)
    assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM pgqueue.tenants").fetchone()[0] == 0


# ------------------------------------------------------- payload size as Postgres measures it


def _pg_size(conn: psycopg.Connection[Any], text: str) -> int:
    """``octet_length(payload::text)``: what validate_job and job_is_valid compare to the cap."""
    return conn.execute("SELECT octet_length(%s::jsonb::text)", (text,)).fetchone()[0]


def _holds_negative_zero(value: Any) -> bool:
    if isinstance(value, float):
        return value == 0.0 and math.copysign(1.0, value) < 0
    if isinstance(value, dict):
        return any(_holds_negative_zero(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_negative_zero(v) for v in value)
    return False


numbers = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e-3, max_value=1e-3),
    st.sampled_from(
        [
            1e16,
            1e-7,
            1.5e300,
            -0.0,
            0.0,
            5e-324,
            -1.7976931348623157e308,
            1e-4,
            9.999999999999999e-05,
            1.2345678901234567e16,
            9999999999999998.0,
            1e22,
            -2.5e-10,
        ]
    ),
    st.integers(),
    st.integers(min_value=-(10**60), max_value=10**60),
)
sized_json = st.recursive(
    st.one_of(
        numbers,
        st.none(),
        st.booleans(),
        st.sampled_from(["1e+16", "x 2e-07 y", "é", "one-time", "C++", '"e+1"', "\\e-5"]),
        st.text(max_size=8).filter(lambda t: "\x00" not in t),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=4).filter(lambda t: "\x00" not in t), inner, max_size=4),
    ),
    max_leaves=12,
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=sized_json)
@example(value=[1e16] * 3)
@example(value={"a": [1e-7, {"b": 1.5e300}], "c": -0.0})
@example(value=[10**80, -(10**40), 1.0, 100.0])
def test_python_never_measures_a_payload_smaller_than_postgres(conn, value):
    payload = {"x": value}
    text = to_json_text(payload)
    utf8 = len(text.encode("utf-8"))
    pg = _pg_size(conn, text)
    py = jsonb_size(payload, text, utf8)
    assert py >= pg
    assert jsonb_text_size(text) == py
    if not _holds_negative_zero(value):  # -0.0 is printed 0.0: the one byte Python counts more
        assert py == pg
        # At the cap exactly, Python and SQL agree: one byte less and both refuse.
        check_job(
            tenant_id="a", origin="scheduled", payload=payload, kind="k", max_payload_bytes=pg
        )
        with pytest.raises(errors.PayloadTooLarge):
            check_job(
                tenant_id="a",
                origin="scheduled",
                payload=payload,
                kind="k",
                max_payload_bytes=pg - 1,
            )


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sign=st.sampled_from(["", "-"]),
    whole=st.from_regex(r"0|[1-9][0-9]{0,20}", fullmatch=True),
    fraction=st.one_of(st.just(""), st.from_regex(r"[0-9]{1,20}", fullmatch=True)),
    e=st.sampled_from(["e", "E"]),
    exponent=st.integers(-350, 350),
    exponent_sign=st.sampled_from(["", "+"]),
)
def test_numeric_text_length_is_postgres_printing_a_number(
    conn, sign, whole, fraction, e, exponent, exponent_sign
):
    token = f"{sign}{whole}{'.' if fraction else ''}{fraction}{e}"
    token += f"{exponent_sign if exponent >= 0 else ''}{exponent}"
    assert numeric_text_length(token) == _pg_size(conn, token)


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_payload_over_the_cap_as_postgres_prints_it_is_refused_before_sending(db_dsn, many):
    """The B3 repro: 560 kB as Python writes it, 1.5 MB as jsonb prints it."""
    text = to_json_text(EXPONENT_HEAVY)
    assert len(text) < 1_048_576
    with psycopg.connect(db_dsn) as conn:
        assert _pg_size(conn, text) > 1_048_576
        conn.rollback()
        conn.execute("CREATE TABLE public.mine (id int)")
        conn.execute("INSERT INTO public.mine VALUES (1)")
        sent_before = conn.info.transaction_status
        with pytest.raises(errors.PayloadTooLarge, match="over the cap"):
            if many:
                pgqueue.enqueue_many(
                    conn,
                    [
                        pgqueue.JobSpec("a", "scheduled", GOOD),
                        pgqueue.JobSpec("a", "scheduled", EXPONENT_HEAVY),
                    ],
                )
            else:
                pgqueue.enqueue(conn, tenant_id="a", origin="scheduled", payload=EXPONENT_HEAVY)
        assert conn.info.transaction_status == sent_before  # not aborted: nothing was sent
        conn.execute("INSERT INTO public.mine VALUES (2)")
        conn.commit()
        assert conn.execute("SELECT count(*) FROM public.mine").fetchone()[0] == 2
        assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()[0] == 0


def test_a_payload_under_the_cap_as_postgres_prints_it_is_stored(conn):
    """Exponent-form floats may also print shorter (1.2345678901234568e+16 → 17 digits)."""
    payload = {**GOOD, "x": [1.2345678901234567e16] * 40_000}
    text = to_json_text(payload)
    assert len(text) > 900_000 and _pg_size(conn, text) < 900_000
    settings_ = Settings(max_payload_bytes=900_000)
    conn.execute("SET pgqueue.max_payload_bytes = 900000")
    job_id = pgqueue.enqueue(
        conn, tenant_id="a", origin="scheduled", payload=payload, settings=settings_
    )
    assert job_id is not None


@pytest.mark.parametrize("tenant", ["\u200b", "  ", "\t", "\u2060", "\ufeff\u200d", "\u2800"])
@pytest.mark.parametrize(
    "write",
    [
        "SELECT pgqueue.tenant_set(%s, 'pro', NULL, NULL)",
        "SELECT pgqueue.ensure_tenant(%s)",
        "INSERT INTO pgqueue.tenants (tenant_id) VALUES (%s)",
    ],
)
def test_the_tenants_table_refuses_an_id_that_shows_nothing(conn, write, tenant):
    """Found by a fresh-machine trial: tenant_set and ensure_tenant stored ids of U+200B, a tab
    or spaces, which no command can name afterwards (every enqueue refused them already). The
    table's CHECK tenants_tenant_id_visible refuses them from any writer (23514), and nothing
    is stored; a visible id with an invisible character inside is taken."""
    before = conn.execute("SELECT count(*) FROM pgqueue.tenants").fetchone()
    with pytest.raises(psycopg.errors.CheckViolation, match="tenants_tenant_id_visible"):
        conn.execute(write, (tenant,))
    conn.rollback()
    assert conn.execute("SELECT count(*) FROM pgqueue.tenants").fetchone() == before
    if tenant == "\t":  # a control character: refused anywhere (the next test)
        return
    conn.execute(write, ("a" + tenant,))
    assert conn.execute(
        "SELECT count(*) FROM pgqueue.tenants WHERE tenant_id = %s", ("a" + tenant,)
    ).fetchone() == (1,)


@pytest.mark.parametrize(
    "tenant",
    ["esc\x1b[31mRED\x1b[0m", "\x1b]0;pwned\x07", "a\nb", "a\x9b", "a\u2028b", "\u202egnp.exe"],
)
@pytest.mark.parametrize(
    "write",
    [
        "SELECT pgqueue.tenant_set(%s, 'pro', NULL, NULL)",
        "SELECT pgqueue.ensure_tenant(%s)",
        "INSERT INTO pgqueue.tenants (tenant_id) VALUES (%s)",
    ],
)
def test_the_tenants_table_refuses_an_id_with_a_control_character(conn, write, tenant):
    """Found by a tester: tenant ids with ESC or OSC sequences, or a line break, reached the
    terminal; so did U+2028 (a row broken in two) and U+202E (a row reversed). The table's
    CHECK tenants_tenant_id_without_control refuses them from any writer (23514), and nothing
    is stored; a row stored before the CHECK (NOT VALID) stays."""
    before = conn.execute("SELECT count(*) FROM pgqueue.tenants").fetchone()
    with pytest.raises(psycopg.errors.CheckViolation, match="tenants_tenant_id_without_control"):
        conn.execute(write, (tenant,))
    conn.rollback()
    assert conn.execute("SELECT count(*) FROM pgqueue.tenants").fetchone() == before
    assert conn.execute(
        "SELECT convalidated FROM pg_constraint WHERE conname = 'tenants_tenant_id_without_control'"
    ).fetchone() == (False,)
