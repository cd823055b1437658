"""Public views for dashboards: queue depth and latency against the SLOs.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_SQL = Path(__file__).with_suffix(".sql")


def upgrade() -> None:
    op.execute(_SQL.read_text(encoding="utf-8"))


def downgrade() -> None:
    op.execute(
        """
        DROP VIEW IF EXISTS pgqueue.latency_slo, pgqueue.queue_depth;
        DROP FUNCTION IF EXISTS pgqueue.latency_slo_in, pgqueue.slo_p99_seconds;
        """
    )
