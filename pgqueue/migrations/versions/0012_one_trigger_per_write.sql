-- pgqueue schema, revision 0012: one statement trigger per write on pgqueue.jobs.
--
-- An INSERT fired three statement triggers (queued counters, DRR inbox, NOTIFY), each a
-- plpgsql call with its own pass over the new rows; an UPDATE fired two (queued counters,
-- usage charge), and the usage charge ran two joins of the transition tables even for a claim,
-- where no row can have succeeded. Now one function per event does the same work with one
-- pass over the rows, and skips the parts with nothing to do. The functions of revisions
-- 0001-0007 stay (the downgrade attaches them again); only their triggers go.

DROP TRIGGER jobs_queue_counts_insert ON pgqueue.jobs;
DROP TRIGGER jobs_drr_insert ON pgqueue.jobs;
DROP TRIGGER jobs_notify_insert ON pgqueue.jobs;
DROP TRIGGER jobs_queue_counts_update ON pgqueue.jobs;
DROP TRIGGER jobs_charge_usage ON pgqueue.jobs;

-- New rows: queued counters (revision 0007), the (tier, tenant) pairs for the DRR inbox
-- (revision 0002), and one NOTIFY naming the tiers touched (revision 0001).
CREATE FUNCTION pgqueue.jobs_after_insert()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    tiers pgqueue.tier[];
    tenants text[];
    deltas bigint[];
    touched text;
BEGIN
    -- Per (tier, tenant) and per tier (tenant NULL): how many new rows are queued.
    -- (No ORDER BY in the aggregates: a sort per aggregate cost more than the rest of the
    -- function; the three arrays are built from the same rows in the same order.)
    SELECT array_agg(g.tier) FILTER (WHERE g.n > 0),
           array_agg(g.tenant_id) FILTER (WHERE g.n > 0),
           array_agg(g.n) FILTER (WHERE g.n > 0),
           string_agg(g.tier::text, ',') FILTER (WHERE g.tier_total)
    INTO tiers, tenants, deltas, touched
    FROM (SELECT n.priority AS tier, n.tenant_id,
                 count(*) FILTER (WHERE n.state = 'queued') AS n,
                 GROUPING(n.tenant_id) = 1 AS tier_total
          FROM new_rows n
          GROUP BY GROUPING SETS ((n.priority, n.tenant_id), (n.priority))) g;
    IF tiers IS NOT NULL THEN
        INSERT INTO pgqueue.drr_inbox (tier, tenant_id)
        SELECT u.tier, u.tenant_id FROM unnest(tiers, tenants) AS u(tier, tenant_id)
        WHERE u.tenant_id IS NOT NULL;
        PERFORM pgqueue.queue_counts_add(tiers, tenants, deltas);
    END IF;
    PERFORM pg_notify('pgqueue_jobs', coalesce(touched, ''));
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_after_insert
    AFTER INSERT ON pgqueue.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.jobs_after_insert();

-- Changed rows: queued counters (revision 0007), then the usage of successes with token counts
-- charged to their tenants' day and the budget rule (revision 0003: one upsert per tenant, in
-- tenant order, so that two batched completions cannot deadlock on usage rows).
CREATE FUNCTION pgqueue.jobs_after_update()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    tiers pgqueue.tier[];
    tenants text[];
    deltas bigint[];
    t text;
BEGIN
    SELECT array_agg(g.tier), array_agg(g.tenant_id), array_agg(g.n)
    INTO tiers, tenants, deltas
    FROM (SELECT d.priority AS tier, d.tenant_id, sum(d.delta)::bigint AS n
          FROM (SELECT n.priority, n.tenant_id, 1 AS delta FROM new_rows n
                WHERE n.state = 'queued'
                UNION ALL
                SELECT o.priority, o.tenant_id, -1 FROM old_rows o WHERE o.state = 'queued') d
          GROUP BY GROUPING SETS ((d.priority, d.tenant_id), (d.priority))
          HAVING sum(d.delta) <> 0) g;
    IF tiers IS NOT NULL THEN
        PERFORM pgqueue.queue_counts_add(tiers, tenants, deltas);
    END IF;
    -- A claim, a heartbeat, a retry: nothing succeeded with usage, nothing to charge.
    IF NOT EXISTS (SELECT 1 FROM new_rows n
                   WHERE n.state = 'succeeded'
                     AND (n.input_tokens IS NOT NULL OR n.output_tokens IS NOT NULL)) THEN
        RETURN NULL;
    END IF;
    WITH charged AS (
        INSERT INTO pgqueue.usage_daily AS u (tenant_id, day, requests, input_tokens,
                                              output_tokens)
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
            output_tokens = u.output_tokens + EXCLUDED.output_tokens
        RETURNING u.tenant_id
    )
    SELECT array_agg(c.tenant_id ORDER BY c.tenant_id COLLATE "C") INTO tenants FROM charged c;
    FOREACH t IN ARRAY coalesce(tenants, '{}') LOOP
        PERFORM pgqueue.demotion_check(t);
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_after_update
    AFTER UPDATE ON pgqueue.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.jobs_after_update();
