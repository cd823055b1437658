"""Cheaper claims, stamps and completions (issue 28, speed; docs/bench.md):

- ``claim_lanes`` runs with ``plan_cache_mode`` = ``force_generic_plan``, and so do the
  statements of what it calls (``claim_keyed``, ``stamp`` through ``fold``, the jobs
  triggers): each claim made a custom plan again for its lane query and each fold for its
  stamping statement (1-5 M instructions each), 10 % of the instructions of a claim and
  completion (callgrind). The plans are index probes whatever the parameters
  (``tests/db/test_drr_explain.py``).
- ``jobs_unstamp`` and ``jobs_tenant_known`` are AFTER ROW triggers, no longer BEFORE: any
  BEFORE ROW trigger on ``pgqueue.jobs`` makes every UPDATE lock each row before writing it (a
  WAL record per row of every stamp, claim and completion), whatever its column list or WHEN.
  ``jobs_unstamp`` now clears the key in a second row version of the (rare) job queued again.

The texts are 070_scheduler.sql's, 071_claim.sql's and 020_settings_and_tenants.sql's.

Revision ID: 0055
Revises: 0054
"""

from __future__ import annotations

from alembic import op

revision = "0055"
down_revision = "0054"
branch_labels = None
depends_on = None

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

JOBS_UNSTAMP = """\
CREATE OR REPLACE FUNCTION pgqueue.jobs_unstamp()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE pgqueue.jobs j SET key_round = NULL, key_place = NULL, key_seq = NULL
    WHERE j.id = NEW.id AND j.tenant_id = NEW.tenant_id AND j.key_round IS NOT NULL;
    RETURN NULL;
END
$$;
"""

JOBS_UNSTAMP_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.jobs_unstamp()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    NEW.key_round := NULL;
    NEW.key_place := NULL;
    NEW.key_seq := NULL;
    RETURN NEW;
END
$$;
"""

JOBS_TENANT_KNOWN = """\
CREATE OR REPLACE FUNCTION pgqueue.jobs_tenant_known()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM 1 FROM pgqueue.tenants t WHERE t.tenant_id = NEW.tenant_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown tenant %: register it first (pgqueue.ensure_tenant)',
            quote_literal(NEW.tenant_id) USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END
$$;
"""

JOBS_TENANT_KNOWN_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.jobs_tenant_known()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM 1 FROM pgqueue.tenants t WHERE t.tenant_id = NEW.tenant_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown tenant %: register it first (pgqueue.ensure_tenant)',
            quote_literal(NEW.tenant_id) USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NEW;
END
$$;
"""

TRIGGERS = """\
CREATE TRIGGER jobs_unstamp
    AFTER UPDATE ON pgqueue.jobs
    FOR EACH ROW
    WHEN (((new.state = 'queued'::pgqueue.job_state) AND (new.key_round IS NOT NULL) AND ((old.state <> 'queued'::pgqueue.job_state) OR (new.run_at <> old.run_at) OR (new.priority <> old.priority) OR (new.tenant_id <> old.tenant_id))))
    EXECUTE FUNCTION pgqueue.jobs_unstamp();

CREATE TRIGGER jobs_tenant_known
    AFTER UPDATE OF tenant_id ON pgqueue.jobs
    FOR EACH ROW
    WHEN ((new.tenant_id IS DISTINCT FROM old.tenant_id))
    EXECUTE FUNCTION pgqueue.jobs_tenant_known();
"""

TRIGGERS_BEFORE = """\
CREATE TRIGGER jobs_unstamp
    BEFORE UPDATE ON pgqueue.jobs
    FOR EACH ROW
    WHEN (((new.state = 'queued'::pgqueue.job_state) AND (new.key_round IS NOT NULL) AND ((old.state <> 'queued'::pgqueue.job_state) OR (new.run_at <> old.run_at) OR (new.priority <> old.priority) OR (new.tenant_id <> old.tenant_id))))
    EXECUTE FUNCTION pgqueue.jobs_unstamp();

CREATE TRIGGER jobs_tenant_known
    BEFORE UPDATE OF tenant_id ON pgqueue.jobs
    FOR EACH ROW
    WHEN ((new.tenant_id IS DISTINCT FROM old.tenant_id))
    EXECUTE FUNCTION pgqueue.jobs_tenant_known();
"""

DROP_TRIGGERS = (
    "DROP TRIGGER IF EXISTS jobs_unstamp ON pgqueue.jobs;"
    " DROP TRIGGER IF EXISTS jobs_tenant_known ON pgqueue.jobs"
)


def upgrade() -> None:
    for statement in (CLAIM_LANES, JOBS_UNSTAMP, JOBS_TENANT_KNOWN, DROP_TRIGGERS, TRIGGERS):
        op.execute(statement)


def downgrade() -> None:
    for statement in (
        CLAIM_LANES_BEFORE,
        JOBS_UNSTAMP_BEFORE,
        JOBS_TENANT_KNOWN_BEFORE,
        DROP_TRIGGERS,
        TRIGGERS_BEFORE,
    ):
        op.execute(statement)
