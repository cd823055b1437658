"""Four trigger functions that no trigger runs are dropped, leftovers of the revision chain
before 0030: ``pgqueue.queue_counts_on_insert`` and ``pgqueue.queue_counts_on_update``
(050_admission.sql), ``pgqueue.notify_jobs`` (040_enqueue.sql) and ``pgqueue.job_charge_usage``
(090_backpressure.sql). ``jobs_after_insert`` and ``jobs_after_update`` keep the counters, send
the NOTIFY and charge usage instead. A trigger function runs only from a trigger, and nothing
names these: no trigger (pg_trigger), no SQL, no Python, not `pgqueue grant` (it grants every
function of the schema at once). The schema files kept them only because databases had them;
this drops them from both. The downgrade puts their texts back.

Revision ID: 0068
Revises: 0067
"""

from __future__ import annotations

from alembic import op

revision = "0068"
down_revision = "0067"
branch_labels = None
depends_on = None

DROP = """
DROP FUNCTION IF EXISTS pgqueue.queue_counts_on_insert();
DROP FUNCTION IF EXISTS pgqueue.queue_counts_on_update();
DROP FUNCTION IF EXISTS pgqueue.notify_jobs();
DROP FUNCTION IF EXISTS pgqueue.job_charge_usage();
"""

FUNCTIONS_BEFORE = r"""CREATE OR REPLACE FUNCTION pgqueue.queue_counts_on_insert()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    tiers pgqueue.tier[];
    tenants text[];
    deltas bigint[];
BEGIN
    SELECT array_agg(g.tier), array_agg(g.tenant_id), array_agg(g.n)
    INTO tiers, tenants, deltas
    FROM (SELECT n.priority AS tier, n.tenant_id, count(*) AS n
          FROM new_rows n
          WHERE n.state = 'queued'
          GROUP BY GROUPING SETS ((n.priority, n.tenant_id), (n.priority))) g;
    PERFORM pgqueue.queue_counts_add(tiers, tenants, deltas);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.queue_counts_on_update()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    tiers pgqueue.tier[];
    tenants text[];
    deltas bigint[];
BEGIN
    SELECT array_agg(g.tier), array_agg(g.tenant_id), array_agg(g.n)
    INTO tiers, tenants, deltas
    FROM (SELECT d.priority AS tier, d.tenant_id, sum(d.delta)::bigint AS n
          FROM (SELECT n.priority, n.tenant_id, 1 AS delta FROM new_rows n
                WHERE n.state = 'queued'
                UNION ALL
                SELECT o.priority, o.tenant_id, -1 FROM old_rows o WHERE o.state = 'queued') d
          GROUP BY GROUPING SETS ((d.priority, d.tenant_id), (d.priority))
          HAVING sum(d.delta) <> 0) g;
    PERFORM pgqueue.queue_counts_add(tiers, tenants, deltas);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.notify_jobs()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_notify('pgqueue_jobs',
                      coalesce((SELECT string_agg(DISTINCT n.priority::text, ',')
                                FROM new_rows n), ''));
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.job_charge_usage()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    t text;
BEGIN
    INSERT INTO pgqueue.usage_daily AS u (tenant_id, day, requests, input_tokens, output_tokens)
    SELECT n.tenant_id, pgqueue.budget_day(), count(*),
           sum(coalesce(n.input_tokens, 0)), sum(coalesce(n.output_tokens, 0))
    FROM new_rows n
    JOIN old_rows o ON o.id = n.id AND o.tenant_id = n.tenant_id
    WHERE n.state = 'succeeded' AND o.state = 'running'
      AND (n.input_tokens IS NOT NULL OR n.output_tokens IS NOT NULL)
    GROUP BY n.tenant_id
    ORDER BY n.tenant_id COLLATE "C"
    ON CONFLICT (tenant_id, day) DO UPDATE
    SET requests = u.requests + EXCLUDED.requests,
        input_tokens = u.input_tokens + EXCLUDED.input_tokens,
        output_tokens = u.output_tokens + EXCLUDED.output_tokens;
    FOR t IN
        SELECT DISTINCT n.tenant_id COLLATE "C"
        FROM new_rows n
        JOIN old_rows o ON o.id = n.id AND o.tenant_id = n.tenant_id
        WHERE n.state = 'succeeded' AND o.state = 'running'
          AND (n.input_tokens IS NOT NULL OR n.output_tokens IS NOT NULL)
        ORDER BY 1
    LOOP
        PERFORM pgqueue.demotion_check(t);
    END LOOP;
    RETURN NULL;
END
$$;
"""


def upgrade() -> None:
    op.execute(DROP)


def downgrade() -> None:
    op.execute(FUNCTIONS_BEFORE)
