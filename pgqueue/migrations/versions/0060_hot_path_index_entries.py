"""Fewer index entries per job on the hot path (issue 28, speed): no UPDATE of a job is HOT
(state and the key columns are indexed), so each new row version gets an entry in every index
whose predicate it matches. Three partial indexes now leave out the stamp's, the claim's or the
success's row versions, and the queries that read them take the rest from indexes those
transitions write anyway: 11 index entries per stamped, claimed and completed job become 7.

- ``jobs_queued_run_at_idx`` (run_at) holds the unstamped queued jobs only (``key_round IS
  NULL``): ``queue_depth``'s ``due`` (a job not due yet is never stamped), ``job_next_due`` and
  ``job_due_kinds_besides`` (the stamped jobs, due already, count by the lanes' heads).
- ``jobs_queued_tenant_head_idx`` (every queued job by tenant, the v1 scheduler's) becomes
  ``jobs_unstamped_tenant_idx`` (tenant_id, priority) of the unstamped ones:
  ``pgqueue.cancel_queued`` and ``pgqueue.demotion_check`` read a tenant's stamped jobs by
  ``jobs_claim_idx``; ``tenant_list`` counts from ``queue_counts``.
- ``jobs_started_at_idx`` holds the started jobs queued again, failed or cancelled only (was:
  every started job, an entry at the claim and one at the success): the new
  ``pgqueue.jobs_started_since`` reads the jobs served in a window from it, the running ones
  from ``jobs_running_lease_idx`` and the succeeded ones from ``jobs_finished_at_idx`` (a
  success finishes after it started); ``tenant_service_in`` and ``fairness_in`` go through it.

The indexes are dropped and built again (idempotent, as every revision: on a fresh database the
baseline made them already), without CONCURRENTLY (a migration runs in a transaction): on a large
queue, run this revision when a short write pause is fine. The texts are the schema files'.

Revision ID: 0060
Revises: 0059
"""

from __future__ import annotations

from alembic import op

revision = "0060"
down_revision = "0059"
branch_labels = None
depends_on = None

INDEXES = r"""
DROP INDEX IF EXISTS pgqueue.jobs_queued_run_at_idx;
DROP INDEX IF EXISTS pgqueue.jobs_queued_tenant_head_idx;
DROP INDEX IF EXISTS pgqueue.jobs_unstamped_tenant_idx;
DROP INDEX IF EXISTS pgqueue.jobs_started_at_idx;
CREATE INDEX jobs_queued_run_at_idx ON pgqueue.jobs USING btree (run_at) WHERE ((state = 'queued'::pgqueue.job_state) AND (key_round IS NULL));
CREATE INDEX jobs_unstamped_tenant_idx ON pgqueue.jobs USING btree (tenant_id, priority) WHERE ((state = 'queued'::pgqueue.job_state) AND (key_round IS NULL));
CREATE INDEX jobs_started_at_idx ON pgqueue.jobs USING btree (started_at) WHERE ((started_at IS NOT NULL) AND (state = ANY (ARRAY['queued'::pgqueue.job_state, 'failed'::pgqueue.job_state, 'cancelled'::pgqueue.job_state])));
"""

INDEXES_BEFORE = r"""
DROP INDEX IF EXISTS pgqueue.jobs_queued_run_at_idx;
DROP INDEX IF EXISTS pgqueue.jobs_unstamped_tenant_idx;
DROP INDEX IF EXISTS pgqueue.jobs_queued_tenant_head_idx;
DROP INDEX IF EXISTS pgqueue.jobs_started_at_idx;
CREATE INDEX jobs_queued_run_at_idx ON pgqueue.jobs USING btree (run_at) WHERE (state = 'queued'::pgqueue.job_state);
CREATE INDEX jobs_queued_tenant_head_idx ON pgqueue.jobs USING btree (tenant_id, priority, run_at, id) WHERE (state = 'queued'::pgqueue.job_state);
CREATE INDEX jobs_started_at_idx ON pgqueue.jobs USING btree (started_at) WHERE (started_at IS NOT NULL);
"""

QUEUE_DEPTH = r"""
CREATE OR REPLACE VIEW pgqueue.queue_depth AS
SELECT t.tier,
       coalesce(c.queued, 0)::bigint AS queued,
       coalesce(c.queued, 0)::bigint - coalesce(l.later, 0) AS due,
       coalesce(r.running, 0) AS running,
       (SELECT extract(epoch FROM now() - min(j.enqueued_at))::double precision
        FROM pgqueue.jobs j
        WHERE j.state = 'queued' AND j.priority = t.tier) AS oldest_queued_seconds
FROM unnest(enum_range(NULL::pgqueue.tier)) AS t(tier)
LEFT JOIN (
    SELECT qc.tier, sum(qc.queued) AS queued
    FROM pgqueue.queue_counts qc
    WHERE qc.tenant_id IS NULL
    GROUP BY qc.tier
) c ON c.tier = t.tier
LEFT JOIN (
    SELECT j.priority, count(*) AS later
    FROM pgqueue.jobs j
    WHERE j.state = 'queued' AND j.key_round IS NULL AND j.run_at > now()
    GROUP BY j.priority
) l ON l.priority = t.tier
LEFT JOIN (
    SELECT j.priority, count(*) AS running
    FROM pgqueue.jobs j
    WHERE j.state = 'running'
    GROUP BY j.priority
) r ON r.priority = t.tier
ORDER BY t.tier;
"""

JOBS_STARTED_SINCE = r"""
CREATE OR REPLACE FUNCTION pgqueue.jobs_started_since(since timestamp with time zone)
RETURNS SETOF pgqueue.jobs
LANGUAGE sql STABLE
AS $$
    SELECT j.* FROM pgqueue.jobs j
    WHERE j.state = 'running' AND j.started_at >= since
    UNION ALL
    SELECT j.* FROM pgqueue.jobs j
    WHERE j.state = 'succeeded' AND j.finished_at >= since AND j.started_at >= since
    UNION ALL
    SELECT j.* FROM pgqueue.jobs j
    WHERE j.state IN ('queued', 'failed', 'cancelled') AND j.started_at >= since
$$;
"""

TENANT_SERVICE_IN = r"""
CREATE OR REPLACE FUNCTION pgqueue.tenant_service_in(service_window interval)
RETURNS TABLE (tenant_id text, tier pgqueue.tier, jobs_served bigint,
               cost_served double precision, jobs_queued bigint,
               cost_queued double precision, quantum double precision, backlogged boolean)
LANGUAGE sql STABLE
AS $$
    WITH served AS (
        SELECT j.tenant_id, j.priority AS tier, count(*) AS n, sum(j.cost) AS c
        FROM pgqueue.jobs_started_since(now() - service_window) j
        GROUP BY j.tenant_id, j.priority
    ), queued AS (
        SELECT j.tenant_id, j.priority AS tier, count(*) AS n, sum(j.cost) AS c
        FROM pgqueue.jobs j
        WHERE j.state = 'queued' AND j.enqueued_at <= now()
        GROUP BY j.tenant_id, j.priority
    )
    SELECT coalesce(s.tenant_id, q.tenant_id), coalesce(s.tier, q.tier),
           coalesce(s.n, 0), coalesce(s.c, 0)::double precision,
           coalesce(q.n, 0), coalesce(q.c, 0)::double precision,
           pgqueue.tenant_quantum(coalesce(s.tenant_id, q.tenant_id)),
           true
    FROM served s
    FULL JOIN queued q ON q.tenant_id = s.tenant_id AND q.tier = s.tier
$$;
"""

FAIRNESS_IN = r"""
CREATE OR REPLACE FUNCTION pgqueue.fairness_in(service_window interval)
RETURNS TABLE (tier pgqueue.tier, tenants bigint, jain_weighted double precision,
               jain_unweighted double precision)
LANGUAGE sql STABLE
AS $$
    WITH bounds AS (
        SELECT now() - service_window AS t0, now() AS t1
    ), started AS (  -- the window's jobs, read once (not a sort of the whole table: 3 s at 1M)
        SELECT j.tenant_id, j.priority, j.state, j.cost, j.enqueued_at, j.run_at, j.started_at
        FROM pgqueue.jobs_started_since(now() - service_window) j
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
        FROM started j
        WHERE j.state <> 'queued'
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
        LEFT JOIN started j  -- every span starts in the window
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
    -- The tenant's queued jobs: the unstamped ones by jobs_unstamped_tenant_idx, the stamped
    -- ones (a few DRR rounds' worth of every backlogged tenant) by jobs_claim_idx (revision
    -- 0060: no index holds every queued job by tenant, as every stamp would write an entry in
    -- it); `IS TRUE` keeps the planner off jobs_pkey, whose second column is tenant_id (a
    -- scan of all of it). Then locked by row, each checked again at its newest version (a job
    -- stamped meanwhile is one of them still).
    WITH queued AS (
        SELECT j.ctid AS row_id
        FROM pgqueue.jobs j
        WHERE j.tenant_id = cancel_queued.tenant_id
          AND j.state = 'queued' AND j.key_round IS NULL
          AND (cancel_queued.tier IS NULL OR j.priority = cancel_queued.tier)
        UNION ALL
        SELECT j.ctid
        FROM pgqueue.jobs j
        WHERE (j.tenant_id = cancel_queued.tenant_id) IS TRUE
          AND j.state = 'queued' AND j.key_round IS NOT NULL
          AND (cancel_queued.tier IS NULL OR j.priority = cancel_queued.tier)
    ), doomed AS (
        SELECT j.ctid AS row_id
        FROM pgqueue.jobs j
        WHERE j.ctid = ANY (ARRAY(SELECT q.row_id FROM queued q))
          AND j.tenant_id = cancel_queued.tenant_id
          AND j.state = 'queued'
          AND (cancel_queued.tier IS NULL OR j.priority = cancel_queued.tier)
        FOR UPDATE SKIP LOCKED
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
        -- the unstamped jobs by jobs_unstamped_tenant_idx, the stamped ones by jobs_claim_idx
        -- (revision 0060; `IS TRUE`: not a scan of all of jobs_pkey, as in
        -- pgqueue.cancel_queued), each checked again at its newest version
        UPDATE pgqueue.jobs j SET priority = 'batch'
        WHERE j.ctid = ANY (ARRAY(
                  SELECT x.ctid FROM pgqueue.jobs x
                  WHERE x.tenant_id = p_tenant AND x.state = 'queued' AND x.key_round IS NULL
                    AND x.priority = 'standard'
                  UNION ALL
                  SELECT x.ctid FROM pgqueue.jobs x
                  WHERE (x.tenant_id = p_tenant) IS TRUE AND x.state = 'queued'
                    AND x.key_round IS NOT NULL AND x.priority = 'standard'))
          AND j.tenant_id = p_tenant AND j.state = 'queued' AND j.priority = 'standard';
    END IF;
    RETURN why;
END
$$;
"""

QUEUE_DEPTH_BEFORE = r"""
CREATE OR REPLACE VIEW pgqueue.queue_depth AS
SELECT t.tier,
       coalesce(c.queued, 0)::bigint AS queued,
       coalesce(c.queued, 0)::bigint - coalesce(l.later, 0) AS due,
       coalesce(r.running, 0) AS running,
       (SELECT extract(epoch FROM now() - min(j.enqueued_at))::double precision
        FROM pgqueue.jobs j
        WHERE j.state = 'queued' AND j.priority = t.tier) AS oldest_queued_seconds
FROM unnest(enum_range(NULL::pgqueue.tier)) AS t(tier)
LEFT JOIN (
    SELECT qc.tier, sum(qc.queued) AS queued
    FROM pgqueue.queue_counts qc
    WHERE qc.tenant_id IS NULL
    GROUP BY qc.tier
) c ON c.tier = t.tier
LEFT JOIN (
    SELECT j.priority, count(*) AS later
    FROM pgqueue.jobs j
    WHERE j.state = 'queued' AND j.run_at > now()
    GROUP BY j.priority
) l ON l.priority = t.tier
LEFT JOIN (
    SELECT j.priority, count(*) AS running
    FROM pgqueue.jobs j
    WHERE j.state = 'running'
    GROUP BY j.priority
) r ON r.priority = t.tier
ORDER BY t.tier;
"""

TENANT_SERVICE_IN_BEFORE = r"""
CREATE OR REPLACE FUNCTION pgqueue.tenant_service_in(service_window interval)
RETURNS TABLE (tenant_id text, tier pgqueue.tier, jobs_served bigint,
               cost_served double precision, jobs_queued bigint,
               cost_queued double precision, quantum double precision, backlogged boolean)
LANGUAGE sql STABLE
AS $$
    WITH served AS (
        SELECT j.tenant_id, j.priority AS tier, count(*) AS n, sum(j.cost) AS c
        FROM pgqueue.jobs j
        WHERE j.started_at >= now() - service_window
        GROUP BY j.tenant_id, j.priority
    ), queued AS (
        SELECT j.tenant_id, j.priority AS tier, count(*) AS n, sum(j.cost) AS c
        FROM pgqueue.jobs j
        WHERE j.state = 'queued' AND j.enqueued_at <= now()
        GROUP BY j.tenant_id, j.priority
    )
    SELECT coalesce(s.tenant_id, q.tenant_id), coalesce(s.tier, q.tier),
           coalesce(s.n, 0), coalesce(s.c, 0)::double precision,
           coalesce(q.n, 0), coalesce(q.c, 0)::double precision,
           pgqueue.tenant_quantum(coalesce(s.tenant_id, q.tenant_id)),
           true
    FROM served s
    FULL JOIN queued q ON q.tenant_id = s.tenant_id AND q.tier = s.tier
$$;
"""

FAIRNESS_IN_BEFORE = r"""
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
    WITH doomed AS (
        SELECT j.ctid AS row_id
        FROM pgqueue.jobs j
        WHERE j.tenant_id = cancel_queued.tenant_id
          AND j.state = 'queued'
          AND (cancel_queued.tier IS NULL OR j.priority = cancel_queued.tier)
        FOR UPDATE SKIP LOCKED
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
        UPDATE pgqueue.jobs j SET priority = 'batch'
        WHERE j.tenant_id = p_tenant AND j.state = 'queued' AND j.priority = 'standard';
    END IF;
    RETURN why;
END
$$;
"""


def upgrade() -> None:
    op.execute(INDEXES)
    for statement in (
        QUEUE_DEPTH,
        JOBS_STARTED_SINCE,
        TENANT_SERVICE_IN,
        FAIRNESS_IN,
        CANCEL_QUEUED,
        DEMOTION_CHECK,
    ):
        op.execute(statement)


def downgrade() -> None:
    for statement in (
        QUEUE_DEPTH_BEFORE,
        TENANT_SERVICE_IN_BEFORE,
        FAIRNESS_IN_BEFORE,
        CANCEL_QUEUED_BEFORE,
        DEMOTION_CHECK_BEFORE,
    ):
        op.execute(statement)
    op.execute("DROP FUNCTION IF EXISTS pgqueue.jobs_started_since(timestamp with time zone)")
    op.execute(INDEXES_BEFORE)
