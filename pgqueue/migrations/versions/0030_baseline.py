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

# What downgrade() drops: everything but the schema itself, which holds alembic's version table.
_DROP_VIEWS = """
DROP VIEW IF EXISTS pgqueue.claim_order, pgqueue.tenant_service, pgqueue.fairness,
    pgqueue.queue_depth, pgqueue.latency_slo, pgqueue.rate_limit_state, pgqueue.admission_status
"""
# Triggers and functions by what the catalog lists, so that those `pgqueue grant` adds go too;
# functions before tables (some return a table's row type), triggers before functions.
_DROP_TRIGGERS_AND_FUNCTIONS = """
DO $$
DECLARE
    t record;
    f regprocedure;
BEGIN
    FOR t IN SELECT tg.tgname, tg.tgrelid::regclass AS rel FROM pg_trigger tg
             JOIN pg_class c ON c.oid = tg.tgrelid
             WHERE c.relnamespace = 'pgqueue'::regnamespace AND NOT tg.tgisinternal
    LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', t.tgname, t.rel);
    END LOOP;
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             WHERE p.pronamespace = 'pgqueue'::regnamespace
    LOOP
        EXECUTE format('DROP FUNCTION %s', f);
    END LOOP;
END
$$
"""
_DROP_TABLES_AND_TYPES = """
DROP TABLE IF EXISTS pgqueue.jobs, pgqueue.tenants, pgqueue.throttle_events, pgqueue.demotions,
    pgqueue.usage_daily, pgqueue.deficits, pgqueue.tier_state, pgqueue.drr_inbox,
    pgqueue.queue_counts, pgqueue.admission, pgqueue.rate_limits;
DROP TYPE IF EXISTS pgqueue.enqueue_batch_item, pgqueue.job_state, pgqueue.tier, pgqueue.origin;
"""


def upgrade() -> None:
    for path in schema_files():
        op.execute(path.read_text(encoding="utf-8"))


def downgrade() -> None:
    op.execute(_DROP_VIEWS)
    op.execute(_DROP_TRIGGERS_AND_FUNCTIONS)
    op.execute(_DROP_TABLES_AND_TYPES)
