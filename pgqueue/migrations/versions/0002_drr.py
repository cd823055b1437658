"""Tier pick and per-tenant Deficit Round Robin in the claim; claim_order and fairness views.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_HERE = Path(__file__).with_suffix(".sql")


def upgrade() -> None:
    op.execute(_HERE.read_text(encoding="utf-8"))


def downgrade() -> None:
    op.execute(
        """
        DROP VIEW IF EXISTS pgqueue.fairness, pgqueue.tenant_service, pgqueue.claim_order;
        DROP FUNCTION IF EXISTS pgqueue.fairness_in, pgqueue.tenant_service_in,
            pgqueue.claim_preview, pgqueue.claim, pgqueue.drr_dispatch, pgqueue.tier_policy,
            pgqueue.tenant_quantum, pgqueue.plan_quantum, pgqueue.base_quantum,
            pgqueue.refill_offset;
        DROP TRIGGER IF EXISTS jobs_drr_requeue ON pgqueue.jobs;
        DROP TRIGGER IF EXISTS jobs_drr_insert ON pgqueue.jobs;
        DROP FUNCTION IF EXISTS pgqueue.drr_note_requeued, pgqueue.drr_note_inserted;
        DROP INDEX IF EXISTS pgqueue.jobs_started_at_idx, pgqueue.jobs_queued_tenant_head_idx;
        DROP TABLE IF EXISTS pgqueue.drr_inbox, pgqueue.deficits, pgqueue.tier_state;
        """
    )
