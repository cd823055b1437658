-- The claim's floor (an experiment of bench/cpu_per_job.py, system `pgqueue-floor`; never
-- part of a migration): pgqueue.claim_lanes with the scheduler taken out. It takes the oldest
-- due jobs (`ORDER BY run_at ... FOR UPDATE SKIP LOCKED`, as a plain queue does) and leases
-- them as pgqueue.claim_keyed does (running, attempt, lease; the update trigger keeps their
-- counters). No lanes, folds, keys, cursors or tier pick, and no rate limiter (the bench's
-- pgqueue.noop jobs never take from it). Everything around it stays as it is: the claim
-- entry points (pgqueue.claim_admitted), the jobs table with its indexes and triggers, the
-- worker, the batched completion. So a drain on this database prices the rest of pgqueue:
-- what a claim would cost if DRR and the tier pick were free. Its signature must stay the
-- real one's (tests/db/test_bench_floor.py: an old one added an overload and measured the
-- scheduler). Its statement is planned again at every claim (about 100k instructions a job
-- under callgrind, in a drain of claims of 10): with generic plans (plan_cache_mode) it cost
-- more still (945k against 645k a job), so it keeps custom plans; mind that in comparisons.

CREATE OR REPLACE FUNCTION pgqueue.claim_lanes(p_max integer, p_worker text,
                                               p_lease double precision, p_admit boolean,
                                               p_skip_kinds text[])
RETURNS TABLE(job pgqueue.jobs, blocked_seconds double precision)
LANGUAGE plpgsql
SET jit TO 'off'
AS $$
BEGIN
    RETURN QUERY
    WITH picked AS (
        SELECT q.id, q.tenant_id, q.run_at
        FROM pgqueue.jobs q
        WHERE q.state = 'queued' AND q.key_round IS NULL AND q.run_at <= now()
          AND q.kind <> ALL (coalesce(p_skip_kinds, '{}'))
        ORDER BY q.run_at
        LIMIT greatest(p_max, 0)
        FOR UPDATE SKIP LOCKED
    ), taken AS (
        UPDATE pgqueue.jobs j
        SET state = 'running', attempts = j.attempts + 1, started_at = now(),
            worker_id = p_worker, lease_token = gen_random_uuid(),
            lease_expires_at = now() + make_interval(secs => p_lease)
        FROM picked WHERE j.id = picked.id AND j.tenant_id = picked.tenant_id
        RETURNING j
    )
    SELECT t.j, NULL::double precision FROM taken t ORDER BY (t.j).run_at, (t.j).id;
END
$$;
