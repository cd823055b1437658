-- The shared provider rate limiter: per model, token buckets for requests, input and output
-- tokens, refilled by time and corrected from the anthropic-ratelimit-* headers; a cooldown
-- after a 429 stops every worker from sending to that model until it ends. The claim takes
-- from these buckets (claim_admitted, 070_claim.sql), so it claims only what can be sent now.

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
        limits_from_headers = r.limits_from_headers
    WHERE l.model = r.model
$$;

-- Admission for one request: take 1 request, the estimated input tokens (corrected by the
-- model's observed ratio) and max_tokens of output, if all three fit and no cooldown is open.
-- Input tokens are an estimate (characters / 4), so the input bucket keeps a margin for its
-- error: a request fits when the level minus the margin holds it (GUC
-- pgqueue.ratelimit_input_margin, a share of the per-minute limit, default 0.02; less for a
-- request too large to leave it, which may then take a full bucket). Without it a worker
-- starting on a full 40k bucket admitted 40.3k tokens in its first second and met a 429.
-- Returns 0 when taken; else the seconds until they would fit ('Infinity' when a request is
-- larger than a bucket's capacity: it can never be sent whole).
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
