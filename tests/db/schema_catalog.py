"""The ``pgqueue`` schema as the catalog describes it, for comparing two databases.

``catalog(conn)`` reads every table, column, constraint, index, view, trigger, function, type,
comment, policy and grant of the schema (``alembic_version`` aside) into plain rows; function
bodies are compared without their SQL comments and with whitespace collapsed, since the files
under ``pgqueue/sql/schema`` may reword a comment without changing the code.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg

_QUERIES = {
    "columns": """
        SELECT c.relname, c.relkind, a.attname,
               row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum) AS position,
               format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity, a.attgenerated,
               pg_get_expr(d.adbin, d.adrelid)
        FROM pg_class c
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'pgqueue'::regnamespace AND c.relname <> 'alembic_version'
          AND c.relkind IN ('r', 'v', 'c')
        ORDER BY 1, 4""",
    "relations": """
        SELECT c.relname, c.relkind, c.reloptions, c.relrowsecurity, c.relacl::text[],
               obj_description(c.oid, 'pg_class')
        FROM pg_class c
        WHERE c.relnamespace = 'pgqueue'::regnamespace AND c.relname NOT LIKE 'alembic_version%'
        ORDER BY 1""",
    "column_comments": """
        SELECT c.relname, a.attname, col_description(c.oid, a.attnum)
        FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
        WHERE c.relnamespace = 'pgqueue'::regnamespace
          AND col_description(c.oid, a.attnum) IS NOT NULL
        ORDER BY 1, 2""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
        FROM pg_constraint
        WHERE connamespace = 'pgqueue'::regnamespace AND conrelid <> 0
          AND conrelid <> 'pgqueue.alembic_version'::regclass
        ORDER BY 1, 2""",
    "indexes": """
        SELECT indexname, pg_get_indexdef(format('pgqueue.%I', indexname)::regclass)
        FROM pg_indexes
        WHERE schemaname = 'pgqueue' AND tablename <> 'alembic_version'
        ORDER BY 1""",
    "views": """
        SELECT c.relname, pg_get_viewdef(c.oid)
        FROM pg_class c
        WHERE c.relnamespace = 'pgqueue'::regnamespace AND c.relkind = 'v'
        ORDER BY 1""",
    "triggers": """
        SELECT t.tgrelid::regclass::text, t.tgname, pg_get_triggerdef(t.oid), t.tgenabled
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = 'pgqueue'::regnamespace AND NOT t.tgisinternal
        ORDER BY 1, 2""",
    "functions": """
        SELECT p.oid::regprocedure::text, pg_get_function_arguments(p.oid),
               pg_get_function_result(p.oid), l.lanname, p.prokind, p.provolatile,
               p.proparallel, p.prosecdef, p.proisstrict, p.proleakproof, p.proconfig,
               p.procost, p.prorows, p.proacl::text[], p.prosrc
        FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
        WHERE p.pronamespace = 'pgqueue'::regnamespace
        ORDER BY 1""",
    "types": """
        SELECT t.typname, t.typtype,
               array(SELECT e.enumlabel FROM pg_enum e WHERE e.enumtypid = t.oid
                     ORDER BY e.enumsortorder)::text[]
        FROM pg_type t
        WHERE t.typnamespace = 'pgqueue'::regnamespace AND t.typtype IN ('e', 'c')
          AND t.typname NOT LIKE 'alembic_version%'
        ORDER BY 1""",
    "policies": """
        SELECT tablename, policyname, permissive, roles::text[], cmd, qual, with_check
        FROM pg_policies WHERE schemaname = 'pgqueue'
        ORDER BY 1, 2""",
    "schema": """
        SELECT nspacl::text[] FROM pg_namespace WHERE nspname = 'pgqueue'""",
}

_COMMENT = re.compile(r"--[^\n]*")


def normalise_body(source: str) -> str:
    """A function body without ``--`` comments and with runs of whitespace made one space."""
    return " ".join(_COMMENT.sub(" ", source).split())


def catalog(conn: psycopg.Connection[Any]) -> dict[str, list[tuple[Any, ...]]]:
    """Every part of the ``pgqueue`` schema as rows, per kind of object (see module doc)."""
    found: dict[str, list[tuple[Any, ...]]] = {}
    for kind, query in _QUERIES.items():
        rows = conn.execute(query).fetchall()
        if kind == "functions":
            rows = [(*row[:-1], normalise_body(row[-1])) for row in rows]
        found[kind] = rows
    return found
