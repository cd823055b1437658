"""One set of a tenant's queued job ids for the cancel and the demotion (no behaviour
changes): ``pgqueue.tenant_queued_ids(tenant, tier)``, the unstamped ones by
jobs_unstamped_tenant_idx and the stamped ones by jobs_claim_idx, which
``pgqueue.cancel_queued`` and ``pgqueue.demotion_check`` each wrote out in revision 0063; both
still join the rows back by the primary key. The texts are 080_completion_and_cancel.sql's and
090_backpressure.sql's.

Revision ID: 0065
Revises: 0064
"""

from __future__ import annotations

from alembic import op

revision = "0065"
down_revision = "0064"
branch_labels = None
depends_on = None

TENANT_QUEUED_IDS = r"""
CREATE OR REPLACE FUNCTION pgqueue.tenant_queued_ids(p_tenant text, p_tier pgqueue.tier)
RETURNS SETOF bigint
LANGUAGE sql STABLE
AS $$
    SELECT j.id FROM pgqueue.jobs j
    WHERE j.tenant_id = p_tenant AND j.state = 'queued' AND j.key_round IS NULL
      AND (p_tier IS NULL OR j.priority = p_tier)
    UNION ALL
    SELECT j.id FROM pgqueue.jobs j
    WHERE (j.tenant_id = p_tenant) IS TRUE AND j.state = 'queued' AND j.key_round IS NOT NULL
      AND (p_tier IS NULL OR j.priority = p_tier)
$$;

"""

CANCEL_QUEUED = r"""
CREATE OR REPLACE FUNCTION pgqueue.cancel_queued(tenant_id text, tier pgqueue.tier DEFAULT NULL,
                                                 reason text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
-- Cancel every queued job of a tenant (of one tier, when given), e.g. a runaway tenant's
-- backlog; returns how many. Running jobs are left to finish (cancel them one by one with
-- pgqueue.cancel). Rows another transaction holds at that moment (a claim taking them, a
-- user's UPDATE left open) are skipped, not waited for, and not counted: waiting, this statement would keep the lock on each such row until
-- the caller's transaction ends even though it is then running, and the worker's batched
-- completion would wait on it (found by a tester: a cancel_queued held open in a transaction
-- stopped a worker for every tenant).
-- A session confined to a tenant (pgqueue.session_tenant_scope) may only name that tenant, and
-- a session that may not write pgqueue.jobs itself (pgqueue.session_writes_jobs) must have a
-- scope (42501 otherwise).
-- Raises PQ006 for a tenant id that is empty or longer than 128 characters, PQ009 for a
-- reason that is empty or longer than 1,000 characters.
DECLARE
    scope text := pgqueue.session_tenant_scope();
    n bigint;
BEGIN
    IF cancel_queued.tenant_id IS NULL OR cancel_queued.tenant_id = ''
       OR char_length(cancel_queued.tenant_id) > 128 THEN
        RAISE EXCEPTION 'tenant_id must be 1 to 128 characters' USING ERRCODE = 'PQ006';
    END IF;
    IF cancel_queued.reason IS NOT NULL
       AND (cancel_queued.reason = '' OR char_length(cancel_queued.reason) > 1000) THEN
        RAISE EXCEPTION 'reason must be 1 to 1000 characters' USING ERRCODE = 'PQ009';
    END IF;
    IF scope IS NULL AND NOT pgqueue.session_writes_jobs() THEN
        RAISE EXCEPTION 'a producer session must set pgqueue.tenant_id to cancel its jobs'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF scope IS NOT NULL AND scope <> cancel_queued.tenant_id THEN
        RAISE EXCEPTION 'this session may only cancel jobs of tenant %', quote_literal(scope)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- The tenant's queued jobs (pgqueue.tenant_queued_ids), locked by a join on the primary
    -- key, each row checked again at its newest version (a job stamped meanwhile is one of
    -- them still).
    WITH doomed AS (
        SELECT j.ctid AS row_id
        FROM pgqueue.tenant_queued_ids(cancel_queued.tenant_id, cancel_queued.tier) AS q(id)
        JOIN pgqueue.jobs j ON j.id = q.id AND j.tenant_id = cancel_queued.tenant_id
        WHERE j.state = 'queued'
          AND (cancel_queued.tier IS NULL OR j.priority = cancel_queued.tier)
        FOR UPDATE OF j SKIP LOCKED
    )
    UPDATE pgqueue.jobs j
    SET state = 'cancelled',
        finished_at = now(),
        last_error = 'cancelled' || coalesce(': ' || cancel_queued.reason, '')
    WHERE j.ctid = ANY (ARRAY(SELECT d.row_id FROM doomed d));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

"""

DEMOTION_CHECK = r"""
CREATE OR REPLACE FUNCTION pgqueue.demotion_check(p_tenant text)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    threshold constant double precision := pgqueue.setting('demotion_throttle_threshold', 5);
    window_s constant double precision := pgqueue.setting('demotion_throttle_window_seconds', 60);
    ratio constant double precision := pgqueue.setting('demotion_budget_ratio', 1.5);
    duration constant double precision := pgqueue.setting('demotion_seconds', 300);
    throttles bigint;
    used bigint;
    budget bigint;
    why text;
BEGIN
    IF pgqueue.is_demoted(p_tenant) THEN
        RETURN NULL;
    END IF;
    SELECT count(*) INTO throttles
    FROM pgqueue.throttle_events e
    WHERE e.tenant_id = p_tenant
      AND e.occurred_at > now() - make_interval(secs => window_s);
    IF throttles >= threshold THEN
        why := format('%s throttle events in %s s (threshold %s)', throttles, window_s, threshold);
    ELSE
        SELECT u.input_tokens INTO used
        FROM pgqueue.usage_daily u
        WHERE u.tenant_id = p_tenant AND u.day = pgqueue.budget_day();
        SELECT coalesce(t.daily_token_budget,
                        pgqueue.setting('default_daily_budget', 100000)::bigint)
        INTO budget
        FROM pgqueue.tenants t WHERE t.tenant_id = p_tenant;
        IF coalesce(used, 0) > ratio * coalesce(budget, 100000) THEN
            why := format('%s input tokens today, over %s × the daily budget of %s',
                          used, ratio, budget);
        END IF;
    END IF;
    IF why IS NULL THEN
        RETURN NULL;
    END IF;
    -- One demotion at a time per tenant, even with concurrent checks: the tenant's row,
    -- which a producer may not lock (enqueues' FOR KEY SHARE does not conflict). Not an
    -- advisory lock: found by a hostile tester (issue 32), a tenant's role could hold any
    -- tenant's key, and every completion that demoted that tenant waited for it.
    PERFORM 1 FROM pgqueue.tenants t WHERE t.tenant_id = p_tenant FOR NO KEY UPDATE;
    IF pgqueue.is_demoted(p_tenant) THEN
        RETURN NULL;
    END IF;
    INSERT INTO pgqueue.demotions (tenant_id, reason, expires_at)
    VALUES (p_tenant, why, now() + make_interval(secs => duration));
    IF coalesce(current_setting('pgqueue.demote_queued_jobs', true), '') IN ('on', 'true', '1')
    THEN
        -- the tenant's queued standard jobs (pgqueue.tenant_queued_ids), joined back by the
        -- primary key (each row changed meanwhile checked again by its own join)
        UPDATE pgqueue.jobs j SET priority = 'batch'
        FROM pgqueue.tenant_queued_ids(p_tenant, 'standard') AS q(id)
        WHERE j.id = q.id AND j.tenant_id = p_tenant AND j.state = 'queued'
          AND j.priority = 'standard';
    END IF;
    RETURN why;
END
$$;

"""

CANCEL_QUEUED_BEFORE = r"""
CREATE OR REPLACE FUNCTION pgqueue.cancel_queued(tenant_id text, tier pgqueue.tier DEFAULT NULL,
                                                 reason text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
-- Cancel every queued job of a tenant (of one tier, when given), e.g. a runaway tenant's
-- backlog; returns how many. Running jobs are left to finish (cancel them one by one with
-- pgqueue.cancel). Rows another transaction holds at that moment (a claim taking them, a
-- user's UPDATE left open) are skipped, not waited for, and not counted: waiting, this statement would keep the lock on each such row until
-- the caller's transaction ends even though it is then running, and the worker's batched
-- completion would wait on it (found by a tester: a cancel_queued held open in a transaction
-- stopped a worker for every tenant).
-- A session confined to a tenant (pgqueue.session_tenant_scope) may only name that tenant, and
-- a session that may not write pgqueue.jobs itself (pgqueue.session_writes_jobs) must have a
-- scope (42501 otherwise).
-- Raises PQ006 for a tenant id that is empty or longer than 128 characters, PQ009 for a
-- reason that is empty or longer than 1,000 characters.
DECLARE
    scope text := pgqueue.session_tenant_scope();
    n bigint;
BEGIN
    IF cancel_queued.tenant_id IS NULL OR cancel_queued.tenant_id = ''
       OR char_length(cancel_queued.tenant_id) > 128 THEN
        RAISE EXCEPTION 'tenant_id must be 1 to 128 characters' USING ERRCODE = 'PQ006';
    END IF;
    IF cancel_queued.reason IS NOT NULL
       AND (cancel_queued.reason = '' OR char_length(cancel_queued.reason) > 1000) THEN
        RAISE EXCEPTION 'reason must be 1 to 1000 characters' USING ERRCODE = 'PQ009';
    END IF;
    IF scope IS NULL AND NOT pgqueue.session_writes_jobs() THEN
        RAISE EXCEPTION 'a producer session must set pgqueue.tenant_id to cancel its jobs'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF scope IS NOT NULL AND scope <> cancel_queued.tenant_id THEN
        RAISE EXCEPTION 'this session may only cancel jobs of tenant %', quote_literal(scope)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- The tenant's queued jobs: the unstamped ones by jobs_unstamped_tenant_idx, the stamped
    -- ones (a few DRR rounds' worth of every backlogged tenant) by jobs_claim_idx (revision
    -- 0060: no index holds every queued job by tenant, as every stamp would write an entry in
    -- it); `IS TRUE` keeps the planner off jobs_pkey, whose second column is tenant_id (a
    -- scan of all of it). Then locked by a join on the primary key, each row checked again at
    -- its newest version (a job stamped meanwhile is one of them still): a row's check is its
    -- own join, not a search of every id found (as `ctid = ANY (...)` was, once per row that
    -- workers changed meanwhile: a tester's cancel of 60,000 jobs under three workers took
    -- 2-5 minutes instead of 1 s, holding claimed rows until their completions timed out).
    WITH queued AS (
        SELECT j.id
        FROM pgqueue.jobs j
        WHERE j.tenant_id = cancel_queued.tenant_id
          AND j.state = 'queued' AND j.key_round IS NULL
          AND (cancel_queued.tier IS NULL OR j.priority = cancel_queued.tier)
        UNION ALL
        SELECT j.id
        FROM pgqueue.jobs j
        WHERE (j.tenant_id = cancel_queued.tenant_id) IS TRUE
          AND j.state = 'queued' AND j.key_round IS NOT NULL
          AND (cancel_queued.tier IS NULL OR j.priority = cancel_queued.tier)
    ), doomed AS (
        SELECT j.ctid AS row_id
        FROM queued q
        JOIN pgqueue.jobs j ON j.id = q.id AND j.tenant_id = cancel_queued.tenant_id
        WHERE j.state = 'queued'
          AND (cancel_queued.tier IS NULL OR j.priority = cancel_queued.tier)
        FOR UPDATE OF j SKIP LOCKED
    )
    UPDATE pgqueue.jobs j
    SET state = 'cancelled',
        finished_at = now(),
        last_error = 'cancelled' || coalesce(': ' || cancel_queued.reason, '')
    WHERE j.ctid = ANY (ARRAY(SELECT d.row_id FROM doomed d));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

"""

DEMOTION_CHECK_BEFORE = r"""
CREATE OR REPLACE FUNCTION pgqueue.demotion_check(p_tenant text)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    threshold constant double precision := pgqueue.setting('demotion_throttle_threshold', 5);
    window_s constant double precision := pgqueue.setting('demotion_throttle_window_seconds', 60);
    ratio constant double precision := pgqueue.setting('demotion_budget_ratio', 1.5);
    duration constant double precision := pgqueue.setting('demotion_seconds', 300);
    throttles bigint;
    used bigint;
    budget bigint;
    why text;
BEGIN
    IF pgqueue.is_demoted(p_tenant) THEN
        RETURN NULL;
    END IF;
    SELECT count(*) INTO throttles
    FROM pgqueue.throttle_events e
    WHERE e.tenant_id = p_tenant
      AND e.occurred_at > now() - make_interval(secs => window_s);
    IF throttles >= threshold THEN
        why := format('%s throttle events in %s s (threshold %s)', throttles, window_s, threshold);
    ELSE
        SELECT u.input_tokens INTO used
        FROM pgqueue.usage_daily u
        WHERE u.tenant_id = p_tenant AND u.day = pgqueue.budget_day();
        SELECT coalesce(t.daily_token_budget,
                        pgqueue.setting('default_daily_budget', 100000)::bigint)
        INTO budget
        FROM pgqueue.tenants t WHERE t.tenant_id = p_tenant;
        IF coalesce(used, 0) > ratio * coalesce(budget, 100000) THEN
            why := format('%s input tokens today, over %s × the daily budget of %s',
                          used, ratio, budget);
        END IF;
    END IF;
    IF why IS NULL THEN
        RETURN NULL;
    END IF;
    -- One demotion at a time per tenant, even with concurrent checks: the tenant's row,
    -- which a producer may not lock (enqueues' FOR KEY SHARE does not conflict). Not an
    -- advisory lock: found by a hostile tester (issue 32), a tenant's role could hold any
    -- tenant's key, and every completion that demoted that tenant waited for it.
    PERFORM 1 FROM pgqueue.tenants t WHERE t.tenant_id = p_tenant FOR NO KEY UPDATE;
    IF pgqueue.is_demoted(p_tenant) THEN
        RETURN NULL;
    END IF;
    INSERT INTO pgqueue.demotions (tenant_id, reason, expires_at)
    VALUES (p_tenant, why, now() + make_interval(secs => duration));
    IF coalesce(current_setting('pgqueue.demote_queued_jobs', true), '') IN ('on', 'true', '1')
    THEN
        -- the unstamped jobs by jobs_unstamped_tenant_idx, the stamped ones by jobs_claim_idx
        -- (revision 0060; `IS TRUE`: not a scan of all of jobs_pkey, as in
        -- pgqueue.cancel_queued), joined by the primary key so that each row workers changed
        -- meanwhile is checked again at its newest version by its own join (revision 0063)
        UPDATE pgqueue.jobs j SET priority = 'batch'
        FROM (SELECT x.id FROM pgqueue.jobs x
              WHERE x.tenant_id = p_tenant AND x.state = 'queued' AND x.key_round IS NULL
                AND x.priority = 'standard'
              UNION ALL
              SELECT x.id FROM pgqueue.jobs x
              WHERE (x.tenant_id = p_tenant) IS TRUE AND x.state = 'queued'
                AND x.key_round IS NOT NULL AND x.priority = 'standard') q
        WHERE j.id = q.id AND j.tenant_id = p_tenant AND j.state = 'queued'
          AND j.priority = 'standard';
    END IF;
    RETURN why;
END
$$;

"""


def upgrade() -> None:
    op.execute(TENANT_QUEUED_IDS)
    op.execute(CANCEL_QUEUED)
    op.execute(DEMOTION_CHECK)


def downgrade() -> None:
    op.execute(CANCEL_QUEUED_BEFORE)
    op.execute(DEMOTION_CHECK_BEFORE)
    op.execute("DROP FUNCTION IF EXISTS pgqueue.tenant_queued_ids(text, pgqueue.tier)")
