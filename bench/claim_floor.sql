-- The claim's floor (an experiment of bench/cpu_per_job.py, system `pgqueue-floor`; never
-- part of a migration): pgqueue.drr_dispatch with the scheduler's decisions taken out. It
-- takes the oldest due jobs (`ORDER BY run_at ... FOR UPDATE SKIP LOCKED`, as a plain queue
-- does) and writes exactly what the real dispatch's batch write writes for them: the jobs
-- (running, attempt, lease) and their queued counters, with the update trigger skipped the
-- same way. No deficits, rounds, tier state or inbox. Everything around it stays as it is:
-- the scheduler's lock and the rate limiter (pgqueue.claim_admitted), the jobs table with
-- its indexes and triggers, the worker, the batched completion. So a drain on this database
-- prices the rest of pgqueue: what a claim would cost if DRR and the tier pick were free.

CREATE OR REPLACE FUNCTION pgqueue.drr_dispatch(max_jobs integer, worker_id text,
                                                lease_seconds double precision)
RETURNS TABLE (claim_tier pgqueue.tier, claim_round bigint, claimed pgqueue.jobs)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off  -- as the real one: a plan made on an empty queue stays for the session
SET jit = off
AS $$
BEGIN
    PERFORM set_config('pgqueue.claim_counted', pg_current_xact_id()::text, true);
    RETURN QUERY
    WITH taking AS (
        SELECT j.id, j.tenant_id, j.priority AS tier,
               row_number() OVER () AS ord
        FROM (SELECT q.id, q.tenant_id, q.priority
              FROM pgqueue.jobs q
              WHERE q.state = 'queued' AND q.run_at <= now()
              ORDER BY q.run_at
              LIMIT greatest(max_jobs, 0)
              FOR UPDATE SKIP LOCKED) j
    ), took AS (
        UPDATE pgqueue.jobs j
        SET state = 'running',
            attempts = j.attempts + 1,
            started_at = clock_timestamp(),
            worker_id = drr_dispatch.worker_id,
            lease_token = gen_random_uuid(),
            lease_expires_at = now() + make_interval(secs => lease_seconds)
        FROM taking x
        WHERE j.id = x.id AND j.tenant_id = x.tenant_id
        RETURNING x.ord, x.tier, j
    ), counted AS (
        INSERT INTO pgqueue.queue_counts AS c (tier, tenant_id, queued, claim_stripe)
        SELECT k.tier, k.tenant_id, -count(*), true
        FROM (SELECT t.tier, (t.j).tenant_id AS tenant_id FROM took t) k
        GROUP BY GROUPING SETS ((k.tier, k.tenant_id), (k.tier))
        ON CONFLICT (tier, (coalesce(tenant_id, ''))) WHERE claim_stripe
        DO UPDATE SET queued = c.queued + EXCLUDED.queued
    )
    SELECT took.tier, 0::bigint, took.j FROM took ORDER BY took.ord;
    PERFORM set_config('pgqueue.claim_counted', '', true);
END
$$;
