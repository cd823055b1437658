"""Queued counters updated in place on rows no one else holds, instead of one delta row per write.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_SQL = Path(__file__).with_suffix(".sql")
_DOWN_SQL = Path(__file__).with_name("0007_counters_in_place_down.sql")


def upgrade() -> None:
    op.execute(_SQL.read_text(encoding="utf-8"))


def downgrade() -> None:
    op.execute(_DOWN_SQL.read_text(encoding="utf-8"))
