"""A queued job moved to another tenant tells the scheduler about that tenant.

``jobs_drr_requeue`` put a (tier, tenant) pair in the DRR inbox when an update made a job
queued, moved it to another tier, or made it due sooner, but not when an ``UPDATE`` moved a
queued job to another tenant. A tenant with no other queued work in that tier then had no pair
in any round, and the job was claimed only by the claim's safety net, when nothing else was due
(found by a tester). The trigger's condition now includes a change of tenant.

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_TRIGGER = """
DROP TRIGGER jobs_drr_requeue ON pgqueue.jobs;
-- Retries, throttles, interrupts and rescues put a job back to queued; moving a queued job
-- to another tier, to another tenant (revision 0021) or to an earlier run_at may make its
-- tenant eligible sooner.
CREATE TRIGGER jobs_drr_requeue
    AFTER UPDATE ON pgqueue.jobs
    FOR EACH ROW
    WHEN (NEW.state = 'queued'
          AND (OLD.state <> 'queued' OR OLD.priority <> NEW.priority
               OR NEW.run_at < OLD.run_at{tenant}))
    EXECUTE FUNCTION pgqueue.drr_note_requeued();
"""


def upgrade() -> None:
    op.execute(_TRIGGER.format(tenant=" OR OLD.tenant_id <> NEW.tenant_id"))


def downgrade() -> None:
    op.execute(_TRIGGER.format(tenant=""))
