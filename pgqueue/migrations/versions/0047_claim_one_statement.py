"""``claim_keyed`` claims every tier of a lane in one statement (arrays of tiers and counts):
a claim of a lane with three backlogged tiers ran it, and the counters' trigger, three times.
``claim_lanes`` calls it once per lane, then only for a tier that fell short.

Revision ID: 0047
Revises: 0046
"""

from __future__ import annotations

from alembic import op

revision = "0047"
down_revision = "0046"
branch_labels = None
depends_on = None

CLAIM_KEYED = """\
CREATE OR REPLACE FUNCTION pgqueue.claim_keyed(p_lane text, p_tiers pgqueue.tier[],
                                               p_counts integer[], p_worker text,
                                               p_lease double precision,
                                               p_only bigint DEFAULT NULL)
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
                                               p_lease double precision, p_admit boolean)
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
    n integer;
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
                             FROM pgqueue.claim_keyed(lane.lane, all_tiers[k], 1, p_worker,
                                                      p_lease, (heads[k]).id) c;
                got := got + 1;
            END LOOP;
            CONTINUE;
        END IF;
        slots := pgqueue.tier_slots(lane.tiers, p_max - got);
        FOR pass IN 1 .. 2 LOOP
            FOR i IN 1 .. cardinality(lane.tiers) LOOP
                t := lane.tiers[i];
                n := CASE WHEN pass = 1 THEN slots[i] ELSE p_max - got END;
                CONTINUE WHEN n <= 0;
                RETURN QUERY SELECT c, NULL::double precision
                             FROM pgqueue.claim_keyed(lane.lane, t, n, p_worker, p_lease) c;
                GET DIAGNOSTICS k = ROW_COUNT;
                got := got + k;
                IF k < n AND pgqueue.lane_tier_cut(lane.lane, t)
                   AND pgqueue.fold(lane.lane, t) > 0 THEN  -- at the frontier: go on
                    RETURN QUERY SELECT c, NULL::double precision
                                 FROM pgqueue.claim_keyed(lane.lane, t, n - k, p_worker,
                                                          p_lease) c;
                    GET DIAGNOSTICS k = ROW_COUNT;
                    got := got + k;
                END IF;
            END LOOP;
        END LOOP;
    END LOOP;
    IF blocked IS NOT NULL AND got < p_max THEN
        RETURN QUERY SELECT NULL::pgqueue.jobs, blocked;
    END IF;
END
$$;
"""


def upgrade() -> None:
    op.execute(
        "DROP FUNCTION pgqueue.claim_keyed(text, pgqueue.tier, integer, text, double precision,"
        " bigint)"
    )
    op.execute(CLAIM_KEYED)
    op.execute(CLAIM_TIER)
    op.execute(CLAIM_LANES)


def downgrade() -> None:
    op.execute(
        "DROP FUNCTION pgqueue.claim_keyed(text, pgqueue.tier[], integer[], text,"
        " double precision, bigint)"
    )
    op.execute(
        "DROP FUNCTION pgqueue.claim_tier(text, pgqueue.tier, integer, text, double precision)"
    )
    op.execute(CLAIM_KEYED_BEFORE)
    op.execute(CLAIM_LANES_BEFORE)
