"""The only module that executes SQL: named queries loaded from ``pgqueue/sql/queries/*.sql``.

Each statement sits under a header ``-- name: <entity_verb> :<cardinality>`` with psycopg
named parameters (``%(name)s``); cardinality ``:one | :many | :exec | :execrows`` picks how the
result is read. The sync (:func:`run`) and async (:func:`arun`) runners share the same text,
so there is one copy of every statement.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal, cast

import psycopg
from psycopg.rows import dict_row

Cardinality = Literal["one", "many", "exec", "execrows"]
Row = dict[str, Any]

_HEADER = re.compile(
    r"^--\s*name:\s*(?P<name>[a-z_][a-z0-9_]*)\s*:(?P<card>one|many|exec|execrows)\s*$"
)


@dataclass(frozen=True, slots=True)
class Query:
    """One named statement: its name, SQL text and result cardinality."""

    name: str
    sql: str
    cardinality: Cardinality
    source: str


def parse_queries(text: str, source: str) -> dict[str, Query]:
    """Split a ``.sql`` file into its named statements.

    Raises:
        ValueError: a statement has no header, or a name appears twice.
    """
    found: dict[str, Query] = {}
    name: str | None = None
    card: Cardinality = "exec"
    lines: list[str] = []

    def flush() -> None:
        body = "\n".join(lines).strip()
        if name is None:
            if body and not all(line.startswith("--") for line in body.splitlines()):
                raise ValueError(f"{source}: SQL before the first '-- name:' header")
            return
        if not body:
            raise ValueError(f"{source}: query {name} is empty")
        if name in found:
            raise ValueError(f"{source}: query {name} defined twice")
        found[name] = Query(name, body.rstrip(";"), card, source)

    for line in text.splitlines():
        match = _HEADER.match(line.strip())
        if match:
            flush()
            name = match["name"]
            card = cast(Cardinality, match["card"])
            lines = []
        else:
            lines.append(line)
    flush()
    return found


@cache
def all_queries() -> dict[str, Query]:
    """Every named query shipped in the package, by name (loaded once per process).

    Raises:
        ValueError: two files define the same name.
    """
    merged: dict[str, Query] = {}
    folder = resources.files("pgqueue") / "sql" / "queries"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        for qname, query in parse_queries(entry.read_text(encoding="utf-8"), entry.name).items():
            if qname in merged:
                raise ValueError(
                    f"query {qname} defined in {merged[qname].source} and {entry.name}"
                )
            merged[qname] = query
    return merged


def query(name: str) -> Query:
    """The named query. Raises ``KeyError`` naming the missing query."""
    try:
        return all_queries()[name]
    except KeyError:
        raise KeyError(f"no SQL query named {name!r} in pgqueue/sql/queries") from None


def run(conn: psycopg.Connection[Any], name: str, params: Mapping[str, Any] | None = None) -> Any:
    """Execute the named query on a sync connection.

    Returns a dict row or None (``:one``), a list of dict rows (``:many``), the row count
    (``:execrows``) or None (``:exec``). Database errors propagate as ``psycopg.Error``.
    """
    q = query(name)
    with conn.cursor(row_factory=dict_row) as cur:
        # bytes: the text is static, from the file; no parameters = no placeholder parsing
        cur.execute(q.sql.encode(), params or None)
        if q.cardinality == "one":
            return cur.fetchone()
        if q.cardinality == "many":
            return cur.fetchall()
        if q.cardinality == "execrows":
            return cur.rowcount
        return None


async def arun(
    conn: psycopg.AsyncConnection[Any],
    name: str,
    params: Mapping[str, Any] | None = None,
    *,
    prepare: bool | None = None,
) -> Any:
    """Execute the named query on an async connection; results as in :func:`run`.

    ``prepare=False`` for a statement the server cannot prepare (``VACUUM``); None lets
    psycopg prepare a statement once it has run a few times.
    """
    q = query(name)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(q.sql.encode(), params or None, prepare=prepare)
        if q.cardinality == "one":
            return await cur.fetchone()
        if q.cardinality == "many":
            return await cur.fetchall()
        if q.cardinality == "execrows":
            return cur.rowcount
        return None
