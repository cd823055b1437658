"""Inputs a fault run found accepted (issue 32, defect 11), decided here: ``sla_seconds`` of
-0.0 is 0 (stored as 0, never "-0"); 2**64 and 2**64 + 1 are refused (at most ten years; they
were stored as the same double); a control character such as U+0001 in a dedupe key is
refused. Each refusal is a typed error and stores nothing."""

from __future__ import annotations

import math

import psycopg
import pytest

import pgqueue
from pgqueue import errors
from pgqueue.validation import MAX_SLA_SECONDS, check_dedupe_key, check_sla

PAYLOAD = {"x": 1}


def _enqueue(conn: psycopg.Connection[tuple[object, ...]], **kwargs: object) -> int:
    fields: dict[str, object] = {
        "tenant_id": "t",
        "origin": "scheduled",
        "payload": PAYLOAD,
        "kind": "custom",
        **kwargs,
    }
    return pgqueue.enqueue(conn, **fields)  # type: ignore[arg-type]


def test_negative_zero_sla_is_stored_as_zero(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    assert math.copysign(1.0, check_sla(-0.0)) == 1.0
    job_id = _enqueue(conn, sla_seconds=-0.0)
    row = conn.execute(
        "SELECT sla_seconds, sla_seconds::text, priority::text FROM pgqueue.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    assert math.copysign(1.0, float(row[0])) == 1.0  # type: ignore[arg-type]
    assert row[1:] == ("0", "standard")


@pytest.mark.parametrize("sla", [2**64, 2**64 + 1, float(2**64), MAX_SLA_SECONDS + 1, 1e300])
def test_an_sla_beyond_ten_years_is_refused_and_nothing_stored(
    conn: psycopg.Connection[tuple[object, ...]], sla: float
) -> None:
    with pytest.raises(errors.InvalidSla, match="at most 315,576,000"):
        _enqueue(conn, sla_seconds=sla)
    assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (0,)


def test_the_longest_sla_is_accepted(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    assert check_sla(MAX_SLA_SECONDS) == MAX_SLA_SECONDS
    _enqueue(conn, sla_seconds=MAX_SLA_SECONDS)


@pytest.mark.parametrize("key", ["a\x01b", "\x1f", "tab\there", "new\nline", "del\x7f", "\x85"])
def test_a_control_character_in_a_dedupe_key_is_refused(
    conn: psycopg.Connection[tuple[object, ...]], key: str
) -> None:
    with pytest.raises(errors.InvalidArgument, match="control character"):
        _enqueue(conn, dedupe_key=key)
    assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (0,)


def test_printable_dedupe_keys_are_kept() -> None:
    for key in ("order-42", "a b", "ünïcødé ✓", "x" * 256):
        assert check_dedupe_key(key) == key
    with pytest.raises(errors.NulCharacter):
        check_dedupe_key("a\x00")


# --- the SQL entry points refuse the same (revision 0033) -----------------------------------

DEEP = '{"d": ' + "[" * 5000 + "]" * 5000 + "}"
JUST_TOO_DEEP = '{"d": ' + "[" * 511 + "1" + "]" * 511 + "}"  # the 1 at level 512
DEEP_ENOUGH = '{"d": ' + "[" * 510 + "1" + "]" * 510 + "}"  # the deepest value at level 511
DIGITS = '{"n": 1' + "0" * 5000 + "}"
DIGITS_OK = '{"n": -1' + "0" * 4299 + ', "s": "' + "9" * 5000 + '", "f": 0.' + "1" * 5000 + "}"


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (DEEP, "nested 512 levels deep or more"),
        (JUST_TOO_DEEP, "nested 512 levels deep or more"),
        (DIGITS, "an integer of more than 4300 digits"),
    ],
)
def test_sql_enqueue_refuses_what_python_cannot_decode(
    conn: psycopg.Connection[tuple[object, ...]], payload: str, problem: str
) -> None:
    """Issue 32, defect 1: these were accepted, and crashed every worker that claimed them."""
    for call in (
        "SELECT pgqueue.enqueue('b', 'user_action', %s::jsonb, NULL, 'k')",
        "SELECT pgqueue.enqueue_many(ARRAY['b'], ARRAY['user_action'], ARRAY[%s::jsonb],"
        " NULL, ARRAY['k'])",
    ):
        with pytest.raises(psycopg.Error, match=problem) as caught:
            conn.execute(call, (payload,))
        assert caught.value.sqlstate == "PQ001"
        conn.rollback()
    assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (0,)


def test_sql_and_python_take_the_same_payloads_at_the_edges(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    import json

    for text in (DEEP_ENOUGH, DIGITS_OK):
        conn.execute("SELECT pgqueue.enqueue('b', 'user_action', %s::jsonb, NULL, 'k')", (text,))
        _enqueue(conn, payload=json.loads(text))
    for text in (JUST_TOO_DEEP,):
        with pytest.raises(errors.InvalidPayload, match="512 levels"):
            _enqueue(conn, payload=json.loads(text))
    assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (4,)


@pytest.mark.parametrize("sla", ["-0", "0"])
def test_sql_stores_negative_zero_sla_as_zero(
    conn: psycopg.Connection[tuple[object, ...]], sla: str
) -> None:
    conn.execute(f"SELECT pgqueue.enqueue('b', 'scheduled', '{{}}', {sla}::float8, 'k')")
    conn.execute(
        f"SELECT pgqueue.enqueue_many(ARRAY['b'], ARRAY['scheduled'], ARRAY['{{}}'::jsonb],"
        f" ARRAY[{sla}::float8], ARRAY['k'])"
    )
    conn.execute(
        f"SELECT pgqueue.enqueue_many(ARRAY['b', 'b'], ARRAY['scheduled', 'scheduled'],"
        f" ARRAY['{{}}', '{{}}']::jsonb[], ARRAY[{sla}::float8, 1], ARRAY['k', 'k'])"
    )
    rows = conn.execute("SELECT DISTINCT sla_seconds::text FROM pgqueue.jobs ORDER BY 1").fetchall()
    assert rows == [("0",), ("1",)]


@pytest.mark.parametrize("sla", ["18446744073709551616", "18446744073709551617", "315576001"])
def test_sql_refuses_an_sla_beyond_ten_years(
    conn: psycopg.Connection[tuple[object, ...]], sla: str
) -> None:
    with pytest.raises(psycopg.Error, match="at most 315576000") as caught:
        conn.execute(f"SELECT pgqueue.enqueue('b', 'scheduled', '{{}}', {sla}, 'k')")
    assert caught.value.sqlstate == "PQ005"


def test_sql_refuses_a_control_character_in_a_dedupe_key(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    with pytest.raises(psycopg.Error, match="control character") as caught:
        conn.execute(
            "SELECT pgqueue.enqueue('b', 'scheduled', '{}', NULL, 'k', dedupe_key => %s)",
            ("a\x01b",),
        )
    assert caught.value.sqlstate == "PQ009"
