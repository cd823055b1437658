"""Operator actions as SQL functions that pgqueue_admin may call (issue 31, the dashboard):
``pgqueue.retry`` (one failed or cancelled job back in the queue), ``pgqueue.retry_failed``
(failed jobs in bulk, which ``pgqueue retry`` ran as a plain UPDATE) and
``pgqueue.tenant_set`` (a tenant's plan, quantum, budget, which ``pgqueue tenants set`` ran as
a plain upsert); their text is that of 080_completion_and_cancel.sql and
020_settings_and_tenants.sql. And ``pgqueue.fairness_in`` (100_views.sql) bounds its join of
served jobs to the window, which it implied: the planner sorted the whole jobs table for it,
3 s at 1M jobs (bench/dashboard.py), for ``pgqueue status``, the exporter and the dashboard.

Revision ID: 0034
Revises: 0033
"""

from __future__ import annotations

from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None

RETRY = """\
CREATE OR REPLACE FUNCTION pgqueue.retry(job_id bigint, tenant_id text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
-- Put one failed or cancelled job back in the queue with fresh attempt and throttle counters,
-- due now; returns its state after the call: 'queued', or its state unchanged when it was
-- not failed or cancelled. last_error is kept until the next attempt overwrites it (as
-- pgqueue.retry_failed does). With `tenant_id`, only that tenant's job. The counters
-- (queue_counts) and the DRR bookkeeping follow through the jobs triggers.
-- Raises PQ011 when there is no such job, PQ009 for a NULL job_id.
DECLARE
    found_state pgqueue.job_state;
    found_tenant text;
BEGIN
    IF retry.job_id IS NULL THEN
        RAISE EXCEPTION 'job_id must not be NULL' USING ERRCODE = 'PQ009';
    END IF;
    SELECT j.state, j.tenant_id INTO found_state, found_tenant
    FROM pgqueue.jobs j
    WHERE j.id = retry.job_id
      AND (retry.tenant_id IS NULL OR j.tenant_id = retry.tenant_id)
    FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PQ011', MESSAGE = format(
            'no job %s%s', retry.job_id,
            CASE WHEN retry.tenant_id IS NULL THEN ''
                 ELSE format(' of tenant %s', quote_literal(retry.tenant_id)) END);
    END IF;
    IF found_state NOT IN ('failed', 'cancelled') THEN
        RETURN found_state::text;
    END IF;
    UPDATE pgqueue.jobs j
    SET state = 'queued', attempts = 0, throttle_retries = 0, run_at = now(), finished_at = NULL
    WHERE j.id = retry.job_id AND j.tenant_id = found_tenant;
    RETURN 'queued';
END
$$;
"""

RETRY_FAILED = """\
CREATE OR REPLACE FUNCTION pgqueue.retry_failed(tenant_id text DEFAULT NULL,
                                                tier pgqueue.tier DEFAULT NULL,
                                                reason text DEFAULT NULL,
                                                since timestamptz DEFAULT NULL,
                                                until timestamptz DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE sql
AS $$
-- Re-queue the failed jobs that match every filter given (NULL: any) with fresh attempt and
-- throttle counters, due now; returns their ids. `reason` is a substring of last_error,
-- matched literally and case-insensitively; since/until bound finished_at (until excluded).
-- last_error is kept until the next attempt overwrites it. `pgqueue retry`, and the
-- dashboard's "re-queue a tenant's failed jobs".
    UPDATE pgqueue.jobs j
    SET state = 'queued', attempts = 0, throttle_retries = 0, run_at = now(), finished_at = NULL
    WHERE j.state = 'failed'
      AND (retry_failed.tenant_id IS NULL OR j.tenant_id = retry_failed.tenant_id)
      AND (retry_failed.tier IS NULL OR j.priority = retry_failed.tier)
      AND (retry_failed.reason IS NULL
           OR strpos(lower(j.last_error), lower(retry_failed.reason)) > 0)
      AND (retry_failed.since IS NULL OR j.finished_at >= retry_failed.since)
      AND (retry_failed.until IS NULL OR j.finished_at < retry_failed.until)
    RETURNING j.id
$$;
"""

TENANT_SET = """\
CREATE OR REPLACE FUNCTION pgqueue.tenant_set(tenant_id text, plan text DEFAULT NULL,
                                              quantum double precision DEFAULT NULL,
                                              daily_token_budget bigint DEFAULT NULL)
RETURNS pgqueue.tenants
LANGUAGE sql
AS $$
-- Create a tenant or change its plan, DRR quantum (cost units) or daily input-token budget;
-- NULL keeps a value (a new tenant: plan 'free', the default quantum and budget). Returns
-- the tenant's row. `pgqueue tenants set`, and the dashboard's tenant form. The table's
-- checks refuse a bad plan name, quantum or budget (23514).
    INSERT INTO pgqueue.tenants AS t (tenant_id, plan, quantum, daily_token_budget)
    VALUES (tenant_set.tenant_id, coalesce(tenant_set.plan, 'free'), tenant_set.quantum,
            tenant_set.daily_token_budget)
    ON CONFLICT (tenant_id) DO UPDATE
    SET plan = coalesce(tenant_set.plan, t.plan),
        quantum = coalesce(tenant_set.quantum, t.quantum),
        daily_token_budget = coalesce(tenant_set.daily_token_budget, t.daily_token_budget),
        updated_at = now()
    RETURNING t.*
$$;
"""

FAIRNESS_IN = """\
CREATE OR REPLACE FUNCTION pgqueue.fairness_in(service_window interval)
RETURNS TABLE (tier pgqueue.tier, tenants bigint, jain_weighted double precision,
               jain_unweighted double precision)
LANGUAGE sql STABLE
AS $$
    WITH bounds AS (
        SELECT now() - service_window AS t0, now() AS t1
    ), waits AS (
        -- when each job waited (due, not yet started), in or reaching into the window; the
        -- jobs waiting now as one interval per tenant and tier (they all reach now)
        SELECT j.tenant_id, j.priority AS tier, min(greatest(j.enqueued_at, j.run_at)) AS s,
               b.t1 AS e
        FROM pgqueue.jobs j, bounds b
        WHERE j.state = 'queued' AND j.run_at <= b.t1
        GROUP BY j.tenant_id, j.priority, b.t1
        UNION ALL
        SELECT j.tenant_id, j.priority, greatest(j.enqueued_at, j.run_at), j.started_at
        FROM pgqueue.jobs j, bounds b
        WHERE j.started_at >= b.t0 AND j.state <> 'queued'
    ), marked AS (
        SELECT w.tenant_id, w.tier, w.s, w.e,
               w.s > coalesce(max(w.e) OVER (PARTITION BY w.tenant_id, w.tier ORDER BY w.s, w.e
                                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                              '-infinity') AS starts_backlog
        FROM waits w
    ), backlogged AS (
        SELECT m.tenant_id, m.tier, greatest(max(m.s) FILTER (WHERE m.starts_backlog), b.t0)
                   AS since
        FROM marked m, bounds b
        GROUP BY m.tenant_id, m.tier, b.t0, b.t1
        HAVING max(m.e) >= b.t1
    ), spans AS (
        SELECT k.tenant_id, k.tier, max(k.since) OVER (PARTITION BY k.tier) AS tier_since,
               max(k.since) OVER () AS all_since
        FROM backlogged k
    ), served AS (
        SELECT p.tenant_id, p.tier,
               coalesce(sum(j.cost) FILTER (WHERE j.started_at >= p.tier_since), 0) AS c_tier,
               coalesce(sum(j.cost) FILTER (WHERE j.started_at >= p.all_since), 0) AS c_all
        FROM spans p
        LEFT JOIN pgqueue.jobs j
               ON j.tenant_id = p.tenant_id AND j.priority = p.tier
              AND j.started_at >= least(p.tier_since, p.all_since)
              -- implied (every span starts in the window), and lets the join read only the
              -- window's jobs by jobs_started_at_idx, not sort the whole table (3 s at 1M)
              AND j.started_at >= (SELECT b.t0 FROM bounds b)
        GROUP BY p.tenant_id, p.tier
    ), per_tenant AS (
        SELECT s.tier, s.tenant_id, s.c_tier AS c, pgqueue.tenant_quantum(s.tenant_id) AS q
        FROM served s
        UNION ALL
        SELECT NULL, s.tenant_id, sum(s.c_all), pgqueue.tenant_quantum(s.tenant_id)
        FROM served s
        GROUP BY s.tenant_id
    )
    SELECT p.tier, count(*),
           CASE WHEN count(*) >= 2 AND sum(p.c / p.q) >= count(*)
                THEN least(1.0, sum(p.c / p.q) ^ 2 / (count(*) * sum((p.c / p.q) ^ 2))) END,
           CASE WHEN count(*) >= 2 AND sum(p.c / p.q) >= count(*)
                THEN least(1.0, sum(p.c) ^ 2 / (count(*) * sum(p.c ^ 2))) END
    FROM per_tenant p
    GROUP BY p.tier
$$;
"""

# As revision 0032 left it.
FAIRNESS_IN_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.fairness_in(service_window interval)
RETURNS TABLE (tier pgqueue.tier, tenants bigint, jain_weighted double precision,
               jain_unweighted double precision)
LANGUAGE sql STABLE
AS $$
    WITH bounds AS (
        SELECT now() - service_window AS t0, now() AS t1
    ), waits AS (
        -- when each job waited (due, not yet started), in or reaching into the window; the
        -- jobs waiting now as one interval per tenant and tier (they all reach now)
        SELECT j.tenant_id, j.priority AS tier, min(greatest(j.enqueued_at, j.run_at)) AS s,
               b.t1 AS e
        FROM pgqueue.jobs j, bounds b
        WHERE j.state = 'queued' AND j.run_at <= b.t1
        GROUP BY j.tenant_id, j.priority, b.t1
        UNION ALL
        SELECT j.tenant_id, j.priority, greatest(j.enqueued_at, j.run_at), j.started_at
        FROM pgqueue.jobs j, bounds b
        WHERE j.started_at >= b.t0 AND j.state <> 'queued'
    ), marked AS (
        SELECT w.tenant_id, w.tier, w.s, w.e,
               w.s > coalesce(max(w.e) OVER (PARTITION BY w.tenant_id, w.tier ORDER BY w.s, w.e
                                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                              '-infinity') AS starts_backlog
        FROM waits w
    ), backlogged AS (
        SELECT m.tenant_id, m.tier, greatest(max(m.s) FILTER (WHERE m.starts_backlog), b.t0)
                   AS since
        FROM marked m, bounds b
        GROUP BY m.tenant_id, m.tier, b.t0, b.t1
        HAVING max(m.e) >= b.t1
    ), spans AS (
        SELECT k.tenant_id, k.tier, max(k.since) OVER (PARTITION BY k.tier) AS tier_since,
               max(k.since) OVER () AS all_since
        FROM backlogged k
    ), served AS (
        SELECT p.tenant_id, p.tier,
               coalesce(sum(j.cost) FILTER (WHERE j.started_at >= p.tier_since), 0) AS c_tier,
               coalesce(sum(j.cost) FILTER (WHERE j.started_at >= p.all_since), 0) AS c_all
        FROM spans p
        LEFT JOIN pgqueue.jobs j
               ON j.tenant_id = p.tenant_id AND j.priority = p.tier
              AND j.started_at >= least(p.tier_since, p.all_since)
        GROUP BY p.tenant_id, p.tier
    ), per_tenant AS (
        SELECT s.tier, s.tenant_id, s.c_tier AS c, pgqueue.tenant_quantum(s.tenant_id) AS q
        FROM served s
        UNION ALL
        SELECT NULL, s.tenant_id, sum(s.c_all), pgqueue.tenant_quantum(s.tenant_id)
        FROM served s
        GROUP BY s.tenant_id
    )
    SELECT p.tier, count(*),
           CASE WHEN count(*) >= 2 AND sum(p.c / p.q) >= count(*)
                THEN least(1.0, sum(p.c / p.q) ^ 2 / (count(*) * sum((p.c / p.q) ^ 2))) END,
           CASE WHEN count(*) >= 2 AND sum(p.c / p.q) >= count(*)
                THEN least(1.0, sum(p.c) ^ 2 / (count(*) * sum(p.c ^ 2))) END
    FROM per_tenant p
    GROUP BY p.tier
$$;
"""

DROP = """\
DROP FUNCTION IF EXISTS pgqueue.retry(bigint, text);
DROP FUNCTION IF EXISTS pgqueue.retry_failed(text, pgqueue.tier, text, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS pgqueue.tenant_set(text, text, double precision, bigint);
"""


def upgrade() -> None:
    op.execute(RETRY)
    op.execute(RETRY_FAILED)
    op.execute(TENANT_SET)
    op.execute(FAIRNESS_IN)


def downgrade() -> None:
    op.execute(FAIRNESS_IN_BEFORE)
    op.execute(DROP)
