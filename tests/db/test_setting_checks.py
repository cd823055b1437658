"""A malformed ``pgqueue.*`` setting is one typed error (issue 28's loose end): SQLSTATE PQ012
naming the setting, its range and the value (``pgqueue.setting_value``), mapped to
:class:`pgqueue.errors.InvalidSetting`, never a cast's error ("invalid input syntax for type
integer") from deep inside the claim."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import pgqueue
from pgqueue import JobSpec
from pgqueue.errors import InvalidSetting, from_sqlstate

SCHEMA = Path(pgqueue.__file__).resolve().parent / "sql" / "schema"
TIERS = ("critical", "standard", "batch")

#: A setting read as pgqueue.setting('name', ...) or pgqueue.setting_value('name', ...), or
#: built from a prefix, the tier and maybe a suffix ('slo_p99_' || tier::text || '_seconds').
_READ = re.compile(
    r"pgqueue\.setting(?:_value)?\(\s*'(\w+)'(\s*\|\|\s*\w+::text(?:\s*\|\|\s*'(\w+)')?)?"
)


def _numeric_settings() -> set[str]:
    """Every numeric setting the schema's SQL reads (base_quantum's through pgqueue.setting
    too), found in the text of the schema files."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(SCHEMA.glob("*.sql")))
    names: set[str] = set()
    for match in _READ.finditer(text):
        name, by_tier, suffix = match.groups()
        if by_tier is None:
            names.add(name)
        else:
            names.update(f"{name}{tier}{suffix or ''}" for tier in TIERS)
    return names


def test_every_numeric_setting_the_sql_reads_is_found() -> None:
    names = _numeric_settings()
    assert {
        "stamp_horizon_rounds",
        "stamp_slice_flows",
        "stamp_arrival_margin",
        "default_quantum",
        "max_payload_bytes",
        "tier_weight_critical",
        "slo_p99_batch_seconds",
        "ratelimit_trunk_reserve",
        "ratelimit_trunk_reserve_jobs",
        "default_daily_budget",
    } <= names
    assert len(names) == 22


@pytest.mark.parametrize("raw", ["abc", "NaN", "Infinity", "-Infinity", "1e20", "-1", "1e99999"])
def test_a_malformed_setting_raises_pq012_naming_it(conn: psycopg.Connection, raw: str) -> None:
    """Every numeric setting the SQL reads: a value that is not a number in its range raises
    PQ012 naming the setting and the value (before: 22P02 for 'abc', a silent NaN, a float
    overflow, or a negative horizon taken as it was)."""
    for name in sorted(_numeric_settings()):
        conn.execute("SAVEPOINT s")
        conn.execute("SELECT set_config(%s, %s, true)", (f"pgqueue.{name}", raw))
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("SELECT pgqueue.setting(%s, 1)", (name,))
        assert caught.value.sqlstate == "PQ012", (name, raw, caught.value.sqlstate)
        message = caught.value.diag.message_primary or ""
        expected = rf"pgqueue\.{name} must be (an integer|a number) from \S+ to \S+, got "
        assert re.fullmatch(expected + re.escape(f"'{raw}'"), message), message
        conn.execute("ROLLBACK TO SAVEPOINT s")


def test_good_values_and_defaults(conn: psycopg.Connection) -> None:
    conn.execute("SET pgqueue.stamp_horizon_rounds = ' 7 '")
    conn.execute("SET pgqueue.stamp_arrival_margin = '.25'")
    conn.execute("SET pgqueue.tier_weight_batch = '1e1'")
    conn.execute("SET pgqueue.default_daily_budget = ''")
    got = conn.execute(
        "SELECT pgqueue.setting('stamp_horizon_rounds', 4),"
        " pgqueue.setting('stamp_arrival_margin', 0.1), pgqueue.setting('tier_weight_batch', 5),"
        " pgqueue.setting('default_daily_budget', 100000), pgqueue.setting('demotion_seconds', 300)"
    ).fetchone()
    assert got == (7.0, 0.25, 10.0, 100000.0, 300.0)


def test_a_fraction_where_a_count_is_needed(conn: psycopg.Connection) -> None:
    conn.execute("SET pgqueue.stamp_slice_flows = '2.5'")
    with pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT pgqueue.setting('stamp_slice_flows', 64)")
    assert caught.value.sqlstate == "PQ012"
    assert "must be an integer from 1 to 1000000, got '2.5'" in str(caught.value)


def test_a_name_not_in_the_list_is_refused(conn: psycopg.Connection) -> None:
    conn.execute("SET pgqueue.no_such_setting = '1'")
    with pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT pgqueue.setting('no_such_setting', 1)")
    assert caught.value.sqlstate == "PQ012"


@pytest.mark.parametrize("raw", ["abc", "NaN", "1e20", "-1"])
def test_the_claim_names_a_malformed_horizon(conn: psycopg.Connection, raw: str) -> None:
    """The case of the issue: the claim failed with "invalid input syntax for type integer"
    (or took NaN, 1e20 or -1 as a horizon)."""
    pgqueue.enqueue_many(conn, [JobSpec("t", "scheduled", {}, kind="pgqueue.noop")])
    conn.commit()
    conn.execute("SELECT set_config('pgqueue.stamp_horizon_rounds', %s, false)", (raw,))
    with pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT * FROM pgqueue.claim_admitted(10, 'w', 30, '{}')").fetchall()
    conn.rollback()
    assert caught.value.sqlstate == "PQ012"
    assert caught.value.diag.message_primary == (
        f"pgqueue.stamp_horizon_rounds must be an integer from 0 to 1000, got '{raw}'"
    )
    mapped = from_sqlstate(caught.value.sqlstate, caught.value.diag.message_primary or "")
    assert isinstance(mapped, InvalidSetting)
    conn.execute("RESET pgqueue.stamp_horizon_rounds")
    assert len(conn.execute("SELECT * FROM pgqueue.claim(10, 'w', 30)").fetchall()) == 1


def test_an_unknown_tier_policy_is_the_same_error(conn: psycopg.Connection) -> None:
    conn.execute("SET pgqueue.tier_policy = 'lottery'")
    with pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT * FROM pgqueue.claim(1, 'w', 30)").fetchall()
    assert caught.value.sqlstate == "PQ012"
    assert "pgqueue.tier_policy must be weighted, probabilistic or strict" in str(caught.value)


def test_enqueue_with_a_malformed_payload_cap(db_dsn: str) -> None:
    """max_payload_bytes (read for producers from the database's settings only) '1e11' failed
    every enqueue with a cast's error; now Python's enqueue raises InvalidSetting."""
    with psycopg.connect(db_dsn, autocommit=True) as admin:
        name = admin.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        admin.execute(
            sql.SQL("ALTER DATABASE {} SET pgqueue.max_payload_bytes = '1e11'").format(
                sql.Identifier(name)
            )
        )
    with psycopg.connect(db_dsn) as conn:
        with pytest.raises(InvalidSetting, match=r"pgqueue\.max_payload_bytes must be"):
            pgqueue.enqueue(
                conn, tenant_id="t", origin="scheduled", payload={}, kind="pgqueue.noop"
            )
        conn.rollback()
        with pytest.raises(InvalidSetting):
            pgqueue.enqueue_many(conn, [JobSpec("t", "scheduled", {}, kind="pgqueue.noop")])


def test_a_huge_demotion_threshold_switches_demotion_off(conn: psycopg.Connection) -> None:
    """The demo's FIFO arm sets pgqueue.demotion_throttle_threshold to 1e9 (one tenant carries
    everyone's throttles there); a range ending at 1e6 failed every outcome it recorded."""
    got = conn.execute(
        "SELECT pgqueue.setting_value('demotion_throttle_threshold', '1000000000', 5)"
    ).fetchone()
    assert got == (1e9,)
