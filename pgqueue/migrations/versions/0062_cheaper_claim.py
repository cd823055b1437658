"""A cheaper claim (issue 28, speed; docs/bench.md): fewer probes and statements per claim.

- ``lane_tiers_due`` (new; ``lane_tiers_unstamped`` goes): the lanes and tiers with unstamped
  due jobs, and the latest due run_at of each, by a skip scan from the end of
  ``jobs_unstamped_due_idx``: one probe per pair where there were two, and
  ``lane_tiers_to_fold`` reads "jobs due since the last fold" from that run_at instead of a
  third probe (an ``EXISTS`` over ``jobs_queued_run_at_idx``). A new name, as the return type
  changes: older revisions replace ``lane_tiers_unstamped`` with its old one.
- ``tier_slots`` reads the tiers' weights by simple expressions (no statement per claim), and
  ``claim_lanes`` returns the claimed rows without copying each into a second variable.
- (``job_claim`` calls ``claim_lanes`` directly, not through ``claim_admitted``: a named query,
  no revision.)

The texts are 071_claim.sql's.

Revision ID: 0062
Revises: 0061
"""

from __future__ import annotations

from alembic import op

revision = "0062"
down_revision = "0061"
branch_labels = None
depends_on = None

LANE_TIERS_DUE = """\
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
"""

LANE_TIERS_TO_FOLD = """\
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
"""

TIER_SLOTS = """\
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
"""

CLAIM_LANES = """\
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
    CROSS JOIN LATERAL (  -- a probe of jobs_unstamped_due_idx per pair (as EXISTS, with no
                          -- statistics on new rows yet, a hash semi join read every
                          -- unstamped job: 450 ms a claim; without the ORDER BY, a Seq Scan)
        SELECT FROM pgqueue.jobs j
        WHERE j.lane = s.lane AND j.priority = s.tier AND j.state = 'queued'
          AND j.key_round IS NULL AND j.run_at <= now()
        ORDER BY j.run_at LIMIT 1) due
$$;
"""

LANE_TIERS_TO_FOLD_BEFORE = """\
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

TIER_SLOTS_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.tier_slots(tiers pgqueue.tier[], n integer)
RETURNS integer[]
LANGUAGE plpgsql
AS $$
DECLARE
    policy constant text := pgqueue.tier_policy();
    weights double precision[] := ARRAY(SELECT pgqueue.tier_weight(t) FROM unnest(tiers) t);
    slots integer[] := array_fill(0, ARRAY[cardinality(tiers)]);
    total double precision := (SELECT sum(w) FROM unnest(weights) w);
    x double precision;
    i integer;
BEGIN
    IF policy = 'strict' THEN
        slots[1] := n;
        RETURN slots;
    END IF;
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
"""

CLAIM_LANES_BEFORE = """\
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


def upgrade() -> None:
    for statement in (LANE_TIERS_DUE, LANE_TIERS_TO_FOLD, TIER_SLOTS, CLAIM_LANES):
        op.execute(statement)
    op.execute("DROP FUNCTION IF EXISTS pgqueue.lane_tiers_unstamped()")


def downgrade() -> None:
    for statement in (
        LANE_TIERS_UNSTAMPED_BEFORE,
        LANE_TIERS_TO_FOLD_BEFORE,
        TIER_SLOTS_BEFORE,
        CLAIM_LANES_BEFORE,
    ):
        op.execute(statement)
    op.execute("DROP FUNCTION IF EXISTS pgqueue.lane_tiers_due()")
