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
