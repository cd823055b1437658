"""Queued counters updated in place on rows no one else holds, instead of one delta row per write.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

from pgqueue.db.sqltext import function_definition

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_SQL = Path(__file__).with_suffix(".sql")
_0006 = Path(__file__).with_name("0006_admission.sql")
#: The functions this revision replaces, restored from revision 0006 by the downgrade.
_REPLACED = ("queue_counts_on_insert", "queue_counts_on_update", "queue_counts_on_delete",
             "admission_check")  # fmt: skip


def upgrade() -> None:
    op.execute(_SQL.read_text(encoding="utf-8"))


def downgrade() -> None:
    for name in _REPLACED:
        op.execute(function_definition(_0006, name))
    op.execute("DROP FUNCTION pgqueue.queue_counts_add(pgqueue.tier[], text[], bigint[])")
