"""The claim's speed and scale work of issue 28, one revision (it replaces seven that never
landed, each of which copied the same functions again).

- A claim folds a lane and tier only when the fold has work (``lane_tiers_to_fold``: no fold
  yet, jobs due since the last fold less ``pgqueue.stamp_arrival_margin``, stamped work
  within the frontier under half the horizon, or the once-a-second look due); a tier whose
  claim reaches its frontier is folded there and goes on (``claim_tier``).
- ``claim_keyed`` claims every tier of a lane in one statement (arrays of tiers and counts).
- A claim commits without waiting for its WAL flush only when it took from a model's buckets
  (``claim_lanes`` sets it there); the worker makes only those durable.
- ``claim_admitted`` and ``claim_lanes`` take ``skip_kinds``: a worker leaves the lanes of
  kinds it cannot run to other workers.
- ``stamp`` works in slices (``pgqueue.stamp_slice_flows`` cut flows and joiners a fold, on
  the new index ``flows_cut_next_idx``), probes each flow's last job by key, leaves cut flows
  out of its once-a-second look, and uncuts a flow it finds no jobs for (all cancelled: the
  frontier stayed on it and the lane stalled for good).
- ``lane_tiers_unstamped`` probes each pair (an ``EXISTS`` became a hash semi join over every
  unstamped job before ANALYZE).
- ``cancel``'s text as its file has it (0042 did not copy a comment change).

Revision ID: 0045
Revises: 0044
"""

from __future__ import annotations

from alembic import op

revision = "0045"
down_revision = "0044"
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

LANE_TIERS_TO_FOLD = """\
CREATE OR REPLACE FUNCTION pgqueue.lane_tiers_to_fold()
RETURNS TABLE(lane text, tier pgqueue.tier)
LANGUAGE sql STABLE
AS $$
    SELECT u.lane, u.tier FROM pgqueue.lane_tiers_unstamped() u
    LEFT JOIN pgqueue.lane_tiers l ON l.lane = u.lane AND l.tier = u.tier
    WHERE l.lane IS NULL OR l.full_at < now() - interval '1 second'
       OR (l.frontier_round IS NOT NULL
           AND coalesce((SELECT j.key_round FROM pgqueue.jobs j
                         WHERE j.lane = u.lane AND j.priority = u.tier AND j.state = 'queued'
                           AND j.key_round IS NOT NULL
                         ORDER BY j.key_round, j.key_place, j.key_seq LIMIT 1),
                        l.frontier_round)
               > l.frontier_round - pgqueue.setting('stamp_horizon_rounds', 4) / 2)
       OR EXISTS (SELECT FROM pgqueue.jobs j
                  WHERE j.lane = u.lane AND j.priority = u.tier AND j.state = 'queued'
                    AND j.key_round IS NULL AND j.run_at <= now()
                    AND j.run_at >= l.folded_at - pgqueue.setting('stamp_arrival_margin', 0.1)
                                                  * interval '1 second')
$$;
"""

CLAIM_KEYED = """\
CREATE OR REPLACE FUNCTION pgqueue.claim_keyed(p_lane text, p_tiers pgqueue.tier[],
                                               p_counts integer[], p_worker text,
                                               p_lease double precision, p_only bigint DEFAULT NULL)
RETURNS SETOF pgqueue.jobs
LANGUAGE plpgsql
SET jit TO 'off'
AS $$
BEGIN
    RETURN QUERY
    WITH picked AS (
        SELECT j.id, j.tenant_id
        FROM unnest(p_tiers, p_counts) AS s(tier, n)
        LEFT JOIN pgqueue.lane_tiers l ON l.lane = p_lane AND l.tier = s.tier
        CROSS JOIN LATERAL (
            SELECT j.id, j.tenant_id FROM pgqueue.jobs j
            WHERE j.lane = p_lane AND j.priority = s.tier AND j.state = 'queued'
              AND j.key_round IS NOT NULL
              AND (j.key_round, j.key_place, j.key_seq)
                  <= (coalesce(l.frontier_round, 9223372036854775807),
                      coalesce(l.frontier_place, 0), coalesce(l.frontier_seq, 0))
              AND (p_only IS NULL OR j.id = p_only)
            ORDER BY j.key_round, j.key_place, j.key_seq
            LIMIT s.n FOR UPDATE OF j SKIP LOCKED) j
        WHERE s.n > 0
    ), taken AS (
        UPDATE pgqueue.jobs j
        SET state = 'running', attempts = j.attempts + 1, started_at = now(),
            worker_id = p_worker, lease_token = gen_random_uuid(),
            lease_expires_at = now() + make_interval(secs => p_lease)
        FROM picked WHERE j.id = picked.id AND j.tenant_id = picked.tenant_id
        RETURNING j.*
    ), moved AS (
        INSERT INTO pgqueue.cursors AS c (lane, tier, worker_id, key_round, key_place, key_seq)
        SELECT DISTINCT ON (t.priority) p_lane, t.priority, p_worker, t.key_round, t.key_place,
               t.key_seq
        FROM taken t
        ORDER BY t.priority, t.key_round DESC, t.key_place DESC, t.key_seq DESC
        ON CONFLICT (lane, tier, worker_id) DO UPDATE
        SET key_round = excluded.key_round, key_place = excluded.key_place,
            key_seq = excluded.key_seq, moved_at = excluded.moved_at
        WHERE (excluded.key_round, excluded.key_place, excluded.key_seq)
              > (c.key_round, c.key_place, c.key_seq)
    )
    SELECT * FROM taken t ORDER BY t.priority, t.key_round, t.key_place, t.key_seq;
END
$$;
"""

CLAIM_KEYED_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.claim_keyed(p_lane text, p_tier pgqueue.tier, p_max integer,
                                               p_worker text, p_lease double precision,
                                               p_only bigint DEFAULT NULL)
RETURNS SETOF pgqueue.jobs
LANGUAGE plpgsql
SET jit TO 'off'
AS $$
DECLARE
    fr bigint;
    fp numeric;
    fs bigint;
BEGIN
    SELECT l.frontier_round, l.frontier_place, l.frontier_seq INTO fr, fp, fs
    FROM pgqueue.lane_tiers l WHERE l.lane = p_lane AND l.tier = p_tier;
    IF fr IS NULL THEN
        fr := 9223372036854775807; fp := 0; fs := 0;
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT j.id, j.tenant_id FROM pgqueue.jobs j
        WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
          AND j.key_round IS NOT NULL AND (j.key_round, j.key_place, j.key_seq) <= (fr, fp, fs)
          AND (p_only IS NULL OR j.id = p_only)
        ORDER BY j.key_round, j.key_place, j.key_seq
        LIMIT p_max FOR UPDATE SKIP LOCKED
    ), taken AS (
        UPDATE pgqueue.jobs j
        SET state = 'running', attempts = j.attempts + 1, started_at = now(),
            worker_id = p_worker, lease_token = gen_random_uuid(),
            lease_expires_at = now() + make_interval(secs => p_lease)
        FROM picked WHERE j.id = picked.id AND j.tenant_id = picked.tenant_id
        RETURNING j.*
    ), moved AS (
        INSERT INTO pgqueue.cursors AS c (lane, tier, worker_id, key_round, key_place, key_seq)
        SELECT p_lane, p_tier, p_worker, t.key_round, t.key_place, t.key_seq FROM taken t
        ORDER BY t.key_round DESC, t.key_place DESC, t.key_seq DESC LIMIT 1
        ON CONFLICT (lane, tier, worker_id) DO UPDATE
        SET key_round = excluded.key_round, key_place = excluded.key_place,
            key_seq = excluded.key_seq, moved_at = excluded.moved_at
        WHERE (excluded.key_round, excluded.key_place, excluded.key_seq)
              > (c.key_round, c.key_place, c.key_seq)
    )
    SELECT * FROM taken t ORDER BY t.key_round, t.key_place, t.key_seq;
END
$$;
"""

CLAIM_TIER = """\
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
"""

CLAIM_LANES = """\
CREATE OR REPLACE FUNCTION pgqueue.claim_lanes(p_max integer, p_worker text,
                                               p_lease double precision, p_admit boolean,
                                               p_skip_kinds text[])
RETURNS TABLE(job pgqueue.jobs, blocked_seconds double precision)
LANGUAGE plpgsql
SET jit TO 'off'
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
        FOR j IN SELECT * FROM pgqueue.claim_keyed(lane.lane, lane.tiers, slots, p_worker,
                                                  p_lease) LOOP
            job := j;
            blocked_seconds := NULL;
            RETURN NEXT;
            i := array_position(lane.tiers, j.priority);
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
"""

CLAIM_LANES_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.claim_lanes(p_max integer, p_worker text,
                                               p_lease double precision, p_admit boolean)
RETURNS TABLE(job pgqueue.jobs, blocked_seconds double precision)
LANGUAGE plpgsql
SET jit TO 'off'
AS $$
DECLARE
    got integer := 0;
    got_before integer;
    n integer;
    k integer;
    again boolean;
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
    LOOP
        again := false;
        got_before := got;
        PERFORM pgqueue.fold(u.lane, u.tier) FROM pgqueue.lane_tiers_unstamped() u;
        FOR lane IN
            SELECT h.lane, array_agg(h.tier ORDER BY h.tier) AS tiers,
                   bool_or(h.kind = 'anthropic.messages' AND h.model IS NOT NULL) AS limited
            FROM pgqueue.lane_tiers_stamped() h
            GROUP BY h.lane
            ORDER BY min(h.tier), (array_agg(h.id ORDER BY h.tier))[1], h.lane
        LOOP
            EXIT WHEN got >= p_max;
            IF p_admit AND lane.limited THEN
                LOOP
                    EXIT WHEN got >= p_max;
                    -- Each backlogged tier's head, and what it needs from the model's buckets
                    -- (NULL: a batches-lane job, which takes nothing).
                    heads := '{}';
                    needs := '{NULL,NULL,NULL}';
                    outs := '{NULL,NULL,NULL}';
                    FOREACH t IN ARRAY lane.tiers LOOP
                        j := pgqueue.lane_head(lane.lane, t);
                        IF j.id IS NULL THEN
                            again := again OR pgqueue.lane_tier_cut(lane.lane, t);
                            CONTINUE;
                        END IF;
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
                        k := (SELECT min(x) FROM generate_series(1, 3) x
                              WHERE needs[x] IS NOT NULL);
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
                                 FROM pgqueue.claim_keyed(lane.lane, all_tiers[k], 1, p_worker,
                                                          p_lease, (heads[k]).id) c;
                    got := got + 1;
                END LOOP;
                CONTINUE;
            END IF;
            slots := pgqueue.tier_slots(lane.tiers, p_max - got);
            <<tiers>>
            FOR pass IN 1 .. 2 LOOP
                FOR i IN 1 .. cardinality(lane.tiers) LOOP
                    t := lane.tiers[i];
                    n := CASE WHEN pass = 1 THEN slots[i] ELSE p_max - got END;
                    CONTINUE WHEN n <= 0;
                    RETURN QUERY SELECT c, NULL::double precision
                                 FROM pgqueue.claim_keyed(lane.lane, t, n, p_worker, p_lease) c;
                    GET DIAGNOSTICS k = ROW_COUNT;
                    got := got + k;
                    IF k < n AND pgqueue.lane_tier_cut(lane.lane, t) THEN
                        again := true;  -- fold it again before a lower tier goes
                        EXIT tiers;
                    END IF;
                END LOOP;
            END LOOP;
        END LOOP;
        EXIT WHEN NOT again OR got >= p_max OR got = got_before;
    END LOOP;
    IF blocked IS NOT NULL AND got < p_max THEN
        RETURN QUERY SELECT NULL::pgqueue.jobs, blocked;
    END IF;
END
$$;
"""

CLAIM = """\
CREATE OR REPLACE FUNCTION pgqueue.claim(max_jobs integer, worker_id text,
                                         lease_seconds double precision)
RETURNS SETOF pgqueue.jobs
LANGUAGE sql
AS $$
    SELECT (c.job).* FROM pgqueue.claim_lanes(max_jobs, worker_id, lease_seconds, false, '{}') c
    WHERE (c.job).id IS NOT NULL
$$;
"""

CLAIM_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.claim(max_jobs integer, worker_id text,
                                         lease_seconds double precision)
RETURNS SETOF pgqueue.jobs
LANGUAGE sql
AS $$
    SELECT (c.job).* FROM pgqueue.claim_lanes(max_jobs, worker_id, lease_seconds, false) c
    WHERE (c.job).id IS NOT NULL
$$;
"""

CLAIM_ADMITTED = """\
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
"""

CLAIM_ADMITTED_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.claim_admitted(
    max_jobs integer,
    worker_id text,
    lease_seconds double precision
)
RETURNS TABLE(job pgqueue.jobs, blocked_seconds double precision)
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY SELECT c.job, c.blocked_seconds
                 FROM pgqueue.claim_lanes(max_jobs, worker_id, lease_seconds, true) c;
END
$$;
"""

STAMP = """\
CREATE OR REPLACE FUNCTION pgqueue.stamp(p_lane text, p_tier pgqueue.tier, p_horizon integer)
RETURNS bigint
LANGUAGE plpgsql
SET jit TO 'off'
SET enable_seqscan TO 'off'
SET enable_incremental_sort TO 'off'  -- a tenant's FIFO is a range of jobs_unstamped_idx
AS $$
DECLARE
    lt pgqueue.lane_tiers;
    cr bigint;
    cp numeric;
    cs bigint;
    base bigint;
    look_at_all boolean;
    slice constant integer := greatest(1, pgqueue.setting('stamp_slice_flows', 64)::integer);
    margin constant interval := make_interval(secs => pgqueue.setting('stamp_arrival_margin', 0.1));
    ids bigint[]; tenants text[]; rnds bigint[]; places numeric[]; seqs bigint[];
    f_tenants text[]; f_places numeric[]; f_rounds bigint[]; f_seqs bigint[];
    f_credits bigint[]; f_cuts boolean[]; f_nexts bigint[];
BEGIN
    INSERT INTO pgqueue.lane_tiers (lane, tier) VALUES (p_lane, p_tier) ON CONFLICT DO NOTHING;
    SELECT * INTO lt FROM pgqueue.lane_tiers l WHERE l.lane = p_lane AND l.tier = p_tier;
    SELECT c.key_round, c.key_place, c.key_seq INTO cr, cp, cs
    FROM pgqueue.cursors c WHERE c.lane = p_lane AND c.tier = p_tier
    ORDER BY c.key_round DESC, c.key_place DESC, c.key_seq DESC LIMIT 1;
    cr := coalesce(cr, 0); cp := coalesce(cp, 0); cs := coalesce(cs, 0);
    -- rows of claimers behind the cursor and quiet for a minute say nothing the greatest does not
    DELETE FROM pgqueue.cursors c WHERE c.ctid IN (
        SELECT x.ctid FROM pgqueue.cursors x
        WHERE x.lane = p_lane AND x.tier = p_tier AND x.moved_at < now() - interval '1 minute'
          AND (x.key_round, x.key_place, x.key_seq) < (cr, cp, cs)
        FOR UPDATE SKIP LOCKED);
    base := greatest(cr, (SELECT j.key_round FROM pgqueue.jobs j
                          WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
                            AND j.key_round IS NOT NULL
                          ORDER BY j.key_round, j.key_place, j.key_seq LIMIT 1));
    look_at_all := lt.full_at < now() - interval '1 second';
    -- The tenants to visit: a slice of the cut flows, and those with no cut flow and jobs due
    -- since 0.1 s before the last fold began (a skip scan over the distinct (run_at, tenant)
    -- pairs: an enqueue's run_at is its transaction's start), or, at most once a second, any
    -- unstamped due jobs (a job that committed later still).
    WITH RECURSIVE arrived(run_at, tenant_id) AS (
        (SELECT j.run_at, j.tenant_id FROM pgqueue.jobs j
         WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
           AND j.key_round IS NULL AND j.run_at >= lt.folded_at - margin
           AND j.run_at <= now()
         ORDER BY j.run_at, j.tenant_id LIMIT 1)
        UNION ALL
        SELECT n.run_at, n.tenant_id FROM arrived a, LATERAL (
            SELECT j.run_at, j.tenant_id FROM pgqueue.jobs j
            WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
              AND j.key_round IS NULL AND (j.run_at, j.tenant_id) > (a.run_at, a.tenant_id)
              AND j.run_at <= now()
            ORDER BY j.run_at, j.tenant_id LIMIT 1) n
    ), everyone(tenant_id) AS (
        (SELECT j.tenant_id FROM pgqueue.jobs j
         WHERE look_at_all AND j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
           AND j.key_round IS NULL
         ORDER BY j.tenant_id LIMIT 1)
        UNION ALL
        SELECT (SELECT j.tenant_id FROM pgqueue.jobs j
                WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
                  AND j.key_round IS NULL AND j.tenant_id > e.tenant_id
                ORDER BY j.tenant_id LIMIT 1)
        FROM everyone e WHERE e.tenant_id IS NOT NULL
    ), pending(tenant_id) AS (
        SELECT n.tenant_id FROM (SELECT tenant_id FROM arrived
                                 UNION SELECT tenant_id FROM everyone) n
        WHERE NOT EXISTS (SELECT FROM pgqueue.flows f WHERE f.lane = p_lane AND f.tier = p_tier
                                                        AND f.tenant_id = n.tenant_id AND f.cut)
        UNION SELECT c.tenant_id FROM (  -- cut, all its stamped jobs claimed (the frontier's)
            SELECT f.tenant_id FROM pgqueue.flows f
            WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut
              AND (f.last_round, f.place, f.last_seq) <= (cr, cp, cs)
            ORDER BY f.last_round, f.place, f.last_seq LIMIT slice) c
        UNION SELECT c.tenant_id FROM (SELECT f.tenant_id FROM pgqueue.flows f  -- cut, its next
            WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut  -- job within the horizon
              AND f.next_round <= base + p_horizon ORDER BY f.next_round, f.place LIMIT slice) c
    ), flows_in AS (   -- a flow continues while its last stamped job is queued, or it was cut
        SELECT p.tenant_id, f.place, f.last_round, f.last_seq, f.credit,
               round(pgqueue.tenant_quantum(p.tenant_id) * 1000)::bigint AS q,
               coalesce(f.cut OR h.holds_one, false) AS continuing,
               coalesce(h.holds_one, false) AS holds_one
        FROM pending p
        LEFT JOIN pgqueue.flows f
               ON f.lane = p_lane AND f.tier = p_tier AND f.tenant_id = p.tenant_id
        LEFT JOIN LATERAL (SELECT true AS holds_one FROM pgqueue.jobs j  -- a probe, not a hash
            WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'  -- of every job
              AND j.key_round IS NOT NULL
              AND (j.key_round, j.key_place, j.key_seq) = (f.last_round, f.place, f.last_seq)
            LIMIT 1) h ON true
        WHERE p.tenant_id IS NOT NULL
    ), joiners AS (
        SELECT tenant_id, count(*) OVER () AS m,
               row_number() OVER (ORDER BY pgqueue.refill_offset(tenant_id),
                                           tenant_id COLLATE "C") AS i
        FROM flows_in WHERE NOT continuing
    ), pred AS (
        SELECT max(f.place) AS place FROM pgqueue.flows f
        WHERE f.lane = p_lane AND f.tier = p_tier AND f.place < cp
    ), starts AS (
        SELECT fi.tenant_id, fi.q, fi.holds_one, fi.continuing OR jn.i <= slice AS whole,
               CASE WHEN fi.continuing THEN fi.place
                    WHEN pred.place IS NULL THEN cp - (jn.m + 1 - jn.i)
                    ELSE pred.place + (cp - pred.place) * jn.i / (jn.m + 1) END AS place,
               CASE WHEN fi.continuing THEN fi.last_round ELSE cr END AS r0,
               CASE WHEN fi.continuing THEN fi.credit ELSE 0 END AS d0,
               CASE WHEN fi.continuing THEN fi.last_seq ELSE 0 END AS s0
        FROM flows_in fi LEFT JOIN joiners jn USING (tenant_id) CROSS JOIN pred
    ), fetched AS (   -- each flow's next due jobs: a job costs >= 1000 units, so one more
                      -- than can fall within the horizon (a row left over: the flow is cut)
        SELECT s.*, j.id, j.cost, count(*) OVER (PARTITION BY s.tenant_id) AS n_fetched,
               row_number() OVER w AS k, (sum(j.cost) OVER w)::bigint AS cum
        FROM starts s CROSS JOIN LATERAL (
            SELECT j.id, greatest(1, round(j.cost * 1000))::bigint AS cost, j.run_at
            FROM pgqueue.jobs j
            WHERE j.lane = p_lane AND j.priority = p_tier AND j.tenant_id = s.tenant_id
              AND j.state = 'queued' AND j.key_round IS NULL AND j.run_at <= now()
            ORDER BY j.run_at, j.id
            LIMIT CASE WHEN s.whole
                       THEN greatest(2, (p_horizon + 1 + base - s.r0) * s.q / 1000 + 1)
                       ELSE 2 END) j
        WINDOW w AS (PARTITION BY s.tenant_id ORDER BY j.run_at, j.id)
    ), kept AS (
        SELECT f.*, r.rnd,
               (f.whole AND r.rnd <= base + p_horizon) OR (f.k = 1 AND NOT f.holds_one)
                   AS keep
        FROM fetched f, LATERAL (SELECT f.r0 + greatest(0, (f.cum - f.d0 + f.q - 1) / f.q)) r(rnd)
    ), numbered AS (
        SELECT k.*, lt.seq + row_number() OVER (ORDER BY k.tenant_id, k.k) AS sq
        FROM kept k WHERE k.keep
    ), last AS (      -- where each flow's last stamped job leaves it (or where it was)
        SELECT DISTINCT ON (s.tenant_id) s.tenant_id, s.place,
               coalesce(n.rnd, s.r0) AS last_round, coalesce(n.sq, s.s0) AS last_seq,
               coalesce(n.d0 + (n.rnd - n.r0) * n.q - n.cum, s.d0) AS credit,
               coalesce(c.cut, false) AS cut, c.next_round   -- none fetched: cancelled, not cut
        FROM starts s
        LEFT JOIN (SELECT k.tenant_id, bool_or(NOT k.keep) AS cut,
                     min(k.rnd) FILTER (WHERE NOT k.keep) AS next_round
              FROM kept k GROUP BY k.tenant_id) c USING (tenant_id)
        LEFT JOIN numbered n USING (tenant_id)
        ORDER BY s.tenant_id, n.k DESC NULLS LAST
    )
    SELECT n.ids, n.tenants, n.rnds, n.places, n.seqs, l.tenants, l.places, l.rounds, l.seqs,
           l.credits, l.cuts, l.nexts
    INTO ids, tenants, rnds, places, seqs, f_tenants, f_places, f_rounds, f_seqs, f_credits,
         f_cuts, f_nexts
    FROM (SELECT array_agg(id) AS ids, array_agg(tenant_id) AS tenants, array_agg(rnd) AS rnds,
                 array_agg(place) AS places, array_agg(sq) AS seqs FROM numbered) n,
         (SELECT array_agg(tenant_id) AS tenants, array_agg(place) AS places,
                 array_agg(last_round) AS rounds, array_agg(last_seq) AS seqs,
                 array_agg(credit) AS credits, array_agg(cut) AS cuts,
                 array_agg(next_round) AS nexts FROM last) l;
    UPDATE pgqueue.jobs j SET key_round = u.r, key_place = u.p, key_seq = u.s
    FROM unnest(ids, tenants, rnds, places, seqs) AS u(id, tenant_id, r, p, s)
    WHERE j.id = u.id AND j.tenant_id = u.tenant_id;
    INSERT INTO pgqueue.flows AS f
        (lane, tier, tenant_id, place, last_round, last_seq, credit, cut, next_round)
    SELECT p_lane, p_tier, u.*
    FROM unnest(f_tenants, f_places, f_rounds, f_seqs, f_credits, f_cuts, f_nexts) u
    ON CONFLICT (lane, tier, tenant_id) DO UPDATE
    SET place = excluded.place, last_round = excluded.last_round, last_seq = excluded.last_seq,
        credit = excluded.credit, cut = excluded.cut, next_round = excluded.next_round;
    UPDATE pgqueue.lane_tiers l
    SET seq = l.seq + coalesce(cardinality(ids), 0), folded_at = now(),
        full_at = CASE WHEN look_at_all THEN clock_timestamp() ELSE l.full_at END,
        (frontier_round, frontier_place, frontier_seq) = (
            SELECT f.last_round, f.place, f.last_seq FROM pgqueue.flows f
            WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut
            ORDER BY f.last_round, f.place, f.last_seq LIMIT 1)
    WHERE l.lane = p_lane AND l.tier = p_tier;
    RETURN coalesce(cardinality(ids), 0);
END
$$;
"""

STAMP_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.stamp(p_lane text, p_tier pgqueue.tier, p_horizon integer)
RETURNS bigint
LANGUAGE plpgsql
SET jit TO 'off'
SET enable_seqscan TO 'off'
AS $$
DECLARE
    lt pgqueue.lane_tiers;
    cr bigint;
    cp numeric;
    cs bigint;
    base bigint;
    look_at_all boolean;
    ids bigint[]; tenants text[]; rnds bigint[]; places numeric[]; seqs bigint[];
    f_tenants text[]; f_places numeric[]; f_rounds bigint[]; f_seqs bigint[];
    f_credits bigint[]; f_cuts boolean[]; f_nexts bigint[];
BEGIN
    INSERT INTO pgqueue.lane_tiers (lane, tier) VALUES (p_lane, p_tier) ON CONFLICT DO NOTHING;
    SELECT * INTO lt FROM pgqueue.lane_tiers l WHERE l.lane = p_lane AND l.tier = p_tier;
    SELECT c.key_round, c.key_place, c.key_seq INTO cr, cp, cs
    FROM pgqueue.cursors c WHERE c.lane = p_lane AND c.tier = p_tier
    ORDER BY c.key_round DESC, c.key_place DESC, c.key_seq DESC LIMIT 1;
    cr := coalesce(cr, 0); cp := coalesce(cp, 0); cs := coalesce(cs, 0);
    -- rows of claimers behind the cursor and quiet for a minute say nothing the greatest does not
    DELETE FROM pgqueue.cursors c WHERE c.ctid IN (
        SELECT x.ctid FROM pgqueue.cursors x
        WHERE x.lane = p_lane AND x.tier = p_tier AND x.moved_at < now() - interval '1 minute'
          AND (x.key_round, x.key_place, x.key_seq) < (cr, cp, cs)
        FOR UPDATE SKIP LOCKED);
    base := greatest(cr, (SELECT j.key_round FROM pgqueue.jobs j
                          WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
                            AND j.key_round IS NOT NULL
                          ORDER BY j.key_round, j.key_place, j.key_seq LIMIT 1));
    look_at_all := lt.full_at < now() - interval '1 second';
    -- The tenants to visit: those with jobs due since the last fold (a skip scan over the
    -- distinct (run_at, tenant) pairs), the flows the horizon cut that may go on, and at most
    -- once a second every tenant with unstamped due jobs (a job whose transaction began
    -- before the last fold and committed after it).
    WITH RECURSIVE arrived(run_at, tenant_id) AS (
        (SELECT j.run_at, j.tenant_id FROM pgqueue.jobs j
         WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
           AND j.key_round IS NULL AND j.run_at >= lt.folded_at AND j.run_at <= now()
         ORDER BY j.run_at, j.tenant_id LIMIT 1)
        UNION ALL
        SELECT n.run_at, n.tenant_id FROM arrived a, LATERAL (
            SELECT j.run_at, j.tenant_id FROM pgqueue.jobs j
            WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
              AND j.key_round IS NULL AND (j.run_at, j.tenant_id) > (a.run_at, a.tenant_id)
              AND j.run_at <= now()
            ORDER BY j.run_at, j.tenant_id LIMIT 1) n
    ), everyone(tenant_id) AS (
        (SELECT j.tenant_id FROM pgqueue.jobs j
         WHERE look_at_all AND j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
           AND j.key_round IS NULL
         ORDER BY j.tenant_id LIMIT 1)
        UNION ALL
        SELECT (SELECT j.tenant_id FROM pgqueue.jobs j
                WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
                  AND j.key_round IS NULL AND j.tenant_id > e.tenant_id
                ORDER BY j.tenant_id LIMIT 1)
        FROM everyone e WHERE e.tenant_id IS NOT NULL
    ), pending(tenant_id) AS (
        SELECT a.tenant_id FROM arrived a
        UNION SELECT f.tenant_id FROM pgqueue.flows f
        WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut AND f.next_round <= base + p_horizon
        UNION SELECT f.tenant_id FROM pgqueue.flows f   -- cut, and all its stamped jobs claimed
        WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut
          AND (f.last_round, f.place, f.last_seq) <= (cr, cp, cs)
        UNION SELECT e.tenant_id FROM everyone e
    ), flows_in AS (   -- a flow continues while its last stamped job is queued, or it was cut
        SELECT p.tenant_id, f.place, f.last_round, f.last_seq, f.credit,
               round(pgqueue.tenant_quantum(p.tenant_id) * 1000)::bigint AS q,
               coalesce(f.cut OR h.holds_one, false) AS continuing,
               coalesce(h.holds_one, false) AS holds_one
        FROM pending p
        LEFT JOIN pgqueue.flows f
               ON f.lane = p_lane AND f.tier = p_tier AND f.tenant_id = p.tenant_id
        LEFT JOIN LATERAL (SELECT EXISTS (
            SELECT FROM pgqueue.jobs j
            WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
              AND (j.key_round, j.key_place, j.key_seq) = (f.last_round, f.place, f.last_seq))
            AS holds_one) h ON true
        WHERE p.tenant_id IS NOT NULL
    ), joiners AS (
        SELECT tenant_id, count(*) OVER () AS m,
               row_number() OVER (ORDER BY pgqueue.refill_offset(tenant_id),
                                           tenant_id COLLATE "C") AS i
        FROM flows_in WHERE NOT continuing
    ), pred AS (
        SELECT max(f.place) AS place FROM pgqueue.flows f
        WHERE f.lane = p_lane AND f.tier = p_tier AND f.place < cp
    ), starts AS (
        SELECT fi.tenant_id, fi.q, fi.holds_one,
               CASE WHEN fi.continuing THEN fi.place
                    WHEN pred.place IS NULL THEN cp - (jn.m + 1 - jn.i)
                    ELSE pred.place + (cp - pred.place) * jn.i / (jn.m + 1) END AS place,
               CASE WHEN fi.continuing THEN fi.last_round ELSE cr END AS r0,
               CASE WHEN fi.continuing THEN fi.credit ELSE 0 END AS d0,
               CASE WHEN fi.continuing THEN fi.last_seq ELSE 0 END AS s0
        FROM flows_in fi LEFT JOIN joiners jn USING (tenant_id) CROSS JOIN pred
    ), fetched AS (   -- each flow's next due jobs: a job costs >= 1000 units, so one more
                      -- than can fall within the horizon (a row left over: the flow is cut)
        SELECT s.*, j.id, j.cost, count(*) OVER (PARTITION BY s.tenant_id) AS n_fetched,
               row_number() OVER w AS k, (sum(j.cost) OVER w)::bigint AS cum
        FROM starts s CROSS JOIN LATERAL (
            SELECT j.id, greatest(1, round(j.cost * 1000))::bigint AS cost, j.run_at
            FROM pgqueue.jobs j
            WHERE j.lane = p_lane AND j.priority = p_tier AND j.tenant_id = s.tenant_id
              AND j.state = 'queued' AND j.key_round IS NULL AND j.run_at <= now()
            ORDER BY j.run_at, j.id
            LIMIT greatest(2, (p_horizon + 1 + base - s.r0) * s.q / 1000 + 1)) j
        WINDOW w AS (PARTITION BY s.tenant_id ORDER BY j.run_at, j.id)
    ), kept AS (
        SELECT f.*, r.rnd, r.rnd <= base + p_horizon OR (f.k = 1 AND NOT f.holds_one) AS keep
        FROM fetched f, LATERAL (SELECT f.r0 + greatest(0, (f.cum - f.d0 + f.q - 1) / f.q)) r(rnd)
    ), numbered AS (
        SELECT k.*, lt.seq + row_number() OVER (ORDER BY k.tenant_id, k.k) AS sq
        FROM kept k WHERE k.keep
    ), last AS (      -- where each flow's last stamped job leaves it (or where it was)
        SELECT DISTINCT ON (s.tenant_id) s.tenant_id, s.place,
               coalesce(n.rnd, s.r0) AS last_round, coalesce(n.sq, s.s0) AS last_seq,
               coalesce(n.d0 + (n.rnd - n.r0) * n.q - n.cum, s.d0) AS credit, c.cut,
               c.next_round
        FROM starts s
        JOIN (SELECT k.tenant_id, bool_or(NOT k.keep) AS cut,
                     min(k.rnd) FILTER (WHERE NOT k.keep) AS next_round
              FROM kept k GROUP BY k.tenant_id) c USING (tenant_id)
        LEFT JOIN numbered n USING (tenant_id)
        ORDER BY s.tenant_id, n.k DESC NULLS LAST
    )
    SELECT n.ids, n.tenants, n.rnds, n.places, n.seqs, l.tenants, l.places, l.rounds, l.seqs,
           l.credits, l.cuts, l.nexts
    INTO ids, tenants, rnds, places, seqs, f_tenants, f_places, f_rounds, f_seqs, f_credits,
         f_cuts, f_nexts
    FROM (SELECT array_agg(id) AS ids, array_agg(tenant_id) AS tenants, array_agg(rnd) AS rnds,
                 array_agg(place) AS places, array_agg(sq) AS seqs FROM numbered) n,
         (SELECT array_agg(tenant_id) AS tenants, array_agg(place) AS places,
                 array_agg(last_round) AS rounds, array_agg(last_seq) AS seqs,
                 array_agg(credit) AS credits, array_agg(cut) AS cuts,
                 array_agg(next_round) AS nexts FROM last) l;
    UPDATE pgqueue.jobs j SET key_round = u.r, key_place = u.p, key_seq = u.s
    FROM unnest(ids, tenants, rnds, places, seqs) AS u(id, tenant_id, r, p, s)
    WHERE j.id = u.id AND j.tenant_id = u.tenant_id;
    INSERT INTO pgqueue.flows AS f
        (lane, tier, tenant_id, place, last_round, last_seq, credit, cut, next_round)
    SELECT p_lane, p_tier, u.*
    FROM unnest(f_tenants, f_places, f_rounds, f_seqs, f_credits, f_cuts, f_nexts) u
    ON CONFLICT (lane, tier, tenant_id) DO UPDATE
    SET place = excluded.place, last_round = excluded.last_round, last_seq = excluded.last_seq,
        credit = excluded.credit, cut = excluded.cut, next_round = excluded.next_round;
    UPDATE pgqueue.lane_tiers l
    SET seq = l.seq + coalesce(cardinality(ids), 0), folded_at = now(),
        full_at = CASE WHEN look_at_all THEN now() ELSE l.full_at END,
        (frontier_round, frontier_place, frontier_seq) = (
            SELECT f.last_round, f.place, f.last_seq FROM pgqueue.flows f
            WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut
            ORDER BY f.last_round, f.place, f.last_seq LIMIT 1)
    WHERE l.lane = p_lane AND l.tier = p_tier;
    RETURN coalesce(cardinality(ids), 0);
END
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

INDEX = """\
CREATE INDEX IF NOT EXISTS flows_cut_next_idx ON pgqueue.flows USING btree (lane, tier, next_round, place) WHERE cut;
"""


def upgrade() -> None:
    op.execute(
        "DROP FUNCTION pgqueue.claim_keyed(text, pgqueue.tier, integer, text, double precision,"
        " bigint);"
        " DROP FUNCTION pgqueue.claim_admitted(integer, text, double precision);"
        " DROP FUNCTION pgqueue.claim_lanes(integer, text, double precision, boolean)"
    )
    op.execute(INDEX)
    for statement in (
        LANE_TIERS_UNSTAMPED,
        LANE_TIERS_TO_FOLD,
        CLAIM_KEYED,
        CLAIM_TIER,
        CLAIM_LANES,
        CLAIM,
        CLAIM_ADMITTED,
        STAMP,
        CANCEL,
    ):
        op.execute(statement)


def downgrade() -> None:
    op.execute(
        "DROP FUNCTION pgqueue.claim_keyed(text, pgqueue.tier[], integer[], text,"
        " double precision, bigint);"
        " DROP FUNCTION pgqueue.claim_tier(text, pgqueue.tier, integer, text, double precision);"
        " DROP FUNCTION pgqueue.claim_admitted(integer, text, double precision, text[]);"
        " DROP FUNCTION pgqueue.claim_lanes(integer, text, double precision, boolean, text[]);"
        " DROP FUNCTION pgqueue.lane_tiers_to_fold();"
        " DROP INDEX IF EXISTS pgqueue.flows_cut_next_idx"
    )
    for statement in (
        LANE_TIERS_UNSTAMPED_BEFORE,
        CLAIM_KEYED_BEFORE,
        CLAIM_LANES_BEFORE,
        CLAIM_BEFORE,
        CLAIM_ADMITTED_BEFORE,
        STAMP_BEFORE,
        CANCEL_BEFORE,
    ):
        op.execute(statement)
