-- pgqueue schema, downgrade of revision 0008: the enqueue functions as revisions 0001 and 0006
-- made them, none of them reading 0008's new functions, which the downgrade drops next.

CREATE OR REPLACE FUNCTION pgqueue.estimate_input_tokens(payload jsonb)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ceil(coalesce(sum(char_length(t #>> '{}')), 0) / 4.0)::integer
    FROM (
        SELECT jsonb_path_query(payload, 'lax $.system ? (@.type() == "string")') AS t
        UNION ALL
        SELECT jsonb_path_query(payload, 'lax $.system[*].text ? (@.type() == "string")')
        UNION ALL
        SELECT jsonb_path_query(payload, 'lax $.messages[*].content ? (@.type() == "string")')
        UNION ALL
        SELECT jsonb_path_query(payload,
                                'lax $.messages[*].content[*].text ? (@.type() == "string")')
    ) AS texts
$$;

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
    est integer;
    new_id bigint;
BEGIN
    o := pgqueue.validate_job(try_enqueue.tenant_id, try_enqueue.origin, try_enqueue.payload,
                              try_enqueue.sla_seconds, try_enqueue.kind,
                              try_enqueue.max_attempts);
    IF try_enqueue.dedupe_key IS NOT NULL THEN
        IF try_enqueue.dedupe_key = '' OR char_length(try_enqueue.dedupe_key) > 256 THEN
            RAISE EXCEPTION 'dedupe_key must be 1 to 256 characters' USING ERRCODE = 'PQ009';
        END IF;
        SELECT j.id INTO new_id FROM pgqueue.jobs j
        WHERE j.tenant_id = try_enqueue.tenant_id AND j.dedupe_key = try_enqueue.dedupe_key
          AND j.state IN ('queued', 'running');
        IF FOUND THEN
            RETURN QUERY SELECT new_id, 'duplicate'::text, NULL::pgqueue.tier, NULL::text,
                                NULL::text, NULL::bigint, NULL::bigint;
            RETURN;
        END IF;
    END IF;
    t := pgqueue.classify(o, try_enqueue.sla_seconds, pgqueue.is_demoted(try_enqueue.tenant_id));
    v := pgqueue.admission_check(t, try_enqueue.tenant_id, 1);
    IF NOT v.admitted THEN
        IF v.policy = 'drop' THEN
            INSERT INTO pgqueue.queue_counts (tier, tenant_id, dropped)
            VALUES (t, try_enqueue.tenant_id, 1);
            RETURN QUERY SELECT NULL::bigint, 'dropped'::text, t, v.policy, v.scope, v.depth,
                                v.cap;
        ELSE
            RETURN QUERY SELECT NULL::bigint, 'full'::text, t, v.policy, v.scope, v.depth,
                                v.cap;
        END IF;
        RETURN;
    END IF;
    PERFORM pgqueue.ensure_tenant(try_enqueue.tenant_id);
    est := pgqueue.estimate_input_tokens(try_enqueue.payload);
    INSERT INTO pgqueue.jobs AS j (tenant_id, kind, origin, sla_seconds, priority, payload,
                                   model, est_input_tokens, max_output_tokens, cost,
                                   max_attempts, run_at, dedupe_key)
    VALUES (try_enqueue.tenant_id, try_enqueue.kind, o, try_enqueue.sla_seconds, t,
            try_enqueue.payload, try_enqueue.payload ->> 'model', est,
            pgqueue.payload_max_tokens(try_enqueue.payload),
            pgqueue.job_cost(est), coalesce(try_enqueue.max_attempts, 5),
            coalesce(try_enqueue.run_at, now()), try_enqueue.dedupe_key)
    ON CONFLICT (tenant_id, dedupe_key)
        WHERE dedupe_key IS NOT NULL AND state IN ('queued', 'running')
        DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN  -- a concurrent enqueue of the same key won the race
        SELECT j.id INTO new_id FROM pgqueue.jobs j
        WHERE j.tenant_id = try_enqueue.tenant_id AND j.dedupe_key = try_enqueue.dedupe_key
          AND j.state IN ('queued', 'running');
        RETURN QUERY SELECT new_id, 'duplicate'::text, NULL::pgqueue.tier, NULL::text,
                            NULL::text, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;
    RETURN QUERY SELECT new_id, 'enqueued'::text, t, v.policy, NULL::text, NULL::bigint,
                        NULL::bigint;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.enqueue_many(tenant_ids text[], origins text[],
                                                payloads jsonb[],
                                                sla_seconds double precision[] DEFAULT NULL,
                                                kinds text[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql
AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT * FROM pgqueue.try_enqueue_many(tenant_ids, origins, payloads,
                                               enqueue_many.sla_seconds, kinds) AS t
        ORDER BY t.ord
    LOOP
        IF r.outcome = 'full' THEN
            PERFORM pgqueue.raise_queue_full(r.tier, tenant_ids[r.ord], r.policy, r.scope,
                                             r.depth, r.cap);
        END IF;
        RETURN NEXT r.id;
    END LOOP;
END
$$;
