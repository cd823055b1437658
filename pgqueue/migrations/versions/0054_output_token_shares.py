"""The tiers share the output-token bucket too (issue 28, tier capacity).

The rule of TierShares (guarantees, trunk reserve) shared only the input tokens; with the
output tokens binding (the trace's own output sizes at Tier-1 limits), lower tiers' smaller
requests took them as they came and a critical head needing more never found them. Now both
token buckets are shared by the one rule, written once for a bucket (``tier_reserve``,
``tier_short``, ``tier_grow``); the output bucket's guarantees and mean size are new columns
of ``rate_limits``. It replaces the hold-back of revision 0053 and ``ratelimit_tier_reserve``.
The texts are 010_tables.sql's and 060_rate_limiter.sql's.

Revision ID: 0054
Revises: 0053
"""

from __future__ import annotations

from alembic import op

revision = "0054"
down_revision = "0053"
branch_labels = None
depends_on = None

ADD_COLUMNS = """\
ALTER TABLE pgqueue.rate_limits
    ADD COLUMN IF NOT EXISTS output_guarantee_critical double precision DEFAULT 0 NOT NULL,
    ADD COLUMN IF NOT EXISTS output_guarantee_standard double precision DEFAULT 0 NOT NULL,
    ADD COLUMN IF NOT EXISTS output_guarantee_batch double precision DEFAULT 0 NOT NULL,
    ADD COLUMN IF NOT EXISTS mean_output_tokens double precision DEFAULT 0 NOT NULL
"""

FUNCTIONS = """\
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
        tiers_backlogged = r.tiers_backlogged,
        mean_input_tokens = r.mean_input_tokens,
        output_guarantee_critical = least(r.output_guarantee_critical,
            greatest(0, r.output_tokens_available)),
        output_guarantee_standard = least(r.output_guarantee_standard,
            greatest(0, r.output_tokens_available - r.output_guarantee_critical)),
        output_guarantee_batch = least(r.output_guarantee_batch, greatest(0,
            r.output_tokens_available - r.output_guarantee_critical
            - r.output_guarantee_standard)),
        mean_output_tokens = r.mean_output_tokens
    WHERE l.model = r.model
$$;

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

CREATE OR REPLACE FUNCTION pgqueue.ratelimit_wait(r pgqueue.rate_limits, p_tier pgqueue.tier,
                                                  p_input_tokens double precision,
                                                  p_output_tokens double precision)
RETURNS double precision
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    need_in double precision := p_input_tokens * r.input_estimate_ratio;
    rate_in double precision := r.input_tokens_per_minute / 60.0;
    rate_out double precision := r.output_tokens_per_minute / 60.0;
    margin double precision := least(
        pgqueue.setting('ratelimit_input_margin', 0.02) * r.input_tokens_per_minute,
        greatest(0, r.input_tokens_per_minute - need_in));
BEGIN
    IF r.cooldown_until > now() THEN
        RETURN extract(epoch FROM r.cooldown_until - now());
    END IF;
    IF need_in > r.input_tokens_per_minute OR p_output_tokens > r.output_tokens_per_minute THEN
        RETURN 'Infinity'::double precision;
    END IF;
    RETURN greatest(
        (1 - r.requests_available) / (r.requests_per_minute / 60.0),
        (need_in + margin - r.input_tokens_available) / rate_in,
        (p_output_tokens - r.output_tokens_available) / rate_out,
        pgqueue.tier_short(r.input_tokens_per_minute, r.input_tokens_available,
                           ARRAY[r.guarantee_critical, r.guarantee_standard, r.guarantee_batch],
                           r.mean_input_tokens, r.tiers_backlogged, p_tier, need_in) / rate_in,
        pgqueue.tier_short(r.output_tokens_per_minute, r.output_tokens_available,
                           ARRAY[r.output_guarantee_critical, r.output_guarantee_standard,
                                 r.output_guarantee_batch],
                           r.mean_output_tokens, r.tiers_backlogged, p_tier, p_output_tokens)
            / rate_out,
        0);
END
$$;

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
    pay_in double precision[] := ARRAY(SELECT CASE WHEN t = p_tier THEN need_in ELSE 0 END
                                       FROM unnest(enum_range(NULL::pgqueue.tier)) t);
    pay_out double precision[] := ARRAY(SELECT CASE WHEN t = p_tier THEN p_output_tokens
                                                    ELSE 0 END
                                        FROM unnest(enum_range(NULL::pgqueue.tier)) t);
BEGIN
    IF wait = 0 THEN
        r.requests_available := r.requests_available - 1;
        r.input_tokens_available := r.input_tokens_available - need_in;
        r.output_tokens_available := r.output_tokens_available - p_output_tokens;
        r.guarantee_critical := greatest(0, r.guarantee_critical - pay_in[1]);
        r.guarantee_standard := greatest(0, r.guarantee_standard - pay_in[2]);
        r.guarantee_batch := greatest(0, r.guarantee_batch - pay_in[3]);
        r.output_guarantee_critical := greatest(0, r.output_guarantee_critical - pay_out[1]);
        r.output_guarantee_standard := greatest(0, r.output_guarantee_standard - pay_out[2]);
        r.output_guarantee_batch := greatest(0, r.output_guarantee_batch - pay_out[3]);
        r.mean_input_tokens := CASE WHEN r.mean_input_tokens = 0 THEN need_in
            ELSE r.mean_input_tokens + (need_in - r.mean_input_tokens) / 16 END;
        r.mean_output_tokens := CASE WHEN r.mean_output_tokens = 0 THEN p_output_tokens
            ELSE r.mean_output_tokens + (p_output_tokens - r.mean_output_tokens) / 16 END;
    END IF;
    PERFORM pgqueue.ratelimit_save(r);
    RETURN wait;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.ratelimit_pick_tier(p_model text, p_needs double precision[],
                                                       p_output_needs double precision[]
                                                           DEFAULT NULL)
RETURNS pgqueue.tier
LANGUAGE plpgsql
AS $$
DECLARE
    r pgqueue.rate_limits := pgqueue.ratelimit_row(p_model);
    tiers pgqueue.tier[] := enum_range(NULL::pgqueue.tier);
    elapsed double precision := greatest(0, extract(epoch FROM now() - r.guarantees_at));
    need double precision[];
    outs double precision[];
    g double precision[];
    picked pgqueue.tier;
BEGIN
    IF array_length(p_needs, 1) IS DISTINCT FROM 3 THEN
        RAISE EXCEPTION 'p_needs must have one element per tier (3), got %', p_needs
            USING ERRCODE = '22023';
    END IF;
    need := ARRAY(SELECT n * r.input_estimate_ratio FROM unnest(p_needs) WITH ORDINALITY u(n, i)
                  ORDER BY i);
    outs := ARRAY(SELECT CASE WHEN need[i] IS NOT NULL THEN coalesce(p_output_needs[i], 0) END
                  FROM generate_series(1, 3) i ORDER BY i);
    r.tiers_backlogged := ARRAY(SELECT tiers[i] FROM generate_series(1, 3) i
                                WHERE need[i] IS NOT NULL ORDER BY i);
    g := pgqueue.tier_grow(r.input_tokens_per_minute, r.input_tokens_available,
                           ARRAY[r.guarantee_critical, r.guarantee_standard, r.guarantee_batch],
                           r.mean_input_tokens, need, elapsed);
    r.guarantee_critical := g[1];
    r.guarantee_standard := g[2];
    r.guarantee_batch := g[3];
    g := pgqueue.tier_grow(r.output_tokens_per_minute, r.output_tokens_available,
                           ARRAY[r.output_guarantee_critical, r.output_guarantee_standard,
                                 r.output_guarantee_batch],
                           r.mean_output_tokens, outs, elapsed);
    r.output_guarantee_critical := g[1];
    r.output_guarantee_standard := g[2];
    r.output_guarantee_batch := g[3];
    r.guarantees_at := greatest(now(), r.guarantees_at);
    FOR i IN 1 .. 3 LOOP
        CONTINUE WHEN need[i] IS NULL;
        IF pgqueue.ratelimit_wait(r, tiers[i], p_needs[i], outs[i])
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

FUNCTIONS_BEFORE = """\
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
            pgqueue.setting('ratelimit_trunk_reserve_jobs', 20) * r.mean_input_tokens,
            r.input_tokens_per_minute - p_need))
    END
$$;

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
        tiers_backlogged = r.tiers_backlogged,
        mean_input_tokens = r.mean_input_tokens
    WHERE l.model = r.model
$$;

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
        r.mean_input_tokens := CASE WHEN r.mean_input_tokens = 0 THEN need_in
            ELSE r.mean_input_tokens + (need_in - r.mean_input_tokens) / 16 END;
    END IF;
    PERFORM pgqueue.ratelimit_save(r);
    RETURN wait;
END
$$;

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
    w double precision[] := ARRAY(SELECT pgqueue.tier_weight(u.t)
                                  FROM unnest(tiers) WITH ORDINALITY u(t, i) ORDER BY u.i);
    rate double precision := r.input_tokens_per_minute / 60.0;
    elapsed double precision := greatest(0, extract(epoch FROM now() - r.guarantees_at));
    total_w double precision := 0;
    grow double precision;
    picked pgqueue.tier;
    held_back boolean := false;
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
        CONTINUE WHEN need[i] IS NULL OR (held_back AND g[i] < need[i]);
        IF pgqueue.ratelimit_wait(r, tiers[i], p_needs[i], coalesce(p_output_needs[i], 0))
               IN (0, 'Infinity'::double precision) THEN
            picked := tiers[i];
            EXIT;
        END IF;
        held_back := held_back OR pgqueue.ratelimit_wait(r, tiers[i], p_needs[i], 0) = 0;
    END LOOP;
    PERFORM pgqueue.ratelimit_save(r);
    RETURN picked;
END
$$;

"""


def upgrade() -> None:
    op.execute(ADD_COLUMNS)
    op.execute(FUNCTIONS)
    op.execute(
        "DROP FUNCTION IF EXISTS pgqueue.ratelimit_tier_reserve("
        "pgqueue.rate_limits, pgqueue.tier, double precision)"
    )


def downgrade() -> None:
    op.execute(FUNCTIONS_BEFORE)
    op.execute(
        "DROP FUNCTION IF EXISTS pgqueue.tier_grow(double precision, double precision,"
        " double precision[], double precision, double precision[], double precision),"
        " pgqueue.tier_short(double precision, double precision, double precision[],"
        " double precision, pgqueue.tier[], pgqueue.tier, double precision),"
        " pgqueue.tier_reserve(double precision, double precision, pgqueue.tier[],"
        " pgqueue.tier, double precision)"
    )
    op.execute(
        "ALTER TABLE pgqueue.rate_limits DROP COLUMN IF EXISTS output_guarantee_critical,"
        " DROP COLUMN IF EXISTS output_guarantee_standard,"
        " DROP COLUMN IF EXISTS output_guarantee_batch, DROP COLUMN IF EXISTS mean_output_tokens"
    )
