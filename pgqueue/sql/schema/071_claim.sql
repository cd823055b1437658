-- The claim entry points workers call: pgqueue.claim (the fair order alone) and
-- pgqueue.claim_admitted (only jobs the provider's limits let through now). Both take from
-- every lane with due work (pgqueue.claim_lanes), in each lane and tier in key order
-- (070_scheduler.sql). No lock is shared across claimers. docs/drr.md explains the design.

-- The tier-pick policy: GUC pgqueue.tier_policy (weighted | probabilistic | strict; another
-- value raises PQ012, as a bad numeric setting does: pgqueue.setting_value).
CREATE OR REPLACE FUNCTION pgqueue.tier_policy()
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    name text := lower(btrim(coalesce(
        nullif(current_setting('pgqueue.tier_policy', true), ''), 'weighted')));
BEGIN
    IF name NOT IN ('weighted', 'probabilistic', 'strict') THEN
        RAISE EXCEPTION 'unknown tier policy %: pgqueue.tier_policy must be weighted, '
            'probabilistic or strict', quote_literal(name) USING ERRCODE = 'PQ012';
    END IF;
    RETURN name;
END
$$;

-- A tier's weight under the weighted policy: GUC pgqueue.tier_weight_<tier>, else 70/25/5.
CREATE OR REPLACE FUNCTION pgqueue.tier_weight(p_tier pgqueue.tier)
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT pgqueue.setting('tier_weight_' || p_tier::text,
                           CASE p_tier WHEN 'critical' THEN 70 WHEN 'standard' THEN 25 ELSE 5 END)
$$;

-- The lanes and tiers with unstamped due jobs, and the latest due run_at of each: a skip scan
-- from the end of jobs_unstamped_due_idx, one probe per pair (and one more where the pair's
-- last job is not due yet; from the start, each probe stepped over the entries of the jobs
-- stamped since, the oldest first). (As EXISTS, with no statistics on new rows yet, a hash
-- semi join read every unstamped job: 450 ms a claim; without the ORDER BY, a Seq Scan.)
CREATE OR REPLACE FUNCTION pgqueue.lane_tiers_due()
RETURNS TABLE(lane text, tier pgqueue.tier, due_at timestamp with time zone)
LANGUAGE sql STABLE
AS $$
    WITH RECURSIVE s(lane, tier, run_at) AS (
        (SELECT j.lane, j.priority, j.run_at FROM pgqueue.jobs j
         WHERE j.state = 'queued' AND j.key_round IS NULL
         ORDER BY j.lane DESC, j.priority DESC, j.run_at DESC LIMIT 1)
        UNION ALL
        SELECT n.lane, n.priority, n.run_at FROM s, LATERAL (
            SELECT j.lane, j.priority, j.run_at FROM pgqueue.jobs j
            WHERE j.state = 'queued' AND j.key_round IS NULL
              AND (j.lane, j.priority) < (s.lane, s.tier)
            ORDER BY j.lane DESC, j.priority DESC, j.run_at DESC LIMIT 1) n
    )
    SELECT s.lane, s.tier, d.due_at FROM s
    CROSS JOIN LATERAL (
        SELECT CASE WHEN s.run_at <= now() THEN s.run_at
                    ELSE (SELECT j.run_at FROM pgqueue.jobs j
                          WHERE j.lane = s.lane AND j.priority = s.tier AND j.state = 'queued'
                            AND j.key_round IS NULL AND j.run_at <= now()
                          ORDER BY j.run_at DESC LIMIT 1) END AS due_at) d
    WHERE d.due_at IS NOT NULL
$$;

-- The lanes and tiers a claim folds first: those with unstamped due jobs where a fold has
-- work to do: no fold yet, jobs due since the last one (less the arrival margin of
-- pgqueue.stamp, for a job whose transaction began before that fold and committed after),
-- stamped work within the frontier down to less than half the horizon (pgqueue.stamp extends
-- the flows it cut), or the fold's once-a-second look at every tenant is due. Otherwise the
-- claim takes what is stamped: a fold on every claim cost more than the claim itself. A claim
-- that reaches a frontier folds that pair on the spot (claim_lanes).
CREATE OR REPLACE FUNCTION pgqueue.lane_tiers_to_fold()
RETURNS TABLE(lane text, tier pgqueue.tier)
LANGUAGE sql STABLE
AS $$
    SELECT u.lane, u.tier FROM pgqueue.lane_tiers_due() u
    LEFT JOIN pgqueue.lane_tiers l ON l.lane = u.lane AND l.tier = u.tier
    WHERE l.lane IS NULL OR l.full_at < now() - interval '1 second'
       OR u.due_at >= l.folded_at - pgqueue.setting('stamp_arrival_margin', 0.1)
                                    * interval '1 second'
       OR (l.frontier_round IS NOT NULL
           AND coalesce((SELECT j.key_round FROM pgqueue.jobs j
                         WHERE j.lane = u.lane AND j.priority = u.tier AND j.state = 'queued'
                           AND j.key_round IS NOT NULL
                         ORDER BY j.key_round, j.key_place, j.key_seq LIMIT 1),
                        l.frontier_round)
               > l.frontier_round - pgqueue.setting('stamp_horizon_rounds', 4) / 2)
$$;

-- The lanes and tiers with stamped jobs, and the head job of each in key order.
CREATE OR REPLACE FUNCTION pgqueue.lane_tiers_stamped()
RETURNS TABLE(lane text, tier pgqueue.tier, id bigint, kind text, model text)
LANGUAGE sql STABLE
AS $$
    WITH RECURSIVE s(lane, tier, id, kind, model) AS (
        (SELECT j.lane, j.priority, j.id, j.kind, j.model FROM pgqueue.jobs j
         WHERE j.state = 'queued' AND j.key_round IS NOT NULL
         ORDER BY j.lane, j.priority, j.key_round, j.key_place, j.key_seq LIMIT 1)
        UNION ALL
        SELECT n.* FROM s, LATERAL (
            SELECT j.lane, j.priority, j.id, j.kind, j.model FROM pgqueue.jobs j
            WHERE j.state = 'queued' AND j.key_round IS NOT NULL
              AND (j.lane, j.priority) > (s.lane, s.tier)
            ORDER BY j.lane, j.priority, j.key_round, j.key_place, j.key_seq LIMIT 1) n
    )
    SELECT * FROM s
$$;

-- Whether the horizon left due jobs of this lane and tier unstamped (claims stop at its
-- frontier until a fold goes on): the tier is still backlogged.
CREATE OR REPLACE FUNCTION pgqueue.lane_tier_cut(p_lane text, p_tier pgqueue.tier)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (SELECT FROM pgqueue.lane_tiers l
                   WHERE l.lane = p_lane AND l.tier = p_tier AND l.frontier_round IS NOT NULL)
$$;

-- Whether a claimed job goes to the batches lane (docs/batches.md) instead of the Messages
-- API: a batch-tier anthropic.messages job of a tenant whose lane is on (its own batch_lane
-- row, else the '' row, else off), unless one of its requests already expired in a batch
-- (then it goes to the Messages API). Such a job takes nothing from the provider limiter.
CREATE OR REPLACE FUNCTION pgqueue.batch_lane_takes(job_id bigint, tenant_id text,
                                                    priority pgqueue.tier, kind text)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT batch_lane_takes.priority = 'batch' AND batch_lane_takes.kind = 'anthropic.messages'
       AND coalesce((SELECT l.enabled FROM pgqueue.batch_lane l
                     WHERE l.tenant_id = batch_lane_takes.tenant_id),
                    (SELECT l.enabled FROM pgqueue.batch_lane l WHERE l.tenant_id = ''),
                    false)
       AND NOT EXISTS (SELECT 1 FROM pgqueue.batch_jobs b
                       WHERE b.job_id = batch_lane_takes.job_id
                         AND b.tenant_id = batch_lane_takes.tenant_id
                         AND b.outcome = 'expired')
$$;

-- Claim up to p_max jobs of one lane and tier in key order (pgqueue.claim_keyed); where they
-- run out at the frontier (the horizon left jobs unstamped), fold it, if no one else is
-- folding it, and go on.
CREATE OR REPLACE FUNCTION pgqueue.claim_tier(p_lane text, p_tier pgqueue.tier, p_max integer,
                                              p_worker text, p_lease double precision)
RETURNS SETOF pgqueue.jobs
LANGUAGE plpgsql
AS $$
DECLARE
    got integer := 0;
    k integer;
BEGIN
    LOOP
        RETURN QUERY SELECT * FROM pgqueue.claim_keyed(p_lane, ARRAY[p_tier], ARRAY[p_max - got],
                                                       p_worker, p_lease);
        GET DIAGNOSTICS k = ROW_COUNT;
        got := got + k;
        EXIT WHEN got >= p_max OR NOT pgqueue.lane_tier_cut(p_lane, p_tier)
                  OR pgqueue.fold(p_lane, p_tier) = 0;
    END LOOP;
END
$$;

-- How many of `n` slots each of a lane's backlogged tiers (`tiers`, highest first) gets, by
-- pgqueue.tier_policy(): strict gives them all to the first; weighted draws each slot's tier
-- at random by weight (pgqueue.tier_weight), so no row is written to keep the shares: in
-- expectation each tier gets its weight's share of the slots; probabilistic takes critical
-- with probability 0.9 when it is backlogged, else standard:batch 25:5 (the article's rule).
CREATE OR REPLACE FUNCTION pgqueue.tier_slots(tiers pgqueue.tier[], n integer)
RETURNS integer[]
LANGUAGE plpgsql
AS $$
DECLARE
    policy constant text := pgqueue.tier_policy();
    slots integer[] := array_fill(0, ARRAY[cardinality(tiers)]);
    weights double precision[] := '{}';
    total double precision := 0;
    x double precision;
    i integer;
BEGIN
    IF policy = 'strict' THEN
        slots[1] := n;
        RETURN slots;
    END IF;
    FOR k IN 1 .. cardinality(tiers) LOOP
        weights[k] := pgqueue.tier_weight(tiers[k]);
        total := total + weights[k];
    END LOOP;
    FOR k IN 1 .. n LOOP
        i := 1;
        IF policy = 'weighted' THEN
            x := random() * total;
            WHILE i < cardinality(tiers) AND x >= weights[i] LOOP
                x := x - weights[i];
                i := i + 1;
            END LOOP;
        ELSIF tiers[1] <> 'critical' OR random() >= 0.9 THEN
            i := coalesce(CASE WHEN random() * 30 < 25
                               THEN array_position(tiers, 'standard')
                               ELSE array_position(tiers, 'batch') END,
                          array_position(tiers, 'standard'), array_position(tiers, 'batch'), 1);
        END IF;
        slots[i] := slots[i] + 1;
    END LOOP;
    RETURN slots;
END
$$;

-- Claim up to p_max jobs over every lane, leased to p_worker. The lanes and tiers of
-- pgqueue.lane_tiers_to_fold are folded (if no one else is folding them), then the lanes are
-- served in the order of the highest tier each has, then of that tier's head job's arrival
-- (LaneScheduler of pgqueue.scheduling.lanes). A lane's slots go to its tiers by
-- pgqueue.tier_slots, then what a tier could not fill to the others in priority order
-- (work-conserving). With p_admit, a rate-limited lane (Messages API jobs of a model; the batches
-- lane's jobs take nothing) goes one job at a time: under the weighted policy the tiers share
-- the model's input-token bucket (ratelimit_pick_tier, the rule of
-- pgqueue.scheduling.capacity.TierShares), else the highest tier goes first; the job's request
-- and tokens are taken from the model's buckets (pgqueue.ratelimit_try_take); a lane in
-- cooldown or out of tokens stops there and holds back no other lane. In a lane without a
-- provider limit one statement claims every tier's slots (claim_keyed); a tier whose claim
-- reaches its frontier (the horizon left jobs unstamped) is folded there and then, and takes
-- the rest of its slots. Rows: the jobs, then, when a lane was stopped and fewer than p_max
-- were claimed, one row with a NULL job and the seconds until the soonest stopped lane frees
-- up. The lanes of p_skip_kinds (kinds the caller cannot run) are left to other workers.
-- Its statements, and those of the functions it calls (claim_keyed, stamp, the triggers), run
-- generic plans, made once a session: a custom plan was made again at every claim (the lane
-- query's and the fold's, 1-5 M instructions each), 10 % of a claim and completion's CPU
-- (callgrind, revision 0048). The plans are index probes whatever the parameters.
CREATE OR REPLACE FUNCTION pgqueue.claim_lanes(p_max integer, p_worker text,
                                               p_lease double precision, p_admit boolean,
                                               p_skip_kinds text[])
RETURNS TABLE(job pgqueue.jobs, blocked_seconds double precision)
LANGUAGE plpgsql
SET jit TO 'off'
SET plan_cache_mode TO 'force_generic_plan'
AS $$
DECLARE
    got integer := 0;
    n integer;
    i integer;
    k integer;
    blocked double precision;
    wait double precision;
    lane record;
    t pgqueue.tier;
    j pgqueue.jobs;
    slots integer[];
    all_tiers constant pgqueue.tier[] := enum_range(NULL::pgqueue.tier);
    heads pgqueue.jobs[];
    needs double precision[];
    outs double precision[];
    policy text;
BEGIN
    IF coalesce(p_max, 0) <= 0 THEN
        RETURN;
    END IF;
    policy := pgqueue.tier_policy();  -- an unknown policy is refused even on an empty queue
    PERFORM pgqueue.fold(u.lane, u.tier) FROM pgqueue.lane_tiers_to_fold() u;
    FOR lane IN
        SELECT h.lane, array_agg(h.tier ORDER BY h.tier) AS tiers,
               bool_or(h.kind = 'anthropic.messages' AND h.model IS NOT NULL) AS limited
        FROM pgqueue.lane_tiers_stamped() h
        WHERE h.kind <> ALL (coalesce(p_skip_kinds, '{}'))
        GROUP BY h.lane
        ORDER BY min(h.tier), (array_agg(h.id ORDER BY h.tier))[1], h.lane
    LOOP
        EXIT WHEN got >= p_max;
        IF p_admit AND lane.limited THEN
            -- The model's bucket rows stay locked until the claim commits: a commit that does
            -- not wait for its WAL flush frees them sooner (the worker makes such a claim
            -- durable with job_claim_durable before its handlers start, seeing
            -- synchronous_commit off). Other claims commit as usual, durable at once.
            PERFORM set_config('synchronous_commit', 'off', true);
            LOOP
                EXIT WHEN got >= p_max;
                -- Each backlogged tier's head, and what it needs from the model's buckets
                -- (NULL: a batches-lane job, which takes nothing).
                heads := '{}';
                needs := '{NULL,NULL,NULL}';
                outs := '{NULL,NULL,NULL}';
                FOREACH t IN ARRAY lane.tiers LOOP
                    j := pgqueue.lane_head(lane.lane, t);
                    IF j.id IS NULL AND pgqueue.lane_tier_cut(lane.lane, t)
                       AND pgqueue.fold(lane.lane, t) > 0 THEN  -- at the frontier: go on
                        j := pgqueue.lane_head(lane.lane, t);
                    END IF;
                    CONTINUE WHEN j.id IS NULL;
                    k := array_position(all_tiers, t);
                    heads[k] := j;
                    IF NOT pgqueue.batch_lane_takes(j.id, j.tenant_id, j.priority, j.kind) THEN
                        needs[k] := j.est_input_tokens;
                        outs[k] := j.max_output_tokens;
                    END IF;
                END LOOP;
                -- The tier to send: a head that takes nothing goes first; else, under the
                -- weighted policy, the tiers share the bucket (ratelimit_pick_tier:
                -- guarantees and the trunk reserve), else the highest tier goes first.
                k := (SELECT min(x) FROM generate_series(1, 3) x
                      WHERE (heads[x]).id IS NOT NULL AND needs[x] IS NULL);
                IF k IS NULL AND policy = 'weighted' THEN
                    k := array_position(all_tiers,
                                        pgqueue.ratelimit_pick_tier(lane.lane, needs, outs));
                END IF;
                wait := 0;
                IF k IS NULL THEN  -- none fits now (weighted), or strict order: the highest
                    k := (SELECT min(x) FROM generate_series(1, 3) x WHERE needs[x] IS NOT NULL);
                    EXIT WHEN k IS NULL;
                END IF;
                IF needs[k] IS NOT NULL THEN  -- 'Infinity': larger than a bucket, let through
                    wait := pgqueue.ratelimit_try_take(lane.lane, needs[k], outs[k],
                                                       CASE WHEN policy = 'weighted'
                                                            THEN all_tiers[k] END);
                END IF;
                IF wait > 0 AND wait < 'Infinity'::double precision THEN
                    blocked := least(coalesce(blocked, wait), wait);
                    EXIT;
                END IF;
                RETURN QUERY SELECT c, NULL::double precision
                             FROM pgqueue.claim_keyed(lane.lane, ARRAY[all_tiers[k]], ARRAY[1],
                                                      p_worker, p_lease, (heads[k]).id) c;
                got := got + 1;
            END LOOP;
            CONTINUE;
        END IF;
        -- One statement takes every tier's slots (pgqueue.tier_slots). Then a tier that fell
        -- short at its frontier is folded and takes the rest of its slots, and what no tier
        -- could fill goes to the others in priority order (work-conserving).
        slots := pgqueue.tier_slots(lane.tiers, p_max - got);
        FOR job IN SELECT * FROM pgqueue.claim_keyed(lane.lane, lane.tiers, slots, p_worker,
                                                    p_lease) LOOP
            RETURN NEXT;
            i := array_position(lane.tiers, job.priority);
            slots[i] := slots[i] - 1;
            got := got + 1;
        END LOOP;
        FOR i IN 1 .. cardinality(lane.tiers) LOOP  -- short at its frontier: fold, go on
            t := lane.tiers[i];
            IF slots[i] > 0 AND pgqueue.lane_tier_cut(lane.lane, t)
               AND pgqueue.fold(lane.lane, t) > 0 THEN
                RETURN QUERY SELECT c, NULL::double precision
                             FROM pgqueue.claim_tier(lane.lane, t, slots[i], p_worker, p_lease) c;
                GET DIAGNOSTICS k = ROW_COUNT;
                got := got + k;
            END IF;
        END LOOP;
        FOR i IN 1 .. cardinality(lane.tiers) LOOP  -- what a tier could not fill: the others
            EXIT WHEN got >= p_max;
            RETURN QUERY SELECT c, NULL::double precision
                         FROM pgqueue.claim_tier(lane.lane, lane.tiers[i], p_max - got,
                                                 p_worker, p_lease) c;
            GET DIAGNOSTICS k = ROW_COUNT;
            got := got + k;
        END LOOP;
    END LOOP;
    IF blocked IS NOT NULL AND got < p_max THEN
        RETURN QUERY SELECT NULL::pgqueue.jobs, blocked;
    END IF;
END
$$;

-- Claim up to max_jobs jobs in the fair order, leased to worker_id (no provider limiter).
CREATE OR REPLACE FUNCTION pgqueue.claim(max_jobs integer, worker_id text,
                                         lease_seconds double precision)
RETURNS SETOF pgqueue.jobs
LANGUAGE sql
AS $$
    SELECT (c.job).* FROM pgqueue.claim_lanes(max_jobs, worker_id, lease_seconds, false, '{}') c
    WHERE (c.job).id IS NOT NULL
$$;

-- The claim behind admission control by the provider's limits ("claim only when the job can
-- be sent now"): pgqueue.claim_lanes with the limiter. A claim that took from a model's
-- buckets commits without waiting for its WAL flush (claim_lanes): a claim lost in a crash
-- only leaves its jobs queued, to be claimed again (every completion is fenced by the lease
-- token), and the worker makes it durable before its handlers start (job_claim_durable).
-- skip_kinds: kinds the caller cannot run (no handler, no API key); their lanes are left to
-- other workers, untouched (nothing taken from a model's buckets for them). The worker's
-- job_claim calls claim_lanes itself: this SQL function is planned again at every call.
CREATE OR REPLACE FUNCTION pgqueue.claim_admitted(
    max_jobs integer,
    worker_id text,
    lease_seconds double precision,
    skip_kinds text[]
)
RETURNS TABLE(job pgqueue.jobs, blocked_seconds double precision)
LANGUAGE sql
AS $$
    SELECT c.job, c.blocked_seconds
    FROM pgqueue.claim_lanes(max_jobs, worker_id, lease_seconds, true, skip_kinds) c
$$;
