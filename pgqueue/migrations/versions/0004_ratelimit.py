"""The shared provider rate limiter (token buckets per model) and the provider cooldown.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_SQL = Path(__file__).with_suffix(".sql")


def upgrade() -> None:
    op.execute(_SQL.read_text(encoding="utf-8"))


def downgrade() -> None:
    op.execute(
        """
        DROP VIEW IF EXISTS pgqueue.rate_limit_state;
        DROP FUNCTION IF EXISTS pgqueue.claim_admitted, pgqueue.ratelimit_cooldown, pgqueue.ratelimit_observe,
            pgqueue.ratelimit_try_take, pgqueue.ratelimit_save, pgqueue.ratelimit_row;
        DROP TABLE IF EXISTS pgqueue.rate_limits;
        """
    )
