"""The jobs indexes keep equal keys apart (issue 28, speed): ``deduplicate_items`` off on every
index of ``pgqueue.jobs``. An entry of a posting list (equal keys merged into one) can be marked
dead only once every row version it lists is dead, so the fold's probes went on visiting the
versions a stamp or claim had replaced (80-150 heap fetches a probe), and each insertion into a
list rewrote it: -2 % instructions per claimed and completed job after revision 0060, -5 %
before it (bench/claim_instructions_peer.py, 1,500 jobs: 952-955k against 971-974k). Entries written from now on are single; the lists already
there go as their jobs leave the queue (a REINDEX folds them at once). The texts are
010_tables.sql's.

Revision ID: 0061
Revises: 0060
"""

from __future__ import annotations

from alembic import op

revision = "0061"
down_revision = "0060"
branch_labels = None
depends_on = None

UP = r"""
ALTER INDEX pgqueue.jobs_pkey SET (deduplicate_items = off);
ALTER INDEX pgqueue.jobs_dedupe_live_idx SET (deduplicate_items = off);
ALTER INDEX pgqueue.jobs_finished_at_idx SET (deduplicate_items = off);
ALTER INDEX pgqueue.jobs_queued_enqueued_idx SET (deduplicate_items = off);
ALTER INDEX pgqueue.jobs_queued_run_at_idx SET (deduplicate_items = off);
ALTER INDEX pgqueue.jobs_unstamped_tenant_idx SET (deduplicate_items = off);
ALTER INDEX pgqueue.jobs_running_lease_idx SET (deduplicate_items = off);
ALTER INDEX pgqueue.jobs_started_at_idx SET (deduplicate_items = off);
ALTER INDEX pgqueue.jobs_claim_idx SET (deduplicate_items = off);
ALTER INDEX pgqueue.jobs_unstamped_idx SET (deduplicate_items = off);
ALTER INDEX pgqueue.jobs_unstamped_due_idx SET (deduplicate_items = off);
"""

DOWN = r"""
ALTER INDEX pgqueue.jobs_pkey RESET (deduplicate_items);
ALTER INDEX pgqueue.jobs_dedupe_live_idx RESET (deduplicate_items);
ALTER INDEX pgqueue.jobs_finished_at_idx RESET (deduplicate_items);
ALTER INDEX pgqueue.jobs_queued_enqueued_idx RESET (deduplicate_items);
ALTER INDEX pgqueue.jobs_queued_run_at_idx RESET (deduplicate_items);
ALTER INDEX pgqueue.jobs_unstamped_tenant_idx RESET (deduplicate_items);
ALTER INDEX pgqueue.jobs_running_lease_idx RESET (deduplicate_items);
ALTER INDEX pgqueue.jobs_started_at_idx RESET (deduplicate_items);
ALTER INDEX pgqueue.jobs_claim_idx RESET (deduplicate_items);
ALTER INDEX pgqueue.jobs_unstamped_idx RESET (deduplicate_items);
ALTER INDEX pgqueue.jobs_unstamped_due_idx RESET (deduplicate_items);
"""


def upgrade() -> None:
    op.execute(UP)


def downgrade() -> None:
    op.execute(DOWN)
