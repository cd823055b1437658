-- A one-statement DRR claim, priced (an experiment of bench/cpu_per_job.py, system
-- `pgqueue-one-statement`; never part of a migration, and NOT the scheduler's semantics).
--
-- It does the work a set-based dispatch would have to do and no more: read the first pairs of
-- each tier's round (deficit, position, the tenant's quantum), read each pair's due jobs up to
-- what one turn's credit covers (cost >= 1), order them by the DRR closed form (the turn in
-- which a job's cumulative cost fits its pair's deficit plus that many quanta, then the pair's
-- position), take the first max_jobs, and write the jobs, the served pairs' deficits and
-- positions (to the tail of the round), the tier state and the queued counters. What it
-- leaves out: the tier pick (tiers in strict order here), a second turn within a claim,
-- waiting pairs, most of the inbox fold, the round skip, the rate limiter's interplay, and
-- the row locks (the real dispatch and the floor lock the jobs they read FOR UPDATE SKIP
-- LOCKED; this updates them unlocked). It also reads two pairs of every tier where strict
-- order mostly serves one (2.2 job rows read per job taken, the real dispatch 1.8; a version
-- reading the first tier with work only measured the same, within the noise). So it prices
-- one set-based design in this schema, not a bound; it decides nothing correctly.

CREATE OR REPLACE FUNCTION pgqueue.drr_dispatch(max_jobs integer, worker_id text,
                                                lease_seconds double precision)
RETURNS TABLE (claim_tier pgqueue.tier, claim_round bigint, claimed pgqueue.jobs)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off  -- as the real one: a plan made on an empty queue stays for the session
SET jit = off
AS $$
DECLARE
    base constant double precision := pgqueue.base_quantum();
BEGIN
    IF EXISTS (SELECT 1 FROM pgqueue.drr_inbox) THEN
        -- new pairs join their rounds' tails (crudely: far past every position in use)
        WITH drained AS (
            DELETE FROM pgqueue.drr_inbox RETURNING tier, tenant_id
        ), fresh AS (
            SELECT DISTINCT x.tier, x.tenant_id FROM drained x
        )
        INSERT INTO pgqueue.deficits AS d (tenant_id, tier, refill_offset, pos)
        SELECT f.tenant_id, f.tier, pgqueue.refill_offset(f.tenant_id),
               ts.next_pos + row_number() OVER (PARTITION BY f.tier ORDER BY f.tenant_id)
        FROM fresh f JOIN pgqueue.tier_state ts ON ts.tier = f.tier
        ON CONFLICT (tenant_id, tier) DO UPDATE SET pos = EXCLUDED.pos WHERE d.pos IS NULL;
        UPDATE pgqueue.tier_state SET next_pos = next_pos + 1000000;
    END IF;
    PERFORM set_config('pgqueue.claim_counted', pg_current_xact_id()::text, true);
    FOR attempt IN 1 .. 4 LOOP  -- again when the pairs read had nothing due (they left)
    RETURN QUERY
    WITH pairs AS MATERIALIZED (
        SELECT d.tier, d.tenant_id, d.deficit, d.pos,
               (SELECT pgqueue.plan_quantum(tn.plan, tn.quantum, base)
                FROM pgqueue.tenants tn WHERE tn.tenant_id = d.tenant_id OFFSET 0) AS quantum
        FROM unnest('{critical,standard,batch}'::pgqueue.tier[]) AS t(tier)
        CROSS JOIN LATERAL (
            SELECT r.tier, r.tenant_id, r.deficit, r.pos
            FROM pgqueue.deficits r
            WHERE r.tier = t.tier AND r.pos IS NOT NULL
            ORDER BY r.pos
            LIMIT greatest(2, max_jobs / 5)
        ) d
    ), heads AS MATERIALIZED (
        SELECT p.tier, p.tenant_id, p.deficit, p.pos, p.quantum, h.id, h.cost,
               sum(h.cost) OVER (PARTITION BY p.tier, p.tenant_id
                                 ORDER BY h.run_at, h.id) AS cum
        FROM pairs p
        CROSS JOIN LATERAL (
            SELECT j.id, j.cost, j.run_at
            FROM pgqueue.jobs j
            WHERE j.state = 'queued' AND j.tenant_id = p.tenant_id AND j.priority = p.tier
              AND j.run_at <= now()
            ORDER BY j.run_at, j.id
            LIMIT least(max_jobs, floor(p.deficit + p.quantum)::integer)
        ) h
    ), picked AS MATERIALIZED (
        SELECT x.*, row_number() OVER (ORDER BY x.tier, x.turn, x.pos, x.cum) AS ord
        FROM (SELECT hd.*,
                     greatest(1, ceil((hd.cum - hd.deficit) / hd.quantum))::bigint AS turn
              FROM heads hd) x
        ORDER BY x.tier, x.turn, x.pos, x.cum
        LIMIT max_jobs
    ), took AS (
        UPDATE pgqueue.jobs j
        SET state = 'running',
            attempts = j.attempts + 1,
            started_at = clock_timestamp(),
            worker_id = drr_dispatch.worker_id,
            lease_token = gen_random_uuid(),
            lease_expires_at = now() + make_interval(secs => lease_seconds)
        FROM picked x
        WHERE j.id = x.id AND j.tenant_id = x.tenant_id
        RETURNING x.ord, x.tier, x.turn, x.pos, x.deficit, x.quantum, j
    ), served AS (
        SELECT t.tier, (t.j).tenant_id AS tenant_id, min(t.pos) AS pos,
               max(t.turn) AS turns, min(t.deficit) AS deficit, min(t.quantum) AS quantum,
               sum((t.j).cost) AS spent,
               row_number() OVER (PARTITION BY t.tier ORDER BY min(t.pos)) AS k
        FROM took t
        GROUP BY t.tier, (t.j).tenant_id
    ), moved AS (
        UPDATE pgqueue.deficits d
        SET deficit = greatest(0, s.deficit + s.turns * s.quantum - s.spent),
            pos = ts.next_pos + s.k
        FROM served s
        JOIN pgqueue.tier_state ts ON ts.tier = s.tier
        WHERE d.tier = s.tier AND d.tenant_id = s.tenant_id
    ), saved AS (
        UPDATE pgqueue.tier_state ts
        SET next_pos = ts.next_pos + m.n + 1, round = ts.round + 1
        FROM (SELECT s.tier, count(*) AS n FROM served s GROUP BY s.tier) m
        WHERE ts.tier = m.tier
    ), emptied AS (
        UPDATE pgqueue.deficits d SET pos = NULL, deficit = 0
        FROM pairs p
        WHERE d.tier = p.tier AND d.tenant_id = p.tenant_id
          AND NOT EXISTS (SELECT 1 FROM heads h
                          WHERE h.tier = p.tier AND h.tenant_id = p.tenant_id)
    ), counted AS (
        INSERT INTO pgqueue.queue_counts AS c (tier, tenant_id, queued, claim_stripe)
        SELECT k.tier, k.tenant_id, -count(*), true
        FROM (SELECT t.tier, (t.j).tenant_id AS tenant_id FROM took t) k
        GROUP BY GROUPING SETS ((k.tier, k.tenant_id), (k.tier))
        ON CONFLICT (tier, (coalesce(tenant_id, ''))) WHERE claim_stripe
        DO UPDATE SET queued = c.queued + EXCLUDED.queued
    )
    SELECT took.tier, took.turn, took.j FROM took ORDER BY took.ord;
    EXIT WHEN FOUND;
    END LOOP;
    PERFORM set_config('pgqueue.claim_counted', '', true);
END
$$;
