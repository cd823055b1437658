"""Admission control on enqueue: per-tier and per-tenant caps, reject/block/drop, exact counters.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_SQL = Path(__file__).with_suffix(".sql")
_DOWN_SQL = Path(__file__).with_name("0006_admission_down.sql")


def upgrade() -> None:
    op.execute(_SQL.read_text(encoding="utf-8"))


def downgrade() -> None:
    op.execute(
        """
        DROP VIEW IF EXISTS pgqueue.admission_status;
        DROP TRIGGER IF EXISTS jobs_queue_counts_insert ON pgqueue.jobs;
        DROP TRIGGER IF EXISTS jobs_queue_counts_update ON pgqueue.jobs;
        DROP TRIGGER IF EXISTS jobs_queue_counts_delete ON pgqueue.jobs;
        DROP TRIGGER IF EXISTS jobs_queue_counts_truncate ON pgqueue.jobs;
        DROP FUNCTION IF EXISTS pgqueue.enqueue_many, pgqueue.enqueue,
            pgqueue.try_enqueue_many, pgqueue.try_enqueue, pgqueue.raise_queue_full,
            pgqueue.admission_set, pgqueue.admission_check, pgqueue.queue_counts_compact,
            pgqueue.queue_counts_on_truncate, pgqueue.queue_counts_rebuild,
            pgqueue.queue_counts_on_delete, pgqueue.queue_counts_on_update,
            pgqueue.queue_counts_on_insert;
        DROP TYPE IF EXISTS pgqueue.enqueue_batch_item;
        DROP TABLE IF EXISTS pgqueue.queue_counts, pgqueue.admission;
        ALTER TABLE pgqueue.tenants DROP COLUMN IF EXISTS max_queued;
        DROP INDEX IF EXISTS pgqueue.jobs_dedupe_live_idx;
        ALTER TABLE pgqueue.jobs DROP COLUMN IF EXISTS dedupe_key;
        """
    )
    op.execute(_DOWN_SQL.read_text(encoding="utf-8"))
