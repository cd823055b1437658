-- One job, in fewer statements (revision 0019).
--
-- The insert trigger's bookkeeping (tenant check, DRR inbox, queue counts, NOTIFY) cost about
-- 80 µs of server CPU for a one-row INSERT: five statements and a plpgsql function over a
-- transition table, built for batches. For the common single job (no dedupe key, a tenant
-- already registered, no admission cap, READ COMMITTED), try_enqueue now does that work
-- itself: the tenant lock and the tier's admission row come with the demotion lookup (one
-- statement), and the job's row, its inbox entry, its two counter updates and the NOTIFY are
-- one statement of data-modifying CTEs. While that statement runs, the transaction-local
-- setting pgqueue.insert_bookkept names the transaction and the trigger depth, and
-- jobs_after_insert (WHEN) does not fire for it; the setting is cleared right after, and a
-- failed statement takes it back with its (sub)transaction. As with revision 0017's
-- pgqueue.claim_counted, a value left in the session (SET, ALTER ROLE) or by another
-- transaction never switches the trigger off; the depth keeps it on for an insert that a
-- user's row trigger on pgqueue.jobs makes during that statement (one level deeper), and off
-- for try_enqueue called from a user's trigger on another table (the same level). Every
-- other insert into pgqueue.jobs keeps the trigger. Every other case of try_enqueue takes
-- revision 0008's path.

DROP TRIGGER jobs_after_insert ON pgqueue.jobs;
CREATE TRIGGER jobs_after_insert
    AFTER INSERT ON pgqueue.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT
    WHEN (current_setting('pgqueue.insert_bookkept', true)
          IS DISTINCT FROM pg_current_xact_id()::text || '/' || pg_trigger_depth())
    EXECUTE FUNCTION pgqueue.jobs_after_insert();

CREATE OR REPLACE FUNCTION pgqueue.try_enqueue(tenant_id text, origin text, payload jsonb,
                                               sla_seconds double precision DEFAULT NULL,
                                               kind text DEFAULT 'anthropic.messages',
                                               max_attempts integer DEFAULT NULL,
                                               run_at timestamptz DEFAULT NULL,
                                               dedupe_key text DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text, tier pgqueue.tier, policy text, scope text,
               depth bigint, cap bigint)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    o pgqueue.origin;
    t pgqueue.tier;
    v record;
    pol text;
    tier_cap bigint;
    tenant_cap bigint;
    known boolean;
    new_id bigint;
    tier_counted boolean;
    tenant_counted boolean;
BEGIN
    IF pgqueue.job_is_valid(try_enqueue.tenant_id, try_enqueue.origin, try_enqueue.payload,
                            try_enqueue.sla_seconds, try_enqueue.kind, try_enqueue.max_attempts,
                            coalesce(nullif(current_setting('pgqueue.max_payload_bytes', true),
                                            '')::bigint, 1048576)) IS NOT TRUE THEN
        PERFORM pgqueue.validate_job(try_enqueue.tenant_id, try_enqueue.origin,
                                     try_enqueue.payload, try_enqueue.sla_seconds,
                                     try_enqueue.kind, try_enqueue.max_attempts);
    END IF;
    o := try_enqueue.origin::pgqueue.origin;
    IF try_enqueue.dedupe_key IS NOT NULL THEN
        IF try_enqueue.dedupe_key = '' OR char_length(try_enqueue.dedupe_key) > 256 THEN
            RAISE EXCEPTION 'dedupe_key must be 1 to 256 characters' USING ERRCODE = 'PQ009';
        END IF;
        SELECT j.id INTO new_id FROM pgqueue.jobs j
        WHERE j.tenant_id = try_enqueue.tenant_id AND j.dedupe_key = try_enqueue.dedupe_key
          AND j.state IN ('queued', 'running');
        IF FOUND THEN
            id := new_id; outcome := 'duplicate';
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    -- One statement: the tier (pgqueue.is_demoted's rule), its admission row, and the tenant:
    -- registered or not, and if so locked FOR KEY SHARE until the transaction ends, as the
    -- insert trigger's check would lock it.
    SELECT k.tier, a.policy, a.max_queued, coalesce(r.max_queued, a.tenant_max_queued),
           coalesce(r.known, false)
    INTO t, pol, tier_cap, tenant_cap, known
    FROM (SELECT pgqueue.classify(o, try_enqueue.sla_seconds,
                                  EXISTS (SELECT 1 FROM pgqueue.demotions d
                                          WHERE d.tenant_id = try_enqueue.tenant_id
                                            AND d.expires_at > now())) AS tier) k
    LEFT JOIN pgqueue.admission a ON a.tier = k.tier
    LEFT JOIN LATERAL (SELECT true AS known, x.max_queued FROM pgqueue.tenants x
                       WHERE x.tenant_id = try_enqueue.tenant_id FOR KEY SHARE) r ON true;
    IF tier_cap IS NOT NULL OR tenant_cap IS NOT NULL THEN
        v := pgqueue.admission_check(t, try_enqueue.tenant_id, 1);
        IF NOT v.admitted THEN
            IF v.policy = 'drop' THEN
                INSERT INTO pgqueue.queue_counts (tier, tenant_id, dropped)
                VALUES (t, try_enqueue.tenant_id, 1);
                outcome := 'dropped';
            ELSE
                outcome := 'full';
            END IF;
            tier := t; policy := v.policy; scope := v.scope; depth := v.depth; cap := v.cap;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    IF try_enqueue.dedupe_key IS NULL AND known
       AND current_setting('transaction_isolation') = 'read committed' THEN
        -- The trigger's work for this one row (its counters as pgqueue.queue_counts_add
        -- updates them in READ COMMITTED: a row of the key no other transaction holds).
        PERFORM set_config('pgqueue.insert_bookkept',
                           pg_current_xact_id()::text || '/' || pg_trigger_depth(), true);
        WITH ins AS (
            INSERT INTO pgqueue.jobs AS j (tenant_id, kind, origin, sla_seconds, priority,
                                           payload, model, est_input_tokens, max_output_tokens,
                                           cost, max_attempts, run_at)
            SELECT try_enqueue.tenant_id, try_enqueue.kind, o, try_enqueue.sla_seconds, t,
                   try_enqueue.payload, try_enqueue.payload ->> 'model', e.est,
                   pgqueue.payload_max_tokens(try_enqueue.payload), pgqueue.job_cost(e.est),
                   coalesce(try_enqueue.max_attempts, 5), coalesce(try_enqueue.run_at, now())
            FROM pgqueue.input_token_estimate(try_enqueue.payload) e
            RETURNING j.id
        ), inbox AS (
            INSERT INTO pgqueue.drr_inbox (tier, tenant_id) VALUES (t, try_enqueue.tenant_id)
        ), counted AS (
            UPDATE pgqueue.queue_counts c SET queued = c.queued + 1
            WHERE c.ctid = ANY (ARRAY[
                (SELECT x.ctid FROM pgqueue.queue_counts x
                 WHERE x.tier = t AND x.tenant_id IS NULL AND NOT x.claim_stripe
                 LIMIT 1 FOR UPDATE SKIP LOCKED),
                (SELECT x.ctid FROM pgqueue.queue_counts x
                 WHERE x.tier = t AND x.tenant_id = try_enqueue.tenant_id
                   AND NOT x.claim_stripe
                 LIMIT 1 FOR UPDATE SKIP LOCKED)])
            RETURNING c.tenant_id IS NULL AS tier_total
        )
        SELECT ins.id,
               coalesce((SELECT bool_or(k.tier_total) FROM counted k), false),
               coalesce((SELECT bool_or(NOT k.tier_total) FROM counted k), false),
               pg_notify('pgqueue_jobs', t::text)
        INTO new_id, tier_counted, tenant_counted
        FROM ins;
        PERFORM set_config('pgqueue.insert_bookkept', '', true);
        -- No row of a key updated (all held, or the one locked changed after the snapshot):
        -- a new row, as queue_counts_add does.
        IF NOT tier_counted THEN
            INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued) VALUES (t, NULL, 1);
        END IF;
        IF NOT tenant_counted THEN
            INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
            VALUES (t, try_enqueue.tenant_id, 1);
        END IF;
        id := new_id; outcome := 'enqueued'; tier := t; policy := pol;
        RETURN NEXT;
        RETURN;
    END IF;
    IF NOT known THEN
        PERFORM pgqueue.ensure_tenant(try_enqueue.tenant_id);
    END IF;
    IF try_enqueue.dedupe_key IS NULL THEN  -- no arbiter index to consult
        INSERT INTO pgqueue.jobs AS j (tenant_id, kind, origin, sla_seconds, priority, payload,
                                       model, est_input_tokens, max_output_tokens, cost,
                                       max_attempts, run_at)
        SELECT try_enqueue.tenant_id, try_enqueue.kind, o, try_enqueue.sla_seconds, t,
               try_enqueue.payload, try_enqueue.payload ->> 'model', e.est,
               pgqueue.payload_max_tokens(try_enqueue.payload), pgqueue.job_cost(e.est),
               coalesce(try_enqueue.max_attempts, 5), coalesce(try_enqueue.run_at, now())
        FROM pgqueue.input_token_estimate(try_enqueue.payload) e
        RETURNING j.id INTO new_id;
        id := new_id; outcome := 'enqueued'; tier := t; policy := pol;
        RETURN NEXT;
        RETURN;
    END IF;
    INSERT INTO pgqueue.jobs AS j (tenant_id, kind, origin, sla_seconds, priority, payload,
                                   model, est_input_tokens, max_output_tokens, cost,
                                   max_attempts, run_at, dedupe_key)
    SELECT try_enqueue.tenant_id, try_enqueue.kind, o, try_enqueue.sla_seconds, t,
           try_enqueue.payload, try_enqueue.payload ->> 'model', e.est,
           pgqueue.payload_max_tokens(try_enqueue.payload), pgqueue.job_cost(e.est),
           coalesce(try_enqueue.max_attempts, 5), coalesce(try_enqueue.run_at, now()),
           try_enqueue.dedupe_key
    FROM pgqueue.input_token_estimate(try_enqueue.payload) e
    ON CONFLICT (tenant_id, dedupe_key)
        WHERE dedupe_key IS NOT NULL AND state IN ('queued', 'running')
        DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN  -- a concurrent enqueue of the same key won the race
        SELECT j.id INTO new_id FROM pgqueue.jobs j
        WHERE j.tenant_id = try_enqueue.tenant_id AND j.dedupe_key = try_enqueue.dedupe_key
          AND j.state IN ('queued', 'running');
        id := new_id; outcome := 'duplicate';
        RETURN NEXT;
        RETURN;
    END IF;
    id := new_id; outcome := 'enqueued'; tier := t; policy := pol;
    RETURN NEXT;
END
$$;
