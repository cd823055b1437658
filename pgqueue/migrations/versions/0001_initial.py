"""Initial schema: jobs, tenants, throttle events, demotions, enqueue functions, NOTIFY trigger.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_HERE = Path(__file__).with_suffix(".sql")


def upgrade() -> None:
    op.execute(_HERE.read_text(encoding="utf-8"))


def downgrade() -> None:
    # Drops every object but the schema itself, which holds alembic's version table.
    op.execute(
        """
        DROP TRIGGER IF EXISTS jobs_notify_insert ON pgqueue.jobs;
        DROP FUNCTION IF EXISTS pgqueue.notify_jobs, pgqueue.enqueue_many, pgqueue.enqueue,
            pgqueue.is_demoted, pgqueue.ensure_tenant, pgqueue.validate_job, pgqueue.job_cost,
            pgqueue.payload_max_tokens, pgqueue.estimate_input_tokens, pgqueue.classify;
        DROP TABLE IF EXISTS pgqueue.demotions, pgqueue.throttle_events, pgqueue.jobs,
            pgqueue.tenants;
        DROP TYPE IF EXISTS pgqueue.job_state, pgqueue.origin, pgqueue.tier;
        """
    )
