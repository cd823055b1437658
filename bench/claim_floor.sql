-- The claim's floor (an experiment of bench/cpu_per_job.py, system `pgqueue-floor`; never
-- part of a migration): pgqueue.claim_lanes with the scheduler's decisions taken out. It takes
-- the oldest due jobs (`ORDER BY run_at ... FOR UPDATE SKIP LOCKED`, as a plain queue does)
-- and leases them as pgqueue.claim_keyed does. No lanes, tiers, keys, folds or cursors, no
-- rate limiter. Everything around it stays as it is: the jobs table with its indexes and
-- triggers, the worker, the batched completion. So a drain on this database prices the rest
-- of pgqueue: what a claim would cost if the fair order were free.

CREATE OR REPLACE FUNCTION pgqueue.claim_lanes(p_max integer, p_worker text,
                                               p_lease double precision, p_admit boolean)
RETURNS TABLE(job pgqueue.jobs, blocked_seconds double precision)
LANGUAGE sql
AS $$
    WITH picked AS (
        SELECT j.id, j.tenant_id FROM pgqueue.jobs j
        WHERE j.state = 'queued' AND j.run_at <= now()
        ORDER BY j.run_at
        LIMIT p_max FOR UPDATE SKIP LOCKED
    ), taken AS (
        UPDATE pgqueue.jobs j
        SET state = 'running', attempts = j.attempts + 1, started_at = now(),
            worker_id = p_worker, lease_token = gen_random_uuid(),
            lease_expires_at = now() + make_interval(secs => p_lease)
        FROM picked WHERE j.id = picked.id AND j.tenant_id = picked.tenant_id
        RETURNING j.*
    )
    SELECT t, NULL::double precision FROM taken t
$$;
