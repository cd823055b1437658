"""Alembic environment: one transaction per run, serialised by a Postgres advisory lock.

Concurrent ``pgqueue migrate`` runs on a fresh database are safe: each takes the transaction-
scoped advisory lock before alembic reads ``pgqueue.alembic_version``, so the second one finds
the schema at head and does nothing.
"""

from __future__ import annotations

import psycopg
from alembic import context
from sqlalchemy import create_engine, pool, text

#: Key of the advisory lock that serialises migrations (any stable 64-bit number).
MIGRATION_LOCK_KEY = 0x7067_7175_6575_6501  # "pgqueue" + 1

config = context.config
dsn: str = config.attributes["dsn"]


def run_migrations_online() -> None:
    engine = create_engine(
        "postgresql+psycopg://", creator=lambda: psycopg.connect(dsn), poolclass=pool.NullPool
    )
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            version_table_schema="pgqueue",
            transactional_ddl=True,
        )
        with context.begin_transaction():
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            connection.execute(text("CREATE SCHEMA IF NOT EXISTS pgqueue"))
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("pgqueue migrations run online only: use `pgqueue migrate`")
run_migrations_online()
