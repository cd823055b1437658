-- The shared provider rate limiter: per model, token buckets for requests, input and output
-- tokens, refilled by time and corrected from the anthropic-ratelimit-* headers; a cooldown
-- after a 429 stops every worker from sending to that model until it ends. The claim takes
-- from these buckets (claim_lanes, 071_claim.sql), so it claims only what can be sent now.

-- The row of a model, created on first use with the default limits (GUCs
-- pgqueue.default_requests_per_minute 50, default_input_tokens_per_minute 40000,
-- default_output_tokens_per_minute 8000), refilled to now and locked for the caller.
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_row(p_model text)
RETURNS pgqueue.rate_limits
LANGUAGE plpgsql
AS $$
DECLARE
    r pgqueue.rate_limits;
    elapsed double precision;
BEGIN
    SELECT * INTO r FROM pgqueue.rate_limits l WHERE l.model = p_model FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO pgqueue.rate_limits AS l (
            model, requests_per_minute, input_tokens_per_minute, output_tokens_per_minute,
            requests_available, input_tokens_available, output_tokens_available)
        SELECT p_model, rpm, itpm, otpm, rpm, itpm, otpm
        FROM (SELECT pgqueue.setting('default_requests_per_minute', 50) AS rpm,
                     pgqueue.setting('default_input_tokens_per_minute', 40000) AS itpm,
                     pgqueue.setting('default_output_tokens_per_minute', 8000) AS otpm) d
        ON CONFLICT (model) DO NOTHING;
        SELECT * INTO r FROM pgqueue.rate_limits l WHERE l.model = p_model FOR UPDATE;
    END IF;
    -- continuous refill: min(capacity, level + capacity / 60 × elapsed seconds)
    elapsed := greatest(0, extract(epoch FROM now() - r.refreshed_at));
    r.requests_available := least(r.requests_per_minute,
        r.requests_available + elapsed * r.requests_per_minute / 60.0);
    r.input_tokens_available := least(r.input_tokens_per_minute,
        r.input_tokens_available + elapsed * r.input_tokens_per_minute / 60.0);
    r.output_tokens_available := least(r.output_tokens_per_minute,
        r.output_tokens_available + elapsed * r.output_tokens_per_minute / 60.0);
    r.refreshed_at := greatest(now(), r.refreshed_at);
    RETURN r;
END
$$;

-- Write back a model's row as ratelimit_row returned it, changed by the caller.
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

-- Seconds until one request fits the row `r` (refilled to now): 1 request, the estimated input
-- tokens times the model's observed ratio, and max_tokens of output, with no cooldown open;
-- 0 when it fits now, 'Infinity' when it is larger than a bucket's limit (never whole).
-- Input tokens are an estimate (characters / 4), so the input bucket keeps a margin for its
-- error (GUC pgqueue.ratelimit_input_margin, a share of the limit, default 0.02; less for a
-- request too large to leave it): without it a worker starting on a full 40k bucket admitted
-- 40.3k tokens in its first second and met a 429. With `p_tier`, the tier's rule on both
-- token buckets too (tier_short). The margin guards every take, the reserve only some: the
-- reserve counts the margin in rather than adding to it (a take leaving the 25 % reserve leaves
-- the 2 % margin), so the margin binds alone only where no reserve is kept (critical, or below
-- busy tiers). The tier's wait is a lower bound (others' guarantees grow meanwhile): the
-- caller asks again.
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

-- Admission for one request (ratelimit_wait): takes it if it fits now, paid first from the
-- guarantees of `p_tier` (with no tier: from the buckets, as the claim did before tiers shared
-- them), and moves each bucket's mean size 1/16 of the way to it (the first take sets it). The
-- reserve a tier keeps depends on the tiers backlogged at the last ratelimit_pick_tier, so a
-- claim picks the tier first, then takes its head job.
-- Returns 0 when taken; else the seconds until it would fit ('Infinity': never whole).
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

-- The tier a lane's claim sends next. p_needs: the estimated input tokens (as for
-- ratelimit_try_take: the ratio is applied here) of each tier's head job, in tier order
-- (critical, standard, batch), NULL for a tier with nothing due; p_output_needs likewise
-- their max_tokens (NULL: not checked here). Grows both buckets' guarantees up to now
-- (tier_grow), records the backlogged tiers, saves, and returns the highest tier whose head
-- ratelimit_try_take would take now, or let through (larger than a bucket: it would block its
-- tier forever), or NULL.
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

-- A request taken by a claim and then not sent (the worker deferred its job: no API key, say)
-- gives back what ratelimit_try_take took: one request, the estimated input tokens at the
-- model's current ratio, and its output tokens, never past a bucket's limit. Found by a fresh
-- tester: a worker without a key held a model's output bucket near empty for every worker.
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_release(p_model text, p_input_tokens double precision,
                                                     p_output_tokens double precision)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    r pgqueue.rate_limits := pgqueue.ratelimit_row(p_model);
BEGIN
    r.requests_available := least(r.requests_per_minute, r.requests_available + 1);
    r.input_tokens_available := least(r.input_tokens_per_minute,
        r.input_tokens_available + p_input_tokens * r.input_estimate_ratio);
    r.output_tokens_available := least(r.output_tokens_per_minute,
        r.output_tokens_available + p_output_tokens);
    PERFORM pgqueue.ratelimit_save(r);
END
$$;

-- After an answer: correct the buckets from the provider's headers (limits learned from
-- *-limit; levels lowered to *-remaining, never raised, since requests in flight are not yet
-- counted there), refund the output and input tokens reserved but not used, and update the
-- model's input estimate ratio (EWMA, weight 0.1) from the real usage.
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_observe(
    p_model text,
    p_requests_limit double precision, p_requests_remaining double precision,
    p_input_limit double precision, p_input_remaining double precision,
    p_output_limit double precision, p_output_remaining double precision,
    p_estimated_input double precision, p_actual_input double precision,
    p_reserved_output double precision, p_actual_output double precision)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    r pgqueue.rate_limits := pgqueue.ratelimit_row(p_model);
BEGIN
    IF p_estimated_input > 0 AND p_actual_input IS NOT NULL THEN
        r.input_tokens_available := least(r.input_tokens_per_minute, r.input_tokens_available
            + p_estimated_input * r.input_estimate_ratio - p_actual_input);
        r.input_estimate_ratio := greatest(0.05, least(20.0,
            0.9 * r.input_estimate_ratio + 0.1 * (p_actual_input / p_estimated_input)));
    END IF;
    IF p_reserved_output IS NOT NULL AND p_actual_output IS NOT NULL THEN
        r.output_tokens_available := least(r.output_tokens_per_minute,
            r.output_tokens_available + greatest(0, p_reserved_output - p_actual_output));
    END IF;
    IF p_requests_limit > 0 THEN
        r.requests_per_minute := p_requests_limit;
        r.limits_from_headers := true;
    END IF;
    IF p_input_limit > 0 THEN
        r.input_tokens_per_minute := p_input_limit;
        r.limits_from_headers := true;
    END IF;
    IF p_output_limit > 0 THEN
        r.output_tokens_per_minute := p_output_limit;
        r.limits_from_headers := true;
    END IF;
    r.requests_available := least(r.requests_available, r.requests_per_minute,
                                  coalesce(p_requests_remaining, 'Infinity'));
    r.input_tokens_available := least(r.input_tokens_available, r.input_tokens_per_minute,
                                      coalesce(p_input_remaining, 'Infinity'));
    r.output_tokens_available := least(r.output_tokens_available, r.output_tokens_per_minute,
                                       coalesce(p_output_remaining, 'Infinity'));
    PERFORM pgqueue.ratelimit_save(r);
END
$$;

-- A 429/529: the account's limit is spent. No worker sends to the model before now + seconds.
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_cooldown(p_model text, p_seconds double precision)
RETURNS timestamptz
LANGUAGE plpgsql
AS $$
DECLARE
    r pgqueue.rate_limits := pgqueue.ratelimit_row(p_model);
BEGIN
    r.cooldown_until := greatest(r.cooldown_until,
                                 now() + make_interval(secs => greatest(p_seconds, 0)));
    r.requests_available := least(r.requests_available, 0);
    PERFORM pgqueue.ratelimit_save(r);
    RETURN r.cooldown_until;
END
$$;
