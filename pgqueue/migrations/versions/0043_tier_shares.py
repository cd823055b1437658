"""The tiers share a model's input-token bucket (issue 28): guarantees per tier that grow at
their weight's share of the refill while the tier is backlogged, and a trunk reserve that a
lower tier leaves in the bucket while a higher tier is idle (GUC ratelimit_trunk_reserve, default
1/4 of the limit; TierShares, the pure reference in pgqueue/scheduling/capacity.py). Columns on ``pgqueue.rate_limits``, ``ratelimit_pick_tier``,
``ratelimit_try_take`` with a tier, the guarantees in ``rate_limit_state``, and the claim of a
rate-limited lane picking its tier by them (``claim_lanes``, weighted policy).

Revision ID: 0043
Revises: 0042
"""

from __future__ import annotations

from alembic import op

revision = "0043"
down_revision = "0042"
branch_labels = None
depends_on = None

COLUMNS = """\
ALTER TABLE pgqueue.rate_limits
    ADD COLUMN IF NOT EXISTS guarantee_critical double precision DEFAULT 0 NOT NULL,
    ADD COLUMN IF NOT EXISTS guarantee_standard double precision DEFAULT 0 NOT NULL,
    ADD COLUMN IF NOT EXISTS guarantee_batch double precision DEFAULT 0 NOT NULL,
    ADD COLUMN IF NOT EXISTS guarantees_at timestamp with time zone DEFAULT now() NOT NULL,
    ADD COLUMN IF NOT EXISTS tiers_backlogged pgqueue.tier[] DEFAULT '{}'::pgqueue.tier[] NOT NULL
"""
RATELIMIT_SAVE = """\
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_save(r pgqueue.rate_limits)
RETURNS void
LANGUAGE sql
AS $$
    UPDATE pgqueue.rate_limits l
    SET requests_per_minute = r.requests_per_minute,
        input_tokens_per_minute = r.input_tokens_per_minute,
        output_tokens_per_minute = r.output_tokens_per_minute,
        requests_available = r.requests_available,
        input_tokens_available = r.input_tokens_available,
        output_tokens_available = r.output_tokens_available,
        refreshed_at = r.refreshed_at,
        cooldown_until = r.cooldown_until,
        input_estimate_ratio = r.input_estimate_ratio,
        limits_from_headers = r.limits_from_headers,
        -- Σ guarantees never above the level (lowered by a header, an untiered take): the
        -- lowest tiers give back first
        guarantee_critical = least(r.guarantee_critical, greatest(0, r.input_tokens_available)),
        guarantee_standard = least(r.guarantee_standard,
            greatest(0, r.input_tokens_available - r.guarantee_critical)),
        guarantee_batch = least(r.guarantee_batch, greatest(0,
            r.input_tokens_available - r.guarantee_critical - r.guarantee_standard)),
        guarantees_at = r.guarantees_at,
        tiers_backlogged = r.tiers_backlogged
    WHERE l.model = r.model
$$;
"""

RATELIMIT_TIER_RESERVE = """\
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_tier_reserve(r pgqueue.rate_limits,
                                                          p_tier pgqueue.tier,
                                                          p_need double precision)
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        -- the tiers from critical down to p_tier: all backlogged, or p_tier itself
        WHEN enum_range(NULL::pgqueue.tier, p_tier) <@ (r.tiers_backlogged || p_tier) THEN 0
        ELSE greatest(0, least(
            pgqueue.setting('ratelimit_trunk_reserve', 0.25) * r.input_tokens_per_minute,
            r.input_tokens_per_minute - p_need))
    END
$$;
"""

RATELIMIT_WAIT = """\
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_wait(r pgqueue.rate_limits, p_tier pgqueue.tier,
                                                  p_input_tokens double precision,
                                                  p_output_tokens double precision)
RETURNS double precision
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    need_in double precision := p_input_tokens * r.input_estimate_ratio;
    rate double precision := r.input_tokens_per_minute / 60.0;
    margin double precision := least(
        pgqueue.setting('ratelimit_input_margin', 0.02) * r.input_tokens_per_minute,
        greatest(0, r.input_tokens_per_minute - need_in));
    held double precision := CASE p_tier WHEN 'critical' THEN r.guarantee_critical
        WHEN 'standard' THEN r.guarantee_standard WHEN 'batch' THEN r.guarantee_batch END;
    free double precision := r.input_tokens_available
        - (r.guarantee_critical + r.guarantee_standard + r.guarantee_batch);
    short double precision := 0;
BEGIN
    IF r.cooldown_until > now() THEN
        RETURN extract(epoch FROM r.cooldown_until - now());
    END IF;
    IF need_in > r.input_tokens_per_minute OR p_output_tokens > r.output_tokens_per_minute THEN
        RETURN 'Infinity'::double precision;
    END IF;
    IF held < need_in THEN  -- not from the guarantee alone (NULL for no tier)
        short := pgqueue.ratelimit_tier_reserve(r, p_tier, need_in) - (held + free - need_in);
    END IF;
    RETURN greatest(
        (1 - r.requests_available) / (r.requests_per_minute / 60.0),
        (need_in + margin - r.input_tokens_available) / rate,
        (p_output_tokens - r.output_tokens_available) / (r.output_tokens_per_minute / 60.0),
        short / rate,
        0);
END
$$;
"""

# The old signature (text, double precision, double precision) is dropped first: the new one
# has a fourth argument with a default, and both would make a three-argument call ambiguous.
DROP_OLD_TRY_TAKE = (
    "DROP FUNCTION IF EXISTS pgqueue.ratelimit_try_take(text, double precision, double precision)"
)
RATELIMIT_TRY_TAKE = """\
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_try_take(p_model text, p_input_tokens double precision,
                                                      p_output_tokens double precision,
                                                      p_tier pgqueue.tier DEFAULT NULL)
RETURNS double precision
LANGUAGE plpgsql
AS $$
DECLARE
    r pgqueue.rate_limits := pgqueue.ratelimit_row(p_model);
    need_in double precision := p_input_tokens * r.input_estimate_ratio;
    wait double precision := pgqueue.ratelimit_wait(r, p_tier, p_input_tokens, p_output_tokens);
BEGIN
    IF wait = 0 THEN
        r.requests_available := r.requests_available - 1;
        r.input_tokens_available := r.input_tokens_available - need_in;
        r.output_tokens_available := r.output_tokens_available - p_output_tokens;
        r.guarantee_critical := greatest(0, r.guarantee_critical
            - CASE WHEN p_tier = 'critical' THEN need_in ELSE 0 END);
        r.guarantee_standard := greatest(0, r.guarantee_standard
            - CASE WHEN p_tier = 'standard' THEN need_in ELSE 0 END);
        r.guarantee_batch := greatest(0, r.guarantee_batch
            - CASE WHEN p_tier = 'batch' THEN need_in ELSE 0 END);
    END IF;
    PERFORM pgqueue.ratelimit_save(r);
    RETURN wait;
END
$$;
"""

RATELIMIT_PICK_TIER = """\
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_pick_tier(p_model text, p_needs double precision[],
                                                       p_output_needs double precision[]
                                                           DEFAULT NULL)
RETURNS pgqueue.tier
LANGUAGE plpgsql
AS $$
DECLARE
    r pgqueue.rate_limits := pgqueue.ratelimit_row(p_model);
    tiers pgqueue.tier[] := enum_range(NULL::pgqueue.tier);
    need double precision[];
    g double precision[] := ARRAY[r.guarantee_critical, r.guarantee_standard, r.guarantee_batch];
    -- the tiers' weights (GUC pgqueue.tier_weight_<tier>, else 70, 25, 5)
    w double precision[] := ARRAY[pgqueue.setting('tier_weight_critical', 70),
                                  pgqueue.setting('tier_weight_standard', 25),
                                  pgqueue.setting('tier_weight_batch', 5)];
    rate double precision := r.input_tokens_per_minute / 60.0;
    elapsed double precision := greatest(0, extract(epoch FROM now() - r.guarantees_at));
    total_w double precision := 0;
    grow double precision;
    picked pgqueue.tier;
BEGIN
    IF array_length(p_needs, 1) IS DISTINCT FROM 3 THEN
        RAISE EXCEPTION 'p_needs must have one element per tier (3), got %', p_needs
            USING ERRCODE = '22023';
    END IF;
    need := ARRAY(SELECT n * r.input_estimate_ratio FROM unnest(p_needs) WITH ORDINALITY u(n, i)
                  ORDER BY i);
    r.tiers_backlogged := ARRAY(SELECT tiers[i] FROM generate_series(1, 3) i
                                WHERE need[i] IS NOT NULL ORDER BY i);
    FOR i IN 1 .. 3 LOOP
        g[i] := CASE WHEN need[i] IS NULL THEN 0 ELSE least(g[i], need[i]) END;
        total_w := total_w + CASE WHEN need[i] IS NULL THEN 0 ELSE w[i] END;
    END LOOP;
    FOR i IN 1 .. 3 LOOP
        CONTINUE WHEN need[i] IS NULL;
        grow := least(w[i] / total_w * rate * elapsed,
                      r.input_tokens_available - (g[1] + g[2] + g[3])
                      - pgqueue.ratelimit_tier_reserve(r, tiers[i], need[i]));
        IF grow > 0 THEN
            g[i] := g[i] + grow;
        END IF;
    END LOOP;
    r.guarantee_critical := g[1];
    r.guarantee_standard := g[2];
    r.guarantee_batch := g[3];
    r.guarantees_at := greatest(now(), r.guarantees_at);
    FOR i IN 1 .. 3 LOOP
        CONTINUE WHEN need[i] IS NULL;
        IF pgqueue.ratelimit_wait(r, tiers[i], p_needs[i], coalesce(p_output_needs[i], 0))
               IN (0, 'Infinity'::double precision) THEN
            picked := tiers[i];
            EXIT;
        END IF;
    END LOOP;
    PERFORM pgqueue.ratelimit_save(r);
    RETURN picked;
END
$$;
"""

RATE_LIMIT_STATE = """\
CREATE OR REPLACE VIEW pgqueue.rate_limit_state AS
SELECT l.model, l.requests_per_minute, l.input_tokens_per_minute, l.output_tokens_per_minute,
       least(l.requests_per_minute, l.requests_available
             + greatest(0, extract(epoch FROM now() - l.refreshed_at)) * l.requests_per_minute / 60.0)
           AS requests_available,
       least(l.input_tokens_per_minute, l.input_tokens_available
             + greatest(0, extract(epoch FROM now() - l.refreshed_at)) * l.input_tokens_per_minute / 60.0)
           AS input_tokens_available,
       least(l.output_tokens_per_minute, l.output_tokens_available
             + greatest(0, extract(epoch FROM now() - l.refreshed_at)) * l.output_tokens_per_minute / 60.0)
           AS output_tokens_available,
       coalesce(l.cooldown_until > now(), false) AS cooling_down,
       l.cooldown_until, l.input_estimate_ratio, l.limits_from_headers,
       l.guarantee_critical, l.guarantee_standard, l.guarantee_batch, l.guarantees_at,
       l.tiers_backlogged
FROM pgqueue.rate_limits l;
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
BEGIN
    IF coalesce(p_max, 0) <= 0 THEN
        RETURN;
    END IF;
    PERFORM pgqueue.tier_policy();  -- an unknown policy is refused even on an empty queue
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
                    -- The tier to send: strict priority order among the backlogged tiers.
                    -- issue-28-shares: t := pgqueue.ratelimit_pick_tier(lane.lane, needs)
                    j := NULL;
                    FOREACH t IN ARRAY lane.tiers LOOP
                        j := pgqueue.lane_head(lane.lane, t);
                        EXIT WHEN j.id IS NOT NULL OR pgqueue.lane_tier_cut(lane.lane, t);
                    END LOOP;
                    IF j.id IS NULL THEN
                        again := again OR pgqueue.lane_tier_cut(lane.lane, t);
                        EXIT;
                    END IF;
                    wait := 0;
                    IF j.kind = 'anthropic.messages' AND j.model IS NOT NULL
                       AND NOT pgqueue.batch_lane_takes(j.id, j.tenant_id, j.priority, j.kind)
                    THEN
                        wait := pgqueue.ratelimit_try_take(j.model, j.est_input_tokens,
                                                           j.max_output_tokens);
                    END IF;
                    IF wait > 0 AND wait < 'Infinity'::double precision THEN
                        blocked := least(coalesce(blocked, wait), wait);
                        EXIT;
                    END IF;
                    RETURN QUERY SELECT c, NULL::double precision
                                 FROM pgqueue.claim_keyed(lane.lane, j.priority, 1, p_worker,
                                                          p_lease, j.id) c;
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

RATELIMIT_SAVE_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_save(r pgqueue.rate_limits)
RETURNS void
LANGUAGE sql
AS $$
    UPDATE pgqueue.rate_limits l
    SET requests_per_minute = r.requests_per_minute,
        input_tokens_per_minute = r.input_tokens_per_minute,
        output_tokens_per_minute = r.output_tokens_per_minute,
        requests_available = r.requests_available,
        input_tokens_available = r.input_tokens_available,
        output_tokens_available = r.output_tokens_available,
        refreshed_at = r.refreshed_at,
        cooldown_until = r.cooldown_until,
        input_estimate_ratio = r.input_estimate_ratio,
        limits_from_headers = r.limits_from_headers
    WHERE l.model = r.model
$$;
"""

RATELIMIT_TRY_TAKE_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_try_take(p_model text, p_input_tokens double precision,
                                                      p_output_tokens double precision)
RETURNS double precision
LANGUAGE plpgsql
AS $$
DECLARE
    r pgqueue.rate_limits := pgqueue.ratelimit_row(p_model);
    need_in double precision := p_input_tokens * r.input_estimate_ratio;
    margin double precision := least(
        pgqueue.setting('ratelimit_input_margin', 0.02) * r.input_tokens_per_minute,
        greatest(0, r.input_tokens_per_minute - need_in));
    wait double precision := 0;
BEGIN
    IF r.cooldown_until > now() THEN
        RETURN extract(epoch FROM r.cooldown_until - now());
    END IF;
    IF need_in > r.input_tokens_per_minute OR p_output_tokens > r.output_tokens_per_minute THEN
        RETURN 'Infinity'::double precision;
    END IF;
    wait := greatest(
        (1 - r.requests_available) / (r.requests_per_minute / 60.0),
        (need_in + margin - r.input_tokens_available) / (r.input_tokens_per_minute / 60.0),
        (p_output_tokens - r.output_tokens_available) / (r.output_tokens_per_minute / 60.0),
        0);
    IF wait > 0 THEN
        PERFORM pgqueue.ratelimit_save(r);
        RETURN wait;
    END IF;
    r.requests_available := r.requests_available - 1;
    r.input_tokens_available := r.input_tokens_available - need_in;
    r.output_tokens_available := r.output_tokens_available - p_output_tokens;
    PERFORM pgqueue.ratelimit_save(r);
    RETURN 0;
END
$$;
"""

RATE_LIMIT_STATE_BEFORE = """\
CREATE VIEW pgqueue.rate_limit_state AS
SELECT l.model, l.requests_per_minute, l.input_tokens_per_minute, l.output_tokens_per_minute,
       least(l.requests_per_minute, l.requests_available
             + greatest(0, extract(epoch FROM now() - l.refreshed_at)) * l.requests_per_minute / 60.0)
           AS requests_available,
       least(l.input_tokens_per_minute, l.input_tokens_available
             + greatest(0, extract(epoch FROM now() - l.refreshed_at)) * l.input_tokens_per_minute / 60.0)
           AS input_tokens_available,
       least(l.output_tokens_per_minute, l.output_tokens_available
             + greatest(0, extract(epoch FROM now() - l.refreshed_at)) * l.output_tokens_per_minute / 60.0)
           AS output_tokens_available,
       coalesce(l.cooldown_until > now(), false) AS cooling_down,
       l.cooldown_until, l.input_estimate_ratio, l.limits_from_headers
FROM pgqueue.rate_limits l;
"""


def upgrade() -> None:
    op.execute(COLUMNS)
    op.execute(RATELIMIT_SAVE)
    op.execute(RATELIMIT_TIER_RESERVE)
    op.execute(RATELIMIT_WAIT)
    op.execute(DROP_OLD_TRY_TAKE)
    op.execute(RATELIMIT_TRY_TAKE)
    op.execute(RATELIMIT_PICK_TIER)
    op.execute(RATE_LIMIT_STATE)
    op.execute(CLAIM_LANES)


def downgrade() -> None:
    op.execute(CLAIM_LANES_BEFORE)
    op.execute("DROP VIEW IF EXISTS pgqueue.rate_limit_state")
    op.execute(RATE_LIMIT_STATE_BEFORE)
    op.execute(
        "DROP FUNCTION IF EXISTS pgqueue.ratelimit_pick_tier(text, double precision[],"
        " double precision[])"
    )
    op.execute(
        "DROP FUNCTION IF EXISTS pgqueue.ratelimit_try_take(text, double precision,"
        " double precision, pgqueue.tier)"
    )
    op.execute(RATELIMIT_TRY_TAKE_BEFORE)
    op.execute(
        "DROP FUNCTION IF EXISTS pgqueue.ratelimit_wait(pgqueue.rate_limits, pgqueue.tier,"
        " double precision, double precision)"
    )
    op.execute(
        "DROP FUNCTION IF EXISTS pgqueue.ratelimit_tier_reserve(pgqueue.rate_limits,"
        " pgqueue.tier, double precision)"
    )
    op.execute(RATELIMIT_SAVE_BEFORE)
    op.execute(
        "ALTER TABLE pgqueue.rate_limits DROP COLUMN IF EXISTS guarantee_critical,"
        " DROP COLUMN IF EXISTS guarantee_standard, DROP COLUMN IF EXISTS guarantee_batch,"
        " DROP COLUMN IF EXISTS guarantees_at, DROP COLUMN IF EXISTS tiers_backlogged"
    )
