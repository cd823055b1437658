-- After the claim: the update trigger that keeps counters and usage in step
-- with every state change of a job (completion, retry, throttle, rescue, cancel), cancelling
-- jobs (queued or running: a running job loses its lease, fencing off its worker), and an
-- operator's retries of failed jobs (one, or in bulk).

-- Changed rows: queued counters, then the usage of successes with token counts charged to
-- their tenants' day and the budget rule (one upsert per tenant, in tenant order, so that
-- two batched completions cannot deadlock on usage rows). Jobs queued again lose their DRR
-- key through jobs_unstamp (070_scheduler.sql).
CREATE OR REPLACE FUNCTION pgqueue.jobs_after_update() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    tiers pgqueue.tier[];
    tenants text[];
    deltas bigint[];
    t text;
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
    IF tiers IS NOT NULL THEN
        PERFORM pgqueue.queue_counts_add(tiers, tenants, deltas);
    END IF;
    -- A claim, a heartbeat, a retry: nothing succeeded with usage, nothing to charge.
    IF NOT EXISTS (SELECT 1 FROM new_rows n
                   WHERE n.state = 'succeeded'
                     AND (n.input_tokens IS NOT NULL OR n.output_tokens IS NOT NULL)) THEN
        RETURN NULL;
    END IF;
    WITH charged AS (
        INSERT INTO pgqueue.usage_daily AS u (tenant_id, day, requests, input_tokens,
                                              output_tokens)
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
            output_tokens = u.output_tokens + EXCLUDED.output_tokens
        RETURNING u.tenant_id
    )
    SELECT array_agg(c.tenant_id ORDER BY c.tenant_id COLLATE "C") INTO tenants FROM charged c;
    FOREACH t IN ARRAY coalesce(tenants, '{}') LOOP
        PERFORM pgqueue.demotion_check(t);
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_after_update
    AFTER UPDATE ON pgqueue.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgqueue.jobs_after_update();

-- Whether this session's login role may write pgqueue.jobs itself (UPDATE privilege: the
-- owner, superusers, pgqueue_worker and pgqueue_admin after `pgqueue grant`). A role that
-- may not (pgqueue_producer: it reads only its tenant's jobs, by row-level security on
-- pgqueue.tenant_id) may cancel only with that scope set, and only that tenant's jobs. Asked
-- of the privilege, not of role names: a membership of pgqueue_producer held for another
-- database must not restrict this database's owner (found by a tester).
CREATE OR REPLACE FUNCTION pgqueue.session_writes_jobs()
RETURNS boolean
LANGUAGE sql
STABLE
AS $$ SELECT pg_catalog.has_table_privilege(session_user, 'pgqueue.jobs', 'UPDATE') $$;

-- The tenant this session is confined to, or NULL when it may act for any tenant. A session
-- whose login role may write pgqueue.jobs (session_writes_jobs: owner, superuser, workers,
-- admins) is not bound to a tenant; any other session whose login role is, or is a member of,
-- a role of pgqueue.tenant_roles is confined to that role's tenant, whatever it sets
-- (42501 when its roles name two tenants); else the tenant it sets in pgqueue.tenant_id, a
-- narrowing an unbound (multi-tenant) producer chooses for itself. Runs as its owner, so that
-- producers need no privilege on pgqueue.tenant_roles.
CREATE OR REPLACE FUNCTION pgqueue.session_tenant_scope()
RETURNS text
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pgqueue, pg_temp
AS $$
DECLARE
    bound text[];
BEGIN
    IF pgqueue.session_writes_jobs() THEN
        RETURN nullif(current_setting('pgqueue.tenant_id', true), '');
    END IF;
    SELECT array_agg(DISTINCT b.tenant_id) INTO bound
    FROM pgqueue.tenant_roles b
    JOIN pg_catalog.pg_roles r ON r.rolname = b.role_name
    WHERE pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER');
    IF cardinality(bound) > 1 THEN
        RAISE EXCEPTION 'the roles of this session are bound to more than one tenant: %',
            array_to_string(bound, ', ') USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN coalesce(bound[1], nullif(current_setting('pgqueue.tenant_id', true), ''));
END
$$;

-- Cancel one job (the rules are in the body's comments below).
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

-- The ids of a tenant's queued jobs, of one tier (p_tier) or all (NULL), as they stand in this
-- statement's snapshot: the unstamped ones by jobs_unstamped_tenant_idx, the stamped ones (a
-- few DRR rounds' worth of every backlogged tenant) by jobs_claim_idx (revision 0060: no index
-- holds every queued job by tenant, as every stamp would write an entry in it). `IS TRUE`
-- keeps the planner off jobs_pkey, whose second column is tenant_id (a scan of all of it).
-- Callers join the rows back by the primary key, so that each row changed meanwhile is
-- checked again at its newest version by its own join (revision 0063; by `ctid = ANY (list)`
-- that check searched the whole list: a tester's cancel of 60,000 jobs under three workers
-- took 2-5 minutes instead of 1 s). pgqueue.cancel_queued, pgqueue.demotion_check.
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

-- Cancel the queued jobs of a tenant, of one tier or all (rules in the body's comments).
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

-- The live (queued or running) job of a tenant that holds a dedupe key, as this statement
-- sees the jobs; NULL for none, or for a NULL key. jobs_dedupe_live_idx lets one live job hold
-- a key. pgqueue.requeue_job, pgqueue.retry_failed_outcomes.
CREATE OR REPLACE FUNCTION pgqueue.dedupe_holder(p_tenant text, p_key text)
RETURNS bigint
LANGUAGE sql STABLE
AS $$
    SELECT l.id FROM pgqueue.jobs l
    WHERE l.tenant_id = p_tenant AND l.dedupe_key = p_key AND l.state IN ('queued', 'running')
$$;

-- Put one failed or cancelled job, which the caller holds locked, back in the queue with fresh
-- attempt and throttle counters, due now; last_error is kept until the next attempt overwrites
-- it. Unless a live job of its tenant holds its dedupe key: then requeued is false and held_by
-- that job's id (NULL when this statement cannot see it: committed after the snapshot of a
-- REPEATABLE READ transaction). A holder enqueued or re-queued concurrently makes the UPDATE
-- wait for it and fail with a unique violation once it commits; that is caught here (a
-- subtransaction), never raised. The counters (queue_counts) and the DRR bookkeeping follow
-- through the jobs triggers. pgqueue.retry, pgqueue.retry_failed_outcomes (revision 0070).
CREATE OR REPLACE FUNCTION pgqueue.requeue_job(p_id bigint, p_tenant text,
                                               OUT requeued boolean, OUT held_by bigint)
LANGUAGE plpgsql
AS $$
DECLARE
    key text;
    violated text;
BEGIN
    SELECT j.dedupe_key INTO key FROM pgqueue.jobs j WHERE j.id = p_id AND j.tenant_id = p_tenant;
    held_by := pgqueue.dedupe_holder(p_tenant, key);
    requeued := held_by IS NULL;
    IF NOT requeued THEN
        RETURN;
    END IF;
    BEGIN
        UPDATE pgqueue.jobs j
        SET state = 'queued', attempts = 0, throttle_retries = 0, run_at = now(),
            finished_at = NULL
        WHERE j.id = p_id AND j.tenant_id = p_tenant;
    EXCEPTION WHEN unique_violation THEN
        GET STACKED DIAGNOSTICS violated = CONSTRAINT_NAME;
        IF violated IS DISTINCT FROM 'jobs_dedupe_live_idx' THEN
            RAISE;
        END IF;
        held_by := pgqueue.dedupe_holder(p_tenant, key);  -- a new snapshot: committed now
        requeued := false;
    END;
END
$$;

-- Retry one failed or cancelled job (the dashboard's "retry"; revision 0034).
CREATE OR REPLACE FUNCTION pgqueue.retry(job_id bigint, tenant_id text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
-- Put one failed or cancelled job back in the queue with fresh attempt and throttle counters,
-- due now (pgqueue.requeue_job); returns its state after the call: 'queued', or its state
-- unchanged when it was not failed or cancelled. last_error is kept until the next attempt
-- overwrites it (as pgqueue.retry_failed does). With `tenant_id`, only that tenant's job.
-- Raises PQ011 when there is no such job, PQ009 for a NULL job_id, and PQ013 when a live
-- (queued or running) job of its tenant holds its dedupe key (revision 0070: before, the raw
-- unique violation of jobs_dedupe_live_idx): the message names the job, the key and the live
-- job, DETAIL holds them as JSON (job_id, tenant_id, dedupe_key, held_by; held_by NULL when
-- that job committed after this transaction's snapshot).
DECLARE
    found_state pgqueue.job_state;
    found_tenant text;
    found_key text;
    outcome record;
BEGIN
    IF retry.job_id IS NULL THEN
        RAISE EXCEPTION 'job_id must not be NULL' USING ERRCODE = 'PQ009';
    END IF;
    SELECT j.state, j.tenant_id, j.dedupe_key INTO found_state, found_tenant, found_key
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
    SELECT * INTO outcome FROM pgqueue.requeue_job(retry.job_id, found_tenant);
    IF NOT outcome.requeued THEN
        RAISE EXCEPTION USING ERRCODE = 'PQ013', MESSAGE = format(
            'job %s not retried: its dedupe key %s (tenant %s) is held by %s', retry.job_id,
            quote_literal(found_key), quote_literal(found_tenant),
            coalesce('live job ' || outcome.held_by, 'a live job committed meanwhile')),
            DETAIL = json_build_object('job_id', retry.job_id, 'tenant_id', found_tenant,
                                       'dedupe_key', found_key,
                                       'held_by', outcome.held_by)::text,
            HINT = 'retry it once that job has finished, or cancel that job first';
    END IF;
    RETURN 'queued';
END
$$;

-- Re-queue failed jobs in bulk, job by job (`pgqueue retry`, the dashboard's "re-queue a
-- tenant's failed jobs"; revision 0070).
CREATE OR REPLACE FUNCTION pgqueue.retry_failed_outcomes(tenant_id text DEFAULT NULL,
                                                         tier pgqueue.tier DEFAULT NULL,
                                                         reason text DEFAULT NULL,
                                                         since timestamptz DEFAULT NULL,
                                                         until timestamptz DEFAULT NULL)
RETURNS TABLE(id bigint, requeued boolean, dedupe_key text, held_by bigint)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
-- Re-queue the failed jobs that match every filter given (NULL: any) with fresh attempt and
-- throttle counters, due now; returns one row per job that matched: requeued true, or false
-- when a live (queued or running) job of its tenant holds its dedupe key, held_by that job
-- (NULL when this transaction cannot see it). Of failed jobs sharing a key, the newest (the
-- highest id) is re-queued and holds it. `reason` is a substring of last_error, matched
-- literally and case-insensitively; since/until bound finished_at (until excluded).
-- last_error is kept until the next attempt overwrites it.
DECLARE
    picked bigint[];
    ids bigint[];
    ok boolean[];
    keys text[];
    holders bigint[];
    job record;
    outcome record;
    attempt integer;
BEGIN
    -- The matching jobs, locked in id order: a concurrent retry of the same jobs waits here,
    -- then finds the ones it re-queued no longer failed.
    picked := ARRAY(
        SELECT j.id FROM pgqueue.jobs j
        WHERE j.state = 'failed'
          AND (retry_failed_outcomes.tenant_id IS NULL
               OR j.tenant_id = retry_failed_outcomes.tenant_id)
          AND (retry_failed_outcomes.tier IS NULL OR j.priority = retry_failed_outcomes.tier)
          AND (retry_failed_outcomes.reason IS NULL
               OR strpos(lower(j.last_error), lower(retry_failed_outcomes.reason)) > 0)
          AND (retry_failed_outcomes.since IS NULL
               OR j.finished_at >= retry_failed_outcomes.since)
          AND (retry_failed_outcomes.until IS NULL
               OR j.finished_at < retry_failed_outcomes.until)
        ORDER BY j.id
        FOR UPDATE OF j);
    -- One statement: a job whose dedupe key a live job holds, or a newer failed job of the
    -- same key, is left failed (a job without a key: nothing holds it). A live job that takes
    -- one of these keys after the statement's snapshot (an enqueue or a retry, concurrent)
    -- makes it fail with a unique violation: it runs again, with a new snapshot that sees
    -- that job (READ COMMITTED).
    FOR attempt IN 1 .. 3 LOOP
        BEGIN
            WITH judged AS (
                SELECT j.id, j.tenant_id, j.dedupe_key,
                       CASE WHEN j.dedupe_key IS NOT NULL THEN coalesce(
                           pgqueue.dedupe_holder(j.tenant_id, j.dedupe_key),
                           nullif(max(j.id) OVER (PARTITION BY j.tenant_id, j.dedupe_key), j.id))
                       END AS holder
                FROM pgqueue.jobs j
                WHERE j.id = ANY (picked)
            ), updated AS (
                UPDATE pgqueue.jobs j
                SET state = 'queued', attempts = 0, throttle_retries = 0, run_at = now(),
                    finished_at = NULL
                FROM judged g
                WHERE j.id = g.id AND j.tenant_id = g.tenant_id AND g.holder IS NULL
                RETURNING j.id
            )
            SELECT array_agg(g.id), array_agg(u.id IS NOT NULL), array_agg(g.dedupe_key),
                   array_agg(g.holder)
            INTO ids, ok, keys, holders
            FROM judged g LEFT JOIN updated u ON u.id = g.id;
            RETURN QUERY SELECT * FROM unnest(ids, ok, keys, holders);
            RETURN;
        EXCEPTION WHEN unique_violation THEN
            NULL;
        END;
    END LOOP;
    -- Still failing (a REPEATABLE READ snapshot never sees that job, or the races went on):
    -- one job at a time, newest first (pgqueue.requeue_job). Slower: each UPDATE runs the
    -- jobs triggers, which write the same counter rows again (about 3 ms a job at 10,000).
    FOR job IN
        SELECT j.id, j.tenant_id, j.dedupe_key FROM pgqueue.jobs j
        WHERE j.id = ANY (picked)
        ORDER BY j.id DESC
    LOOP
        SELECT * INTO outcome FROM pgqueue.requeue_job(job.id, job.tenant_id);
        id := job.id;
        requeued := outcome.requeued;
        dedupe_key := job.dedupe_key;
        held_by := outcome.held_by;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Re-queue failed jobs in bulk (revision 0034): pgqueue.retry_failed_outcomes, returning the
-- ids re-queued only.
CREATE OR REPLACE FUNCTION pgqueue.retry_failed(tenant_id text DEFAULT NULL,
                                                tier pgqueue.tier DEFAULT NULL,
                                                reason text DEFAULT NULL,
                                                since timestamptz DEFAULT NULL,
                                                until timestamptz DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE sql
AS $$
-- The ids of the failed jobs re-queued by pgqueue.retry_failed_outcomes (same filters), which
-- skips a job whose dedupe key a live job holds (revision 0070: before, such a job failed the
-- whole call with a unique violation of jobs_dedupe_live_idx, and nothing was re-queued).
    SELECT r.id
    FROM pgqueue.retry_failed_outcomes(retry_failed.tenant_id, retry_failed.tier,
                                       retry_failed.reason, retry_failed.since,
                                       retry_failed.until) AS r
    WHERE r.requeued
$$;
