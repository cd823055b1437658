"""Per-day usage ledger, daily budgets and automatic demotion (throttles or budget).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_SQL = Path(__file__).with_suffix(".sql")


def upgrade() -> None:
    op.execute(_SQL.read_text(encoding="utf-8"))


def downgrade() -> None:
    op.execute(
        """
        ALTER TABLE pgqueue.tenants DROP CONSTRAINT IF EXISTS tenants_quantum_finite,
            DROP CONSTRAINT IF EXISTS tenants_plan_name;
        DROP INDEX IF EXISTS pgqueue.demotions_expiry_idx;
        DROP TRIGGER IF EXISTS jobs_charge_usage ON pgqueue.jobs;
        DROP TRIGGER IF EXISTS throttle_events_demote ON pgqueue.throttle_events;
        DROP FUNCTION IF EXISTS pgqueue.job_charge_usage, pgqueue.throttle_event_demote,
            pgqueue.demotion_check, pgqueue.budget_day, pgqueue.setting;
        DROP TABLE IF EXISTS pgqueue.usage_daily;
        """
    )
