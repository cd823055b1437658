-- How the tiers share each of a model's token buckets (input, output): the rule of TierShares
-- (pgqueue/scheduling/capacity.py, the pure reference; docs/drr.md), applied to both. While a
-- tier is backlogged its guarantee grows at its weight's share of the refill (70:25:5 among
-- the backlogged tiers; GUCs pgqueue.tier_weight_<tier>); guaranteed tokens stay in the bucket
-- for that tier. A tier below an idle higher tier keeps the trunk reserve in the bucket: room
-- for pgqueue.ratelimit_trunk_reserve_jobs (default 20) requests of the bucket's mean size (a
-- running mean of the takes), at most pgqueue.ratelimit_trunk_reserve (a share of the
-- per-minute limit, default 0.25), never more than the limit minus its job's need, so every
-- job that fits the bucket is let in eventually. Counted in requests, as trunk reservation
-- counts circuits: the share alone is 15 s of refill at any limit, and held the lower tiers
-- for that long after every drain. Both buckets: with the output tokens binding, lower tiers'
-- smaller requests took them as they came and a critical head needing more never found them.
-- A bucket is passed as (limit per minute, level, guarantees in tier order, mean size); the
-- limiter (060_rate_limiter.sql) applies the rule to a model's two buckets.

-- The reserve `p_tier` must leave for a job needing `p_need` tokens of a bucket: none when
-- every higher tier was backlogged at the last pick (each has its own guarantee), else the
-- trunk reserve.
CREATE OR REPLACE FUNCTION pgqueue.tier_reserve(p_limit double precision, p_mean double precision,
                                                p_backlogged pgqueue.tier[], p_tier pgqueue.tier,
                                                p_need double precision)
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        -- the tiers from critical down to p_tier: all backlogged, or p_tier itself
        WHEN enum_range(NULL::pgqueue.tier, p_tier) <@ (p_backlogged || p_tier) THEN 0
        ELSE greatest(0, least(pgqueue.setting('ratelimit_trunk_reserve', 0.25) * p_limit,
                               pgqueue.setting('ratelimit_trunk_reserve_jobs', 20) * p_mean,
                               p_limit - p_need))
    END
$$;

-- Tokens of a bucket `p_tier` lacks to send a head needing `p_need` under the rule: 0 when its
-- guarantee covers it, or its guarantee and the tokens no guarantee holds cover it and leave
-- its reserve (0 too for no tier: an untiered take is checked against the level alone).
CREATE OR REPLACE FUNCTION pgqueue.tier_short(p_limit double precision, p_level double precision,
                                              p_guarantees double precision[],
                                              p_mean double precision,
                                              p_backlogged pgqueue.tier[], p_tier pgqueue.tier,
                                              p_need double precision)
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN p_tier IS NULL OR held >= p_need THEN 0
        ELSE greatest(0, pgqueue.tier_reserve(p_limit, p_mean, p_backlogged, p_tier, p_need)
                         - (held + p_level - (p_guarantees[1] + p_guarantees[2] + p_guarantees[3])
                            - p_need))
    END
    FROM (SELECT p_guarantees[array_position(enum_range(NULL::pgqueue.tier), p_tier)] AS held) h
$$;

-- A bucket's guarantees grown over `p_elapsed` seconds for the heads' needs `p_needs` (tier
-- order, NULL: not backlogged), as TierShares.advance: a tier not backlogged loses its
-- guarantee, one above its head's need is cut back to it, then each backlogged tier, highest
-- first, gains its weight's share of the refill from the free tokens, a lower tier leaving its
-- reserve.
CREATE OR REPLACE FUNCTION pgqueue.tier_grow(p_limit double precision, p_level double precision,
                                             p_guarantees double precision[],
                                             p_mean double precision,
                                             p_needs double precision[],
                                             p_elapsed double precision)
RETURNS double precision[]
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    tiers pgqueue.tier[] := enum_range(NULL::pgqueue.tier);
    backlogged pgqueue.tier[] := ARRAY(SELECT tiers[i] FROM generate_series(1, 3) i
                                       WHERE p_needs[i] IS NOT NULL ORDER BY i);
    g double precision[] := p_guarantees;
    total_w double precision := 0;
    grow double precision;
BEGIN
    FOR i IN 1 .. 3 LOOP
        g[i] := CASE WHEN p_needs[i] IS NULL THEN 0 ELSE least(g[i], p_needs[i]) END;
        total_w := total_w + CASE WHEN p_needs[i] IS NULL THEN 0
                                  ELSE pgqueue.tier_weight(tiers[i]) END;
    END LOOP;
    FOR i IN 1 .. 3 LOOP
        CONTINUE WHEN p_needs[i] IS NULL;
        grow := least(pgqueue.tier_weight(tiers[i]) / total_w * p_limit / 60.0 * p_elapsed,
                      p_level - (g[1] + g[2] + g[3])
                      - pgqueue.tier_reserve(p_limit, p_mean, backlogged, tiers[i], p_needs[i]));
        IF grow > 0 THEN
            g[i] := g[i] + grow;
        END IF;
    END LOOP;
    RETURN g;
END
$$;
