"""Fast enqueue: set-based batch validation, inlinable rules, one jsonb array per batch.

Revision ID: 0008
Revises: 0007 (0006 until revision 0007 is merged: flip ``down_revision`` below)
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0008"
down_revision = "0007"  # TODO(lead): "0007" once revision 0007 is merged
branch_labels = None
depends_on = None

_SQL = Path(__file__).with_suffix(".sql")
_DOWN_SQL = Path(__file__).with_name("0008_fast_enqueue_down.sql")


def upgrade() -> None:
    op.execute(_SQL.read_text(encoding="utf-8"))


def downgrade() -> None:
    # Put back the functions that read the new ones, then drop the new ones.
    op.execute(_DOWN_SQL.read_text(encoding="utf-8"))
    op.execute(
        """
        DROP FUNCTION IF EXISTS pgqueue.try_enqueue_batch(text[], text[], jsonb,
                                                          double precision[], text[]);
        DROP FUNCTION IF EXISTS pgqueue.job_is_valid(text, text, jsonb, double precision, text,
                                                     integer, bigint);
        DROP FUNCTION IF EXISTS pgqueue.input_token_estimate(jsonb);
        """
    )
