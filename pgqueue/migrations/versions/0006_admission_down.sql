-- pgqueue schema, downgrade of revision 0006: the enqueue functions as revision 0001 made
-- them (no admission control). Run after 0006's objects are dropped.

-- Enqueue one job inside the caller's transaction; returns its id. Callers pass origin and
-- sla_seconds, never a tier. Raises PQxxx SQLSTATEs for bad input before writing anything.
CREATE OR REPLACE FUNCTION pgqueue.enqueue(tenant_id text, origin text, payload jsonb,
                                sla_seconds double precision DEFAULT NULL,
                                kind text DEFAULT 'anthropic.messages',
                                max_attempts integer DEFAULT NULL,
                                run_at timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    o pgqueue.origin;
    est integer;
    new_id bigint;
BEGIN
    o := pgqueue.validate_job(tenant_id, origin, payload, sla_seconds, kind, max_attempts);
    PERFORM pgqueue.ensure_tenant(tenant_id);
    est := pgqueue.estimate_input_tokens(payload);
    INSERT INTO pgqueue.jobs AS j (tenant_id, kind, origin, sla_seconds, priority, payload,
                                   model, est_input_tokens, max_output_tokens, cost,
                                   max_attempts, run_at)
    VALUES (enqueue.tenant_id, enqueue.kind, o, enqueue.sla_seconds,
            pgqueue.classify(o, enqueue.sla_seconds, pgqueue.is_demoted(enqueue.tenant_id)),
            enqueue.payload, enqueue.payload ->> 'model', est,
            pgqueue.payload_max_tokens(enqueue.payload),
            pgqueue.job_cost(est), coalesce(enqueue.max_attempts, 5),
            coalesce(enqueue.run_at, now()))
    RETURNING j.id INTO new_id;
    RETURN new_id;
END
$$;

-- Enqueue many jobs in one statement (arrays of equal length); returns ids in input order.
-- sla_seconds and kinds may be NULL (all defaults) or arrays of the same length.
CREATE OR REPLACE FUNCTION pgqueue.enqueue_many(tenant_ids text[], origins text[], payloads jsonb[],
                                     sla_seconds double precision[] DEFAULT NULL,
                                     kinds text[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql
AS $$
DECLARE
    n integer := coalesce(cardinality(tenant_ids), 0);
BEGIN
    IF coalesce(cardinality(origins), 0) <> n OR coalesce(cardinality(payloads), 0) <> n
       OR (sla_seconds IS NOT NULL AND cardinality(sla_seconds) <> n)
       OR (kinds IS NOT NULL AND cardinality(kinds) <> n) THEN
        RAISE EXCEPTION 'enqueue_many: all arrays must have the same length'
            USING ERRCODE = 'PQ009';
    END IF;
    RETURN QUERY
    WITH input AS (
        SELECT i.ord, i.tenant_id, i.origin, i.payload,
               (enqueue_many.sla_seconds)[i.ord] AS sla,
               coalesce((enqueue_many.kinds)[i.ord], 'anthropic.messages') AS kind
        FROM unnest(tenant_ids, origins, payloads)
             WITH ORDINALITY AS i(tenant_id, origin, payload, ord)
    ), checked AS (
        SELECT input.*,
               pgqueue.validate_job(input.tenant_id, input.origin, input.payload, input.sla,
                                    input.kind, NULL) AS o
        FROM input
    ), tenants_ok AS (
        SELECT count(pgqueue.ensure_tenant(t.tenant_id)) AS n
        FROM (SELECT DISTINCT checked.tenant_id FROM checked) t
    ), ins AS (
        INSERT INTO pgqueue.jobs AS j (tenant_id, kind, origin, sla_seconds, priority, payload,
                                       model, est_input_tokens, max_output_tokens, cost)
        SELECT c.tenant_id, c.kind, c.o, c.sla,
               pgqueue.classify(c.o, c.sla, pgqueue.is_demoted(c.tenant_id)),
               c.payload, c.payload ->> 'model', e.est,
               pgqueue.payload_max_tokens(c.payload),
               pgqueue.job_cost(e.est)
        FROM checked c
        CROSS JOIN tenants_ok
        CROSS JOIN LATERAL (SELECT pgqueue.estimate_input_tokens(c.payload) AS est) e
        ORDER BY c.ord
        RETURNING j.id
    )
    SELECT ins.id FROM ins ORDER BY ins.id;
END
$$;
