"""Fast enqueue: set-based batch validation, inlinable rules, one jsonb array per batch.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

from pgqueue.db.sqltext import function_definition

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_SQL = Path(__file__).with_suffix(".sql")
#: What this revision replaces, restored by the downgrade from the revisions that made it.
_REPLACED = (
    ("0001_initial.sql", "estimate_input_tokens"),
    ("0006_admission.sql", "try_enqueue"),
    ("0006_admission.sql", "enqueue_many"),
)


def upgrade() -> None:
    op.execute(_SQL.read_text(encoding="utf-8"))


def downgrade() -> None:
    # Put back the functions that read the new ones, then drop the new ones.
    for sql_file, name in _REPLACED:
        op.execute(function_definition(Path(__file__).with_name(sql_file), name))
    op.execute(
        """
        DROP FUNCTION IF EXISTS pgqueue.try_enqueue_batch(text[], text[], jsonb,
                                                          double precision[], text[]);
        DROP FUNCTION IF EXISTS pgqueue.job_is_valid(text, text, jsonb, double precision, text,
                                                     integer, bigint);
        DROP FUNCTION IF EXISTS pgqueue.input_token_estimate(jsonb);
        """
    )
