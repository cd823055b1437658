"""Baseline: the whole schema, from the files of ``pgqueue/sql/schema`` in file-name order.

The files are read when the revision runs, so the baseline always creates the current schema;
a later revision copies the new text of each object it changes (written to be idempotent), so
a fresh database (baseline + later revisions) ends where an upgraded one does.

Its id is 0030 because the migration chain it replaces (30 revisions, until issue 27) ended at
0030 with this same schema: a database migrated by that chain is at this revision already.

Revision ID: 0030
Revises:
"""

from __future__ import annotations

from alembic import op

from pgqueue.db.migrate import schema_files

revision = "0030"
down_revision = None
branch_labels = None
depends_on = None

_VIEWS = (
    "claim_order, tenant_service, fairness, queue_depth, latency_slo, rate_limit_state, "
    "admission_status"
)
_TABLES = (
    "jobs, tenants, throttle_events, demotions, usage_daily, deficits, tier_state, drr_inbox, "
    "queue_counts, admission, rate_limits"
)
_TYPES = "enqueue_batch_item, job_state, tier, origin"


def upgrade() -> None:
    for path in schema_files():
        op.execute(path.read_text(encoding="utf-8"))


def downgrade() -> None:
    # Everything but the schema itself, which holds alembic's version table. The functions are
    # dropped by what the catalog lists, so that one `pgqueue grant` added goes too.
    views = ", ".join(f"pgqueue.{v.strip()}" for v in _VIEWS.split(","))
    tables = ", ".join(f"pgqueue.{t.strip()}" for t in _TABLES.split(","))
    types = ", ".join(f"pgqueue.{t.strip()}" for t in _TYPES.split(","))
    op.execute(f"DROP VIEW IF EXISTS {views}")
    op.execute(f"DROP TABLE IF EXISTS {tables}")
    op.execute(
        """
        DO $$
        DECLARE
            f regprocedure;
        BEGIN
            FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
                     WHERE p.pronamespace = 'pgqueue'::regnamespace
            LOOP
                EXECUTE format('DROP FUNCTION %s', f);
            END LOOP;
        END
        $$
        """
    )
    op.execute(f"DROP TYPE IF EXISTS {types}")
