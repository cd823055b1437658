"""Autovacuum settings for a queue: vacuum pgqueue.jobs and the small hot tables early.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_SQL = Path(__file__).with_suffix(".sql")
_DOWN_SQL = Path(__file__).with_name("0009_autovacuum_down.sql")


def upgrade() -> None:
    op.execute(_SQL.read_text(encoding="utf-8"))


def downgrade() -> None:
    op.execute(_DOWN_SQL.read_text(encoding="utf-8"))
