"""The schema has one source, the files of ``pgqueue/sql/schema``: a database migrated from
empty and one migrated by the old revision chain (``tests/fixtures/schema_0030.sql``, at 0030
with rows in every table) are the same schema after ``pgqueue migrate``, that database keeps
every row, and each function, trigger, view and table is defined by exactly one file."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgqueue.db import migrate, queries
from tests.db.schema_catalog import catalog

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "schema_0030.sql"

_BODY = re.compile(r"\$(\w*)\$.*?\$\1\$", re.S)
_COMMENT = re.compile(r"--[^\n]*")
_DEFINITIONS = {
    "function": re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+pgqueue\.(\w+)\s*\(", re.I),
    "view": re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?VIEW\s+pgqueue\.(\w+)", re.I),
    "trigger": re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?TRIGGER\s+(\w+)\s", re.I),
    "table": re.compile(r"\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?pgqueue\.(\w+)", re.I),
}
_IN_DATABASE = {
    "function": "SELECT proname FROM pg_proc WHERE pronamespace = 'pgqueue'::regnamespace",
    "view": "SELECT relname FROM pg_class "
    "WHERE relnamespace = 'pgqueue'::regnamespace AND relkind = 'v'",
    "trigger": "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
    "WHERE c.relnamespace = 'pgqueue'::regnamespace AND NOT t.tgisinternal",
    "table": "SELECT relname FROM pg_class WHERE relnamespace = 'pgqueue'::regnamespace "
    "AND relkind = 'r' AND relname <> 'alembic_version'",
}


def _load_0030(dsn: str) -> None:
    """Restore the 0030 dump into the empty database ``dsn`` (its grants name the roles that
    `pgqueue grant` creates: the caller makes sure they exist)."""
    with psycopg.connect(dsn) as conn:
        conn.execute(FIXTURE.read_text(encoding="utf-8").encode())


def _grant(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        queries.run(conn, "security_grant")


def _rows(
    dsn: str, columns: dict[str, list[str]] | None = None
) -> tuple[dict[str, tuple[int, str]], dict[str, list[str]]]:
    """Per table of the schema: its row count and an md5 of its rows in text form (only
    ``columns[table]`` when given: columns added later are left out), and its columns."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(_IN_DATABASE["table"]).fetchall()]
        found, names = {}, {}
        for table in tables:
            names[table] = [
                r[0]
                for r in conn.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass"
                    " AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                    (f"pgqueue.{table}",),
                )
            ]
            cols = (columns or names)[table] if table in (columns or names) else names[table]
            row = sql.SQL("ROW({})").format(
                sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(c)) for c in cols)
            )
            query = sql.SQL(
                "SELECT count(*), md5(coalesce(string_agg(({row})::text, E'\\n'"
                " ORDER BY ({row})::text), '')) FROM pgqueue.{table} t"
            ).format(row=row, table=sql.Identifier(table))
            count, digest = conn.execute(query).fetchone()  # type: ignore[misc]
            found[table] = (count, digest)
    return found, names


def test_migrate_from_empty_and_from_0030_give_the_same_catalog(db_dsn, empty_db_dsn):
    _grant(db_dsn)  # creates the roles the dump's grants name
    _load_0030(empty_db_dsn)
    migrate.upgrade(empty_db_dsn)
    _grant(empty_db_dsn)
    with psycopg.connect(db_dsn) as fresh, psycopg.connect(empty_db_dsn) as upgraded:
        assert migrate.check_schema(upgraded) == migrate.head_revision()
        want, got = catalog(fresh), catalog(upgraded)
    for kind in want:
        assert got[kind] == want[kind], kind
    assert len(want["functions"]) >= 61 and len(want["views"]) >= 7
    assert len(want["triggers"]) >= 12  # 11 of the migrations + `pgqueue grant`'s tenant scope


def test_every_trigger_function_has_a_trigger(db_dsn):
    """A trigger function runs only from a trigger: one that no trigger runs is dead code
    (found this session: queue_counts_on_insert, queue_counts_on_update, notify_jobs and
    job_charge_usage, leftovers of the revision chain before 0030, dropped by 0068). After
    `pgqueue grant`, whose jobs_tenant_scope has its trigger too."""
    _grant(db_dsn)
    with psycopg.connect(db_dsn) as conn:
        orphans = conn.execute(
            "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'pgqueue'::regnamespace"
            " AND p.prorettype = 'trigger'::regtype"
            " AND NOT EXISTS (SELECT FROM pg_trigger t WHERE t.tgfoid = p.oid) ORDER BY 1"
        ).fetchall()
    assert orphans == []


def test_a_fresh_schema_starts_with_its_rows(db_dsn):
    with psycopg.connect(db_dsn) as conn:
        weights = conn.execute(
            "SELECT t::text, pgqueue.tier_weight(t) FROM unnest(enum_range(NULL::pgqueue.tier)) t"
        ).fetchall()
        admission = conn.execute(
            "SELECT a.tier::text, a.max_queued, a.tenant_max_queued, a.policy"
            " FROM pgqueue.admission a ORDER BY a.tier"
        ).fetchall()
        leaders = conn.execute("SELECT name FROM pgqueue.leader_locks ORDER BY name").fetchall()
    assert weights == [("critical", 70), ("standard", 25), ("batch", 5)]
    assert admission == [(t, None, None, "reject") for t in ("critical", "standard", "batch")]
    assert leaders == [("prune",), ("rescue",)]


def test_upgrade_from_0030_keeps_every_row(db_dsn, empty_db_dsn):
    _grant(db_dsn)
    _load_0030(empty_db_dsn)
    before, columns = _rows(empty_db_dsn)
    migrate.upgrade(empty_db_dsn)
    after, _ = _rows(empty_db_dsn, columns)
    # 0042 (scheduler v2) drops the v1 scheduler's state; its queued jobs start unstamped
    dropped = {"deficits", "tier_state", "drr_inbox"}
    assert set(before) - set(after) == dropped
    assert {name: after[name] for name in set(before) - dropped} == {
        name: before[name] for name in set(before) - dropped
    }
    # tables added after 0030 start empty (0033: tenant_roles; 0036: the batches lane; 0042),
    # but 0041's leader_locks, with its two rows
    added = set(after) - set(before)
    assert {name: after[name][0] for name in added if after[name][0]} == {"leader_locks": 2}
    assert len(before) == 11
    assert all(count > 0 for count, _digest in before.values()), before
    assert before["jobs"][0] == 59


def _defined_in_files() -> dict[str, Counter[tuple[str, str]]]:
    """Per kind of object: (name, file) pairs, once per CREATE statement in the schema files
    (function bodies and comments left out, so only top-level statements count)."""
    found: dict[str, Counter[tuple[str, str]]] = {kind: Counter() for kind in _DEFINITIONS}
    for path in migrate.schema_files():
        text = _COMMENT.sub("", _BODY.sub("", path.read_text(encoding="utf-8")))
        for kind, pattern in _DEFINITIONS.items():
            for name in pattern.findall(text):
                found[kind][(name, path.name)] += 1
    return found


@pytest.mark.parametrize("kind", sorted(_DEFINITIONS))
def test_every_object_is_defined_by_exactly_one_schema_file(db_dsn, kind):
    with psycopg.connect(db_dsn) as conn:
        in_database = Counter(r[0] for r in conn.execute(_IN_DATABASE[kind]).fetchall())
    defined = _defined_in_files()[kind]
    assert in_database, kind
    for name, count in in_database.items():
        assert count == 1, f"{kind} {name}: {count} in the database (overloads?)"
        files = {(n, f): c for (n, f), c in defined.items() if n == name}
        assert list(files.values()) == [1], f"{kind} {name} is defined by {files or 'no file'}"
    assert {n for n, _f in defined} == set(in_database), kind


def test_the_schema_files_alone_give_the_migrated_function_bodies(db_dsn, empty_db_dsn):
    """A revision copies the whole new text of what it changes: a fresh database ends with
    the text of the last revision that wrote each function, which must be the text of its
    schema file (found this session: `pgqueue.cancel` kept a comment about v1's DRR pairs
    that its file had lost)."""
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA pgqueue")
        for path in migrate.schema_files():
            conn.execute(path.read_text(encoding="utf-8").encode())
    bodies = (
        "SELECT p.oid::regprocedure::text, p.prosrc FROM pg_proc p"
        " WHERE p.pronamespace = 'pgqueue'::regnamespace"
    )
    with psycopg.connect(db_dsn) as migrated, psycopg.connect(empty_db_dsn) as files:
        want = dict(files.execute(bodies).fetchall())
        got = dict(migrated.execute(bodies).fetchall())
    assert sorted(got) == sorted(want)
    assert [name for name in want if got[name] != want[name]] == []
