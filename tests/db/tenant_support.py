"""A tenant delete racing an uncommitted enqueue: shared by the tests of every enqueue path."""

from __future__ import annotations

import threading
from typing import Any

import psycopg


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
