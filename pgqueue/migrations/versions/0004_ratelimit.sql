-- pgqueue schema, revision 0004: the shared provider rate limiter and cooldown.
-- One row per model: three token buckets (requests, input tokens, output tokens per minute)
-- refilled continuously, as Anthropic meters them (API docs, "Rate limits"), corrected from
-- the anthropic-ratelimit-* headers of every answer, and a cooldown opened by a 429/529 so that
-- no worker on any host sends to that model before the reset. The bucket rule mirrors
-- pgqueue/scheduling/ratelimit.py (TokenBucket); tests compare them.

CREATE TABLE pgqueue.rate_limits (
    model                     text PRIMARY KEY CHECK (model <> ''),
    requests_per_minute       double precision NOT NULL CHECK (requests_per_minute > 0),
    input_tokens_per_minute   double precision NOT NULL CHECK (input_tokens_per_minute > 0),
    output_tokens_per_minute  double precision NOT NULL CHECK (output_tokens_per_minute > 0),
    requests_available        double precision NOT NULL,
    input_tokens_available    double precision NOT NULL,
    output_tokens_available   double precision NOT NULL,
    refreshed_at              timestamptz NOT NULL DEFAULT now(),
    cooldown_until            timestamptz,  -- NULL: no cooldown
    -- observed input tokens / estimated input tokens, an exponential moving average
    input_estimate_ratio      double precision NOT NULL DEFAULT 1.0
                              CHECK (input_estimate_ratio > 0),
    limits_from_headers       boolean NOT NULL DEFAULT false
);

-- The row of a model, created on first use with the default limits (GUCs
-- pgqueue.default_requests_per_minute 50, default_input_tokens_per_minute 40000,
-- default_output_tokens_per_minute 8000), refilled to now and locked for the caller.
CREATE FUNCTION pgqueue.ratelimit_row(p_model text)
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

CREATE FUNCTION pgqueue.ratelimit_save(r pgqueue.rate_limits)
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
-- Returns 0 when taken; else the seconds until they would fit ('Infinity' when a request is
-- larger than a bucket's capacity: it can never be sent whole).
CREATE FUNCTION pgqueue.ratelimit_try_take(p_model text, p_input_tokens double precision,
                                           p_output_tokens double precision)
RETURNS double precision
LANGUAGE plpgsql
AS $$
DECLARE
    r pgqueue.rate_limits := pgqueue.ratelimit_row(p_model);
    need_in double precision := p_input_tokens * r.input_estimate_ratio;
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
        (need_in - r.input_tokens_available) / (r.input_tokens_per_minute / 60.0),
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

-- After an answer: correct the buckets from the provider's headers (limits learned from
-- *-limit; levels lowered to *-remaining, never raised, since requests in flight are not yet
-- counted there), refund the output and input tokens reserved but not used, and update the
-- model's input estimate ratio (EWMA, weight 0.1) from the real usage.
CREATE FUNCTION pgqueue.ratelimit_observe(
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
CREATE FUNCTION pgqueue.ratelimit_cooldown(p_model text, p_seconds double precision)
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

-- Per model: limits, levels refilled to now, cooldown, estimate ratio (read-only).
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

-- The claim behind admission control by the provider's limits: "claim only when the job can
-- be sent now". Claims a batch with pgqueue.claim (tiers + DRR) inside a subtransaction, then
-- takes each rate-limited job's request and tokens from its model's buckets in dispatch
-- order. If one does not fit, the whole batch is rolled back (scheduler state, leases, takes)
-- and claimed again up to the job before it: the dispatch is deterministic, so the same jobs
-- come back and their takes now all succeed. The scheduler's order is kept (no job jumps the
-- blocked one: no priority inversion). Rows: the claimed jobs with blocked_seconds NULL, then,
-- when the limiter stopped the batch, one row with a NULL job and the seconds until the
-- blocked job would fit. A job larger than a whole bucket is let through (its provider answer
-- will say why). Jobs of other kinds than anthropic.messages are not rate limited.
CREATE FUNCTION pgqueue.claim_admitted(max_jobs integer, worker_id text,
                                       lease_seconds double precision)
RETURNS TABLE (job pgqueue.jobs, blocked_seconds double precision)
LANGUAGE plpgsql
AS $$
DECLARE
    want integer := max_jobs;
    got pgqueue.jobs[];
    j pgqueue.jobs;
    wait double precision;
    blocked_at integer;
    blocked_wait double precision;
    tries integer := 0;
BEGIN
    -- The scheduler's lock, held to commit, so that the redo sees the same state. The claim's
    -- commit does not wait for its WAL flush: the lock is released sooner, and a claim lost in
    -- a crash only leaves its jobs queued, to be claimed again (at-least-once execution;
    -- every completion is fenced by the lease token).
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(7310575183440224370);
    LOOP
        tries := tries + 1;
        blocked_at := NULL;
        BEGIN
            got := ARRAY(SELECT c FROM pgqueue.claim(want, worker_id, lease_seconds) c);
            FOR i IN 1 .. coalesce(cardinality(got), 0) LOOP
                j := got[i];
                CONTINUE WHEN j.kind <> 'anthropic.messages' OR j.model IS NULL;
                wait := pgqueue.ratelimit_try_take(j.model, j.est_input_tokens,
                                                   j.max_output_tokens);
                IF wait > 0 AND wait < 'Infinity'::double precision THEN
                    blocked_at := i;
                    blocked_wait := wait;
                    RAISE EXCEPTION 'rate limited' USING ERRCODE = 'PQ901';
                END IF;
            END LOOP;
        EXCEPTION WHEN SQLSTATE 'PQ901' THEN
            NULL;  -- everything of this attempt is undone; `got` and blocked_at survive
        END;
        IF blocked_at IS NULL THEN
            RETURN QUERY SELECT g, NULL::double precision FROM unnest(got) AS g;
            IF want < max_jobs THEN
                RETURN QUERY SELECT NULL::pgqueue.jobs, blocked_wait;
            END IF;
            RETURN;
        END IF;
        want := blocked_at - 1;
        IF want = 0 OR tries >= 3 THEN
            RETURN QUERY SELECT NULL::pgqueue.jobs, blocked_wait;
            RETURN;
        END IF;
    END LOOP;
END
$$;
