"""One statement trigger per write on pgqueue.jobs (INSERT, UPDATE) instead of five.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_SQL = Path(__file__).with_suffix(".sql")
_DOWN_SQL = Path(__file__).with_name("0012_one_trigger_per_write_down.sql")


def upgrade() -> None:
    op.execute(_SQL.read_text(encoding="utf-8"))


def downgrade() -> None:
    op.execute(_DOWN_SQL.read_text(encoding="utf-8"))
