"""A claim folds a lane and tier only when the fold has work: ``lane_tiers_to_fold`` lists the
pairs with no fold yet, jobs due since the last fold, stamped work within the frontier down
to less than half the horizon, or the once-a-second look at every tenant due.
``claim_lanes`` folds a pair whose claim reaches its frontier there and then, and its claim
goes on (no second pass over every lane).

A claim commits without waiting for its WAL flush only when it took from a model's buckets
(``claim_lanes`` sets it there; ``claim_admitted`` is a plain wrapper now): other claims
are durable at their commit, and the worker skips ``job_claim_durable`` for them.

Revision ID: 0045
Revises: 0044
"""

from __future__ import annotations

from alembic import op

revision = "0045"
down_revision = "0044"
branch_labels = None
depends_on = None

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
                    AND j.key_round IS NULL AND j.run_at >= l.folded_at AND j.run_at <= now())
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

CLAIM_ADMITTED = """\
CREATE OR REPLACE FUNCTION pgqueue.claim_admitted(
    max_jobs integer,
    worker_id text,
    lease_seconds double precision
)
RETURNS TABLE(job pgqueue.jobs, blocked_seconds double precision)
LANGUAGE sql
AS $$
    SELECT c.job, c.blocked_seconds
    FROM pgqueue.claim_lanes(max_jobs, worker_id, lease_seconds, true) c
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


def upgrade() -> None:
    op.execute(LANE_TIERS_TO_FOLD)
    op.execute(CLAIM_LANES)
    op.execute(CLAIM_ADMITTED)


def downgrade() -> None:
    op.execute(CLAIM_LANES_BEFORE)
    op.execute(CLAIM_ADMITTED_BEFORE)
    op.execute("DROP FUNCTION IF EXISTS pgqueue.lane_tiers_to_fold()")
