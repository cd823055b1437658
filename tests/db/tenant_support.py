"""Shared by the tenant tests: a tenant delete racing an uncommitted enqueue (every enqueue
path), and a producer role bound to one tenant (the hostile tenant's tests)."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgqueue.db import queries


def delete_after_commit(
    dsn: str, producer: psycopg.Connection[Any], tenant: str
) -> Exception | None:
    """Start deleting ``tenant`` on a connection of its own while ``producer`` holds an
    uncommitted job of it; check that the delete waits (the enqueue's ``FOR KEY SHARE``), commit
    ``producer``, and return what the delete raised (None when it deleted the tenant)."""
    outcome: list[Exception | None] = []

    def delete() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as d:
                d.execute("DELETE FROM pgqueue.tenants WHERE tenant_id = %s", (tenant,))
            outcome.append(None)
        except psycopg.Error as exc:
            outcome.append(exc)

    deleter = threading.Thread(target=delete)
    deleter.start()
    deleter.join(timeout=1.0)
    assert deleter.is_alive()  # blocked on the producer's lock, not racing past it
    producer.commit()
    deleter.join(timeout=30)
    assert len(outcome) == 1
    return outcome[0]


@contextlib.contextmanager
def bound_producer(db_dsn: str, tenant: str) -> Iterator[str]:
    """`pgqueue grant`, then a login role of ``pgqueue_producer`` bound to ``tenant`` in
    ``pgqueue.tenant_roles`` (a tenant's own role); yields its DSN and drops it after."""
    name = f"pq_{tenant}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        queries.run(conn, "security_grant")
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE pgqueue_producer").format(sql.Identifier(name))
        )
        conn.execute("INSERT INTO pgqueue.tenant_roles VALUES (%s, %s)", (name, tenant))
    try:
        yield make_conninfo(db_dsn, user=name)
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
