-- Least privilege (`pgqueue grant`): three group roles, grants, tenant scoping and row-level
-- security. Idempotent; safe to run again after every `pgqueue migrate`.

-- name: security_grant :exec
DO $grant$
DECLARE
    r text;
    f regprocedure;
BEGIN
    FOREACH r IN ARRAY ARRAY['pgqueue_producer', 'pgqueue_worker', 'pgqueue_admin'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- created meanwhile by a concurrent grant (roles are cluster-wide)
            END;
        END IF;
    END LOOP;

    GRANT USAGE ON SCHEMA pgqueue TO pgqueue_producer, pgqueue_worker, pgqueue_admin;

    -- Functions: nobody but these roles may call them.
    REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgqueue FROM PUBLIC;
    GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgqueue TO pgqueue_worker, pgqueue_admin;

    -- Producers write only through (try_)enqueue(_many) and cancel(_queued), which run as
    -- their owner (SECURITY DEFINER with a fixed search_path) and check the session's tenant
    -- scope.
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = 'pgqueue'::regnamespace
          AND p.proname IN ('enqueue', 'enqueue_many', 'try_enqueue', 'try_enqueue_many',
                            'try_enqueue_batch', 'cancel', 'cancel_queued')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, pgqueue, pg_temp', f);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO pgqueue_producer', f);
    END LOOP;
    GRANT SELECT ON pgqueue.jobs, pgqueue.usage_daily TO pgqueue_producer;

    -- Workers: claim, complete, heartbeat, rescue, limiter, demotion: all DML in the schema.
    GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgqueue TO pgqueue_worker;
    GRANT USAGE ON ALL SEQUENCES IN SCHEMA pgqueue TO pgqueue_worker;
    -- Workers vacuum the claim's small, hot tables and analyze pgqueue.jobs when its
    -- statistics are stale (maintenance.sql): Postgres 17 and newer have a privilege for it;
    -- before that only the tables' owner can.
    IF current_setting('server_version_num')::int >= 170000 THEN
        EXECUTE 'GRANT MAINTAIN ON pgqueue.lane_tiers, pgqueue.flows, pgqueue.cursors, pgqueue.queue_counts, pgqueue.rate_limits, pgqueue.jobs TO pgqueue_worker';
    END IF;
    GRANT ALL ON ALL TABLES IN SCHEMA pgqueue TO pgqueue_admin;
    -- Which tenant a role acts for is the admins' to say: workers only read it.
    REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON pgqueue.tenant_roles FROM pgqueue_worker;
    -- Row-level security asks it for every producer's query.
    GRANT EXECUTE ON FUNCTION pgqueue.session_tenant_scope() TO pgqueue_producer;
    GRANT ALL ON ALL SEQUENCES IN SCHEMA pgqueue TO pgqueue_admin;

    -- A session confined to a tenant (pgqueue.session_tenant_scope: the tenant its role is
    -- bound to in pgqueue.tenant_roles, whatever it sets; else the one it sets) enqueues only
    -- that tenant's jobs.
    CREATE OR REPLACE FUNCTION pgqueue.jobs_tenant_scope()
    RETURNS trigger
    LANGUAGE plpgsql
    AS $fn$
    DECLARE
        scope text := coalesce(pgqueue.session_tenant_scope(), '');
    BEGIN
        IF scope <> '' AND EXISTS (SELECT 1 FROM new_rows n WHERE n.tenant_id <> scope) THEN
            RAISE EXCEPTION 'this session may only enqueue jobs of tenant %', quote_literal(scope)
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN NULL;
    END
    $fn$;
    DROP TRIGGER IF EXISTS jobs_tenant_scope ON pgqueue.jobs;
    CREATE TRIGGER jobs_tenant_scope
        AFTER INSERT ON pgqueue.jobs
        REFERENCING NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.jobs_tenant_scope();
    -- Created after the REVOKE above, it starts executable by PUBLIC (found by a tester:
    -- only a second `pgqueue grant` revoked it).
    REVOKE EXECUTE ON FUNCTION pgqueue.jobs_tenant_scope() FROM PUBLIC;
    GRANT EXECUTE ON FUNCTION pgqueue.jobs_tenant_scope() TO pgqueue_worker, pgqueue_admin;

    -- Row-level security: producers see their tenant's rows only (the scope is computed once
    -- per query, as an init plan); workers and admins all.
    ALTER TABLE pgqueue.jobs ENABLE ROW LEVEL SECURITY;
    ALTER TABLE pgqueue.usage_daily ENABLE ROW LEVEL SECURITY;
    DROP POLICY IF EXISTS jobs_producer_own ON pgqueue.jobs;
    CREATE POLICY jobs_producer_own ON pgqueue.jobs FOR SELECT TO pgqueue_producer
        USING (tenant_id = (SELECT pgqueue.session_tenant_scope()));
    DROP POLICY IF EXISTS jobs_operators_all ON pgqueue.jobs;
    CREATE POLICY jobs_operators_all ON pgqueue.jobs FOR ALL TO pgqueue_worker, pgqueue_admin
        USING (true) WITH CHECK (true);
    DROP POLICY IF EXISTS usage_producer_own ON pgqueue.usage_daily;
    CREATE POLICY usage_producer_own ON pgqueue.usage_daily FOR SELECT TO pgqueue_producer
        USING (tenant_id = (SELECT pgqueue.session_tenant_scope()));
    DROP POLICY IF EXISTS usage_operators_all ON pgqueue.usage_daily;
    CREATE POLICY usage_operators_all ON pgqueue.usage_daily FOR ALL
        TO pgqueue_worker, pgqueue_admin USING (true) WITH CHECK (true);
END
$grant$

-- name: security_granted :one
-- Has `pgqueue grant` been run in this database (the producer role can use the schema)?
-- Migrations re-run it afterwards: a replaced function loses SECURITY DEFINER, and a new one
-- starts executable by PUBLIC.
SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgqueue_producer')
             OR NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'pgqueue')
            THEN false
            ELSE has_schema_privilege('pgqueue_producer', 'pgqueue', 'USAGE') END AS granted

-- name: security_restrict_advisory_locks :exec
-- `pgqueue grant --restrict-advisory-locks` (a superuser only; this database only): Postgres
-- lets every role take every advisory lock, and pgqueue's are fixed keys (the scheduler's,
-- migrations'; the rescuer, the pruner and demotions lock rows since revision 0041). Found by
-- a hostile tester (issue 32): a tenant's role that held the scheduler's key
-- (pg_advisory_lock) stopped every claim of every worker. This takes the advisory lock functions from PUBLIC and gives them to
-- pgqueue_worker, pgqueue_admin and the role running it (which migrates); any other role of
-- this database (yours too) loses them: grant them back to those that need them.
DO $restrict$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname LIKE 'pg\_%advisory%'
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO pgqueue_worker, pgqueue_admin, %I',
                       f, current_user);
    END LOOP;
END
$restrict$
