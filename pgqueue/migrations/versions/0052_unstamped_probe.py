"""``lane_tiers_unstamped`` probes each lane and tier for a due unstamped job with a
``LATERAL ... LIMIT 1``: as an ``EXISTS``, in the first minute after one tenant's 1,000,000
jobs committed (no statistics on them yet), it was planned as a hash semi join over every
unstamped job, 450-524 ms a claim (``bench/scale.py``); 4.4 ms with the probe.

It also copies ``pgqueue.cancel``, whose text in 080_completion_and_cancel.sql lost a comment
about v1's DRR pairs (revision 0042 did not copy it).

Revision ID: 0052
Revises: 0051
"""

from __future__ import annotations

from alembic import op

revision = "0052"
down_revision = "0051"
branch_labels = None
depends_on = None

LANE_TIERS_UNSTAMPED = """\
CREATE OR REPLACE FUNCTION pgqueue.lane_tiers_unstamped()
RETURNS TABLE(lane text, tier pgqueue.tier)
LANGUAGE sql STABLE
AS $$
    WITH RECURSIVE s(lane, tier) AS (
        (SELECT j.lane, j.priority FROM pgqueue.jobs j
         WHERE j.state = 'queued' AND j.key_round IS NULL ORDER BY j.lane, j.priority LIMIT 1)
        UNION ALL
        SELECT n.lane, n.priority FROM s, LATERAL (
            SELECT j.lane, j.priority FROM pgqueue.jobs j
            WHERE j.state = 'queued' AND j.key_round IS NULL
              AND (j.lane, j.priority) > (s.lane, s.tier)
            ORDER BY j.lane, j.priority LIMIT 1) n
    )
    SELECT s.lane, s.tier FROM s
    CROSS JOIN LATERAL (  -- a probe of jobs_unstamped_due_idx per pair (as EXISTS, with no
                          -- statistics on new rows yet, a hash semi join read every
                          -- unstamped job: 450 ms a claim; without the ORDER BY, a Seq Scan)
        SELECT FROM pgqueue.jobs j
        WHERE j.lane = s.lane AND j.priority = s.tier AND j.state = 'queued'
          AND j.key_round IS NULL AND j.run_at <= now()
        ORDER BY j.run_at LIMIT 1) due
$$;
"""

LANE_TIERS_UNSTAMPED_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.lane_tiers_unstamped()
RETURNS TABLE(lane text, tier pgqueue.tier)
LANGUAGE sql STABLE
AS $$
    WITH RECURSIVE s(lane, tier) AS (
        (SELECT j.lane, j.priority FROM pgqueue.jobs j
         WHERE j.state = 'queued' AND j.key_round IS NULL ORDER BY j.lane, j.priority LIMIT 1)
        UNION ALL
        SELECT n.lane, n.priority FROM s, LATERAL (
            SELECT j.lane, j.priority FROM pgqueue.jobs j
            WHERE j.state = 'queued' AND j.key_round IS NULL
              AND (j.lane, j.priority) > (s.lane, s.tier)
            ORDER BY j.lane, j.priority LIMIT 1) n
    )
    SELECT s.lane, s.tier FROM s
    WHERE EXISTS (SELECT FROM pgqueue.jobs j
                  WHERE j.lane = s.lane AND j.priority = s.tier AND j.state = 'queued'
                    AND j.key_round IS NULL AND j.run_at <= now())
$$;
"""

CANCEL = """\
CREATE OR REPLACE FUNCTION pgqueue.cancel(job_id bigint, tenant_id text DEFAULT NULL,
                                          reason text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
-- Cancel one queued or running job; returns its state after the call: 'cancelled' (now, or
-- before), or the state it had already finished in ('succeeded' or 'failed'), unchanged.
-- A running job loses its lease: its worker's outcome write is fenced off (dropped), and the
-- worker stops its handler at its next heartbeat. The counters (queue_counts) follow through
-- jobs_after_update.
-- With `tenant_id`, only that tenant's job; a session confined to a tenant
-- (pgqueue.session_tenant_scope: its role's, or the one it sets) only ever reaches that
-- tenant's jobs, and a session that may not write pgqueue.jobs itself (a producer:
-- pgqueue.session_writes_jobs) must have a scope (42501 otherwise), as row-level security
-- shows it nothing else.
-- Raises PQ011 when no such job is visible, PQ009 for a reason that is empty or longer than
-- 1,000 characters.
DECLARE
    scope text := pgqueue.session_tenant_scope();
    found_state pgqueue.job_state;
    found_tenant text;
BEGIN
    IF cancel.job_id IS NULL THEN
        RAISE EXCEPTION 'job_id must not be NULL' USING ERRCODE = 'PQ009';
    END IF;
    IF cancel.tenant_id IS NOT NULL
       AND (cancel.tenant_id = '' OR char_length(cancel.tenant_id) > 128) THEN
        RAISE EXCEPTION 'tenant_id must be 1 to 128 characters' USING ERRCODE = 'PQ006';
    END IF;
    IF cancel.reason IS NOT NULL AND (cancel.reason = '' OR char_length(cancel.reason) > 1000)
    THEN
        RAISE EXCEPTION 'reason must be 1 to 1000 characters' USING ERRCODE = 'PQ009';
    END IF;
    IF scope IS NULL AND NOT pgqueue.session_writes_jobs() THEN
        RAISE EXCEPTION 'a producer session must set pgqueue.tenant_id to cancel its jobs'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- Waits for a claim or an outcome write that holds the row, then sees what it wrote.
    SELECT j.state, j.tenant_id INTO found_state, found_tenant
    FROM pgqueue.jobs j
    WHERE j.id = cancel.job_id
      AND (cancel.tenant_id IS NULL OR j.tenant_id = cancel.tenant_id)
      AND (scope IS NULL OR j.tenant_id = scope)
    FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PQ011', MESSAGE = format(
            'no job %s%s', cancel.job_id,
            coalesce(' of tenant ' || quote_literal(coalesce(cancel.tenant_id, scope)), ''));
    END IF;
    IF found_state NOT IN ('queued', 'running') THEN
        RETURN found_state::text;
    END IF;
    UPDATE pgqueue.jobs j
    SET state = 'cancelled',
        finished_at = now(),
        last_error = 'cancelled' || coalesce(': ' || cancel.reason, ''),
        lease_token = NULL,
        lease_expires_at = NULL
    WHERE j.id = cancel.job_id AND j.tenant_id = found_tenant;
    RETURN 'cancelled';
END
$$;
"""

CANCEL_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.cancel(job_id bigint, tenant_id text DEFAULT NULL,
                                          reason text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
-- Cancel one queued or running job; returns its state after the call: 'cancelled' (now, or
-- before), or the state it had already finished in ('succeeded' or 'failed'), unchanged.
-- A running job loses its lease: its worker's outcome write is fenced off (dropped), and the
-- worker stops its handler at its next heartbeat. The counters (queue_counts) follow through
-- jobs_after_update.
-- With `tenant_id`, only that tenant's job; a session confined to a tenant
-- (pgqueue.session_tenant_scope: its role's, or the one it sets) only ever reaches that
-- tenant's jobs, and a session that may not write pgqueue.jobs itself (a producer:
-- pgqueue.session_writes_jobs) must have a scope (42501 otherwise), as row-level security
-- shows it nothing else.
-- Raises PQ011 when no such job is visible, PQ009 for a reason that is empty or longer than
-- 1,000 characters.
DECLARE
    scope text := pgqueue.session_tenant_scope();
    found_state pgqueue.job_state;
    found_tenant text;
BEGIN
    IF cancel.job_id IS NULL THEN
        RAISE EXCEPTION 'job_id must not be NULL' USING ERRCODE = 'PQ009';
    END IF;
    IF cancel.tenant_id IS NOT NULL
       AND (cancel.tenant_id = '' OR char_length(cancel.tenant_id) > 128) THEN
        RAISE EXCEPTION 'tenant_id must be 1 to 128 characters' USING ERRCODE = 'PQ006';
    END IF;
    IF cancel.reason IS NOT NULL AND (cancel.reason = '' OR char_length(cancel.reason) > 1000)
    THEN
        RAISE EXCEPTION 'reason must be 1 to 1000 characters' USING ERRCODE = 'PQ009';
    END IF;
    IF scope IS NULL AND NOT pgqueue.session_writes_jobs() THEN
        RAISE EXCEPTION 'a producer session must set pgqueue.tenant_id to cancel its jobs'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- Waits for a claim or an outcome write that holds the row, then sees what it wrote.
    SELECT j.state, j.tenant_id INTO found_state, found_tenant
    FROM pgqueue.jobs j
    WHERE j.id = cancel.job_id
      AND (cancel.tenant_id IS NULL OR j.tenant_id = cancel.tenant_id)
      AND (scope IS NULL OR j.tenant_id = scope)
    FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PQ011', MESSAGE = format(
            'no job %s%s', cancel.job_id,
            coalesce(' of tenant ' || quote_literal(coalesce(cancel.tenant_id, scope)), ''));
    END IF;
    IF found_state NOT IN ('queued', 'running') THEN
        RETURN found_state::text;
    END IF;
    UPDATE pgqueue.jobs j
    SET state = 'cancelled',
        finished_at = now(),
        last_error = 'cancelled' || coalesce(': ' || cancel.reason, ''),
        lease_token = NULL,
        lease_expires_at = NULL
    WHERE j.id = cancel.job_id AND j.tenant_id = found_tenant;
    RETURN 'cancelled';
END
$$;
"""


def upgrade() -> None:
    op.execute(LANE_TIERS_UNSTAMPED)
    op.execute(CANCEL)


def downgrade() -> None:
    op.execute(LANE_TIERS_UNSTAMPED_BEFORE)
    op.execute(CANCEL_BEFORE)
