-- Backpressure from the provider and budgets: throttle events demote a tenant to batch
-- (>= 5 in 60 s), as does spending over 150 % of its daily token budget; the demotion expires by
-- itself (300 s). Thresholds are settings: pgqueue.demotion_*, pgqueue.default_daily_budget.

-- The budget day: the date in pgqueue.budget_timezone (default UTC).
CREATE OR REPLACE FUNCTION pgqueue.budget_day(at timestamptz DEFAULT now())
RETURNS date
LANGUAGE sql STABLE
AS $$
    SELECT (at AT TIME ZONE coalesce(nullif(current_setting('pgqueue.budget_timezone', true), ''),
                                     'UTC'))::date
$$;

-- Whether the tenant is demoted now (a demotion row not yet expired).
CREATE OR REPLACE FUNCTION pgqueue.is_demoted(tenant_id text)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (SELECT 1 FROM pgqueue.demotions d
                   WHERE d.tenant_id = is_demoted.tenant_id AND d.expires_at > now())
$$;

-- Demote the tenant when the rule says so and it is not demoted already; returns the reason
-- of a new demotion, else NULL. Thresholds: pgqueue.demotion_throttle_threshold (5 events),
-- pgqueue.demotion_throttle_window_seconds (60), pgqueue.demotion_budget_ratio (1.5),
-- pgqueue.default_daily_budget (100000 input tokens), pgqueue.demotion_seconds (300).
-- With pgqueue.demote_queued_jobs = on, the tenant's queued standard jobs move to batch too.
CREATE OR REPLACE FUNCTION pgqueue.demotion_check(p_tenant text)
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
    -- One demotion at a time per tenant, even with concurrent checks: the tenant's row,
    -- which a producer may not lock (enqueues' FOR KEY SHARE does not conflict). Not an
    -- advisory lock: found by a hostile tester (issue 32), a tenant's role could hold any
    -- tenant's key, and every completion that demoted that tenant waited for it.
    PERFORM 1 FROM pgqueue.tenants t WHERE t.tenant_id = p_tenant FOR NO KEY UPDATE;
    IF pgqueue.is_demoted(p_tenant) THEN
        RETURN NULL;
    END IF;
    INSERT INTO pgqueue.demotions (tenant_id, reason, expires_at)
    VALUES (p_tenant, why, now() + make_interval(secs => duration));
    IF coalesce(current_setting('pgqueue.demote_queued_jobs', true), '') IN ('on', 'true', '1')
    THEN
        -- the tenant's queued standard jobs (pgqueue.tenant_queued_ids), joined back by the
        -- primary key (each row changed meanwhile checked again by its own join)
        UPDATE pgqueue.jobs j SET priority = 'batch'
        FROM pgqueue.tenant_queued_ids(p_tenant, 'standard') AS q(id)
        WHERE j.id = q.id AND j.tenant_id = p_tenant AND j.state = 'queued'
          AND j.priority = 'standard';
    END IF;
    RETURN why;
END
$$;

-- Every throttle event attributed to a tenant may demote it.
CREATE OR REPLACE FUNCTION pgqueue.throttle_event_demote()
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
    FOR EACH ROW
    EXECUTE FUNCTION pgqueue.throttle_event_demote();
