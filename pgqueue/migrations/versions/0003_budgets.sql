-- pgqueue schema, revision 0003: per-day usage ledger, daily budgets, automatic demotion.
-- The rule mirrors pgqueue/scheduling/demotion.py (tests compare them). Every threshold is a
-- GUC (ALTER DATABASE ... SET pgqueue.x = ...), read when the rule runs.

-- Input and output tokens charged per tenant and day, from the provider's real `usage`.
CREATE TABLE pgqueue.usage_daily (
    tenant_id      text NOT NULL REFERENCES pgqueue.tenants (tenant_id),
    day            date NOT NULL,
    requests       bigint NOT NULL DEFAULT 0,
    input_tokens   bigint NOT NULL DEFAULT 0,
    output_tokens  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, day)
);

-- A numeric GUC with a default (settings are read where the rule runs, on any host).
CREATE FUNCTION pgqueue.setting(name text, default_value double precision)
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT coalesce(nullif(current_setting('pgqueue.' || name, true), '')::double precision,
                    default_value)
$$;

-- The budget day: the date in pgqueue.budget_timezone (default UTC).
CREATE FUNCTION pgqueue.budget_day(at timestamptz DEFAULT now())
RETURNS date
LANGUAGE sql STABLE
AS $$
    SELECT (at AT TIME ZONE coalesce(nullif(current_setting('pgqueue.budget_timezone', true), ''),
                                     'UTC'))::date
$$;

-- Demote the tenant when the rule says so and it is not demoted already; returns the reason
-- of a new demotion, else NULL. Thresholds: pgqueue.demotion_throttle_threshold (5 events),
-- pgqueue.demotion_throttle_window_seconds (60), pgqueue.demotion_budget_ratio (1.5),
-- pgqueue.default_daily_budget (100000 input tokens), pgqueue.demotion_seconds (300).
-- With pgqueue.demote_queued_jobs = on, the tenant's queued standard jobs move to batch too.
CREATE FUNCTION pgqueue.demotion_check(p_tenant text)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    threshold constant double precision := pgqueue.setting('demotion_throttle_threshold', 5);
    window_s constant double precision := pgqueue.setting('demotion_throttle_window_seconds', 60);
    ratio constant double precision := pgqueue.setting('demotion_budget_ratio', 1.5);
    duration constant double precision := pgqueue.setting('demotion_seconds', 300);
    throttles bigint;
    used bigint;
    budget bigint;
    why text;
BEGIN
    IF pgqueue.is_demoted(p_tenant) THEN
        RETURN NULL;
    END IF;
    SELECT count(*) INTO throttles
    FROM pgqueue.throttle_events e
    WHERE e.tenant_id = p_tenant
      AND e.occurred_at > now() - make_interval(secs => window_s);
    IF throttles >= threshold THEN
        why := format('%s throttle events in %s s (threshold %s)', throttles, window_s, threshold);
    ELSE
        SELECT u.input_tokens INTO used
        FROM pgqueue.usage_daily u
        WHERE u.tenant_id = p_tenant AND u.day = pgqueue.budget_day();
        SELECT coalesce(t.daily_token_budget,
                        pgqueue.setting('default_daily_budget', 100000)::bigint)
        INTO budget
        FROM pgqueue.tenants t WHERE t.tenant_id = p_tenant;
        IF coalesce(used, 0) > ratio * coalesce(budget, 100000) THEN
            why := format('%s input tokens today, over %s × the daily budget of %s',
                          used, ratio, budget);
        END IF;
    END IF;
    IF why IS NULL THEN
        RETURN NULL;
    END IF;
    -- One demotion at a time per tenant, even with concurrent checks.
    PERFORM pg_advisory_xact_lock(hashtextextended('pgqueue.demote:' || p_tenant, 0));
    IF pgqueue.is_demoted(p_tenant) THEN
        RETURN NULL;
    END IF;
    INSERT INTO pgqueue.demotions (tenant_id, reason, expires_at)
    VALUES (p_tenant, why, now() + make_interval(secs => duration));
    IF coalesce(current_setting('pgqueue.demote_queued_jobs', true), '') IN ('on', 'true', '1')
    THEN
        UPDATE pgqueue.jobs j SET priority = 'batch'
        WHERE j.tenant_id = p_tenant AND j.state = 'queued' AND j.priority = 'standard';
    END IF;
    RETURN why;
END
$$;

-- Every throttle event attributed to a tenant may demote it.
CREATE FUNCTION pgqueue.throttle_event_demote()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pgqueue.demotion_check(NEW.tenant_id);
    RETURN NULL;
END
$$;

CREATE TRIGGER throttle_events_demote
    AFTER INSERT ON pgqueue.throttle_events
    FOR EACH ROW EXECUTE FUNCTION pgqueue.throttle_event_demote();

-- Successes with real usage are charged to their tenants' day, then the budget rule runs.
-- Statement-level: one upsert per tenant per statement, taken in tenant order, so that two
-- batched completions touching the same tenants can never deadlock on their usage rows.
CREATE FUNCTION pgqueue.job_charge_usage()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    t text;
BEGIN
    INSERT INTO pgqueue.usage_daily AS u (tenant_id, day, requests, input_tokens, output_tokens)
    SELECT n.tenant_id, pgqueue.budget_day(), count(*),
           sum(coalesce(n.input_tokens, 0)), sum(coalesce(n.output_tokens, 0))
    FROM new_rows n
    JOIN old_rows o ON o.id = n.id AND o.tenant_id = n.tenant_id
    WHERE n.state = 'succeeded' AND o.state = 'running'
      AND (n.input_tokens IS NOT NULL OR n.output_tokens IS NOT NULL)
    GROUP BY n.tenant_id
    ORDER BY n.tenant_id COLLATE "C"
    ON CONFLICT (tenant_id, day) DO UPDATE
    SET requests = u.requests + EXCLUDED.requests,
        input_tokens = u.input_tokens + EXCLUDED.input_tokens,
        output_tokens = u.output_tokens + EXCLUDED.output_tokens;
    FOR t IN
        SELECT DISTINCT n.tenant_id COLLATE "C"
        FROM new_rows n
        JOIN old_rows o ON o.id = n.id AND o.tenant_id = n.tenant_id
        WHERE n.state = 'succeeded' AND o.state = 'running'
          AND (n.input_tokens IS NOT NULL OR n.output_tokens IS NOT NULL)
        ORDER BY 1
    LOOP
        PERFORM pgqueue.demotion_check(t);
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_charge_usage
    AFTER UPDATE ON pgqueue.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.job_charge_usage();

CREATE INDEX demotions_expiry_idx ON pgqueue.demotions (expires_at);

-- Tenant settings stay sane whoever writes them: a finite quantum, a plain plan name.
ALTER TABLE pgqueue.tenants
    ADD CONSTRAINT tenants_quantum_finite CHECK (quantum < 'Infinity'::double precision),
    ADD CONSTRAINT tenants_plan_name CHECK (plan ~ '^[A-Za-z0-9_.-]{1,32}$');
