"""``pgqueue.jobs.tier``: the job's tier under the name the README, the views and ``status``
use, so that ``select tier from pgqueue.jobs`` works (issue 29, item 9). A stored generated
column equal to ``priority``, which stays the column to write and the design brief's stable
name. Added at the end of the table (010_tables.sql).

On an upgraded database, adding a stored generated column rewrites pgqueue.jobs under an
ACCESS EXCLUSIVE lock (one pass over the table, its size in time): run it when the queue can
pause for that long.

Revision ID: 0040
Revises: 0039
"""

from __future__ import annotations

from alembic import op

revision = "0040"
down_revision = "0039"
branch_labels = None
depends_on = None

JOBS_TIER = """\
ALTER TABLE pgqueue.jobs
    ADD COLUMN IF NOT EXISTS tier pgqueue.tier GENERATED ALWAYS AS (priority) STORED;
"""
JOBS_TIER_COMMENT = """\
COMMENT ON COLUMN pgqueue.jobs.tier IS 'The job''s scheduling tier (critical, standard, batch), always equal to priority: priority is the name the design brief keeps stable and the one to write; tier is the name the README, views and status use (revision 0040)';
"""


def upgrade() -> None:
    op.execute(JOBS_TIER)
    op.execute(JOBS_TIER_COMMENT)


def downgrade() -> None:
    op.execute("ALTER TABLE pgqueue.jobs DROP COLUMN IF EXISTS tier")
