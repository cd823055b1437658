-- Enqueue, part 3: many jobs in one statement, admitted in input order (try_enqueue_batch
-- is what Python's enqueue_many calls; try_enqueue_many the job-by-job path it falls back to
-- when a cap refuses part of a batch).

-- Many jobs in one statement (arrays of equal length), admitted in input order: job i is
-- admitted when its tenant and its tier still have room after the jobs admitted before it.
-- One row per input position (ord, 1-based). When a job finds its tier full and the tier's
-- policy is reject or block, nothing is written and only the refused rows come back (outcome
-- 'full'); otherwise admitted jobs are stored ('enqueued', id set) and the rest are dropped
-- ('dropped', counted).
CREATE OR REPLACE FUNCTION pgqueue.try_enqueue_many(
    tenant_ids text[],
    origins text[],
    payloads jsonb[],
    sla_seconds double precision[] DEFAULT NULL::double precision[],
    kinds text[] DEFAULT NULL::text[]
)
RETURNS TABLE(ord bigint, id bigint, outcome text, tier pgqueue.tier, policy text, scope text, depth bigint, cap bigint)
    LANGUAGE plpgsql
    AS $$
DECLARE
    n integer := coalesce(cardinality(tenant_ids), 0);
    batch pgqueue.enqueue_batch_item[];
BEGIN
    PERFORM pgqueue.check_tenant_scope(tenant_ids);  -- before any read
    IF coalesce(cardinality(origins), 0) <> n OR coalesce(cardinality(payloads), 0) <> n
       OR (sla_seconds IS NOT NULL AND cardinality(sla_seconds) <> n)
       OR (kinds IS NOT NULL AND cardinality(kinds) <> n) THEN
        RAISE EXCEPTION 'enqueue_many: all arrays must have the same length'
            USING ERRCODE = 'PQ009';
    END IF;
    WITH input AS (
        SELECT i.ord, i.tenant_id, i.origin, i.payload,
               (try_enqueue_many.sla_seconds)[i.ord] AS sla,
               coalesce((try_enqueue_many.kinds)[i.ord], 'anthropic.messages') AS kind
        FROM unnest(tenant_ids, origins, payloads)
             WITH ORDINALITY AS i(tenant_id, origin, payload, ord)
    ), checked AS (
        SELECT input.*,
               pgqueue.validate_job(input.tenant_id, input.origin, input.payload, input.sla,
                                    input.kind, NULL) AS o
        FROM input
    ), classified AS (
        SELECT c.*, pgqueue.classify(c.o, c.sla, pgqueue.is_demoted(c.tenant_id)) AS tier
        FROM checked c
    ), keyed AS (
        -- Room per (tier, tenant) and per tier, read once per key.
        SELECT k.tier, k.tenant_id, v.policy, v.tier_cap, v.tenant_cap,
               v.tier_depth, v.tenant_depth
        FROM (SELECT DISTINCT classified.tier, classified.tenant_id FROM classified) k
        CROSS JOIN LATERAL (
            SELECT a.policy, a.max_queued AS tier_cap,
                   coalesce(t.max_queued, a.tenant_max_queued) AS tenant_cap,
                   (SELECT coalesce(sum(c.queued), 0) FROM pgqueue.queue_counts c
                    WHERE a.max_queued IS NOT NULL
                      AND c.tier = k.tier AND c.tenant_id IS NULL) AS tier_depth,
                   (SELECT coalesce(sum(c.queued), 0) FROM pgqueue.queue_counts c
                    WHERE coalesce(t.max_queued, a.tenant_max_queued) IS NOT NULL
                      AND c.tier = k.tier AND c.tenant_id = k.tenant_id) AS tenant_depth
            FROM pgqueue.admission a
            LEFT JOIN pgqueue.tenants t ON t.tenant_id = k.tenant_id
            WHERE a.tier = k.tier
        ) v
    ), ranked AS (
        SELECT c.*, k.policy, k.tier_cap, k.tenant_cap, k.tier_depth, k.tenant_depth,
               (k.tenant_cap IS NULL
                OR k.tenant_depth + row_number() OVER (PARTITION BY c.tier, c.tenant_id
                                                       ORDER BY c.ord) <= k.tenant_cap)
                   AS tenant_ok
        FROM classified c
        JOIN keyed k ON k.tier = c.tier AND k.tenant_id = c.tenant_id
    ), judged AS (
        SELECT r.*,
               r.tenant_ok AND (r.tier_cap IS NULL
                                OR r.tier_depth + count(*) FILTER (WHERE r.tenant_ok)
                                   OVER (PARTITION BY r.tier ORDER BY r.ord) <= r.tier_cap)
                   AS ok
        FROM ranked r
    )
    SELECT array_agg(ROW(
               j.ord, j.tenant_id, j.o, j.payload, j.sla, j.kind, j.tier, j.ok, j.policy,
               CASE WHEN j.ok THEN NULL WHEN NOT j.tenant_ok THEN 'tenant' ELSE 'tier' END,
               -- (a tier's depth only for a session that may see every tenant's jobs, as
               -- pgqueue.admission_check)
               CASE WHEN j.ok THEN NULL WHEN NOT j.tenant_ok THEN j.tenant_depth
                    WHEN pgqueue.session_writes_jobs() THEN j.tier_depth END,
               CASE WHEN j.ok THEN NULL WHEN NOT j.tenant_ok THEN j.tenant_cap
                    ELSE j.tier_cap END)::pgqueue.enqueue_batch_item ORDER BY j.ord)
    INTO batch
    FROM judged j;

    IF pgqueue.tenants_required() THEN
        -- An unknown tenant is refused before admission has a say (revision 0030): the first
        -- in input order raises PQ007; ensure_tenant registers nothing when tenants are
        -- required.
        PERFORM pgqueue.ensure_tenant(d.tenant_id)
        FROM (SELECT b.tenant_id, min(b.ord) AS first FROM unnest(batch) b GROUP BY 1) d
        ORDER BY d.first;
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(batch) b WHERE NOT b.admitted AND b.policy <> 'drop') THEN
        RETURN QUERY
        SELECT b.ord, NULL::bigint, 'full'::text, b.tier, b.policy, b.scope, b.depth, b.cap
        FROM unnest(batch) b
        WHERE NOT b.admitted AND b.policy <> 'drop'
        ORDER BY b.ord;
        RETURN;
    END IF;

    -- New tenants are registered in one global order, so that two batches registering the
    -- same new tenants cannot deadlock on each other's uncommitted tenant rows.
    PERFORM pgqueue.ensure_tenant(d.tenant_id)
    FROM (SELECT DISTINCT b.tenant_id FROM unnest(batch) b WHERE b.admitted) d
    ORDER BY d.tenant_id COLLATE "C";
    INSERT INTO pgqueue.queue_counts (tier, tenant_id, dropped)
    SELECT b.tier, b.tenant_id, count(*) FROM unnest(batch) b
    WHERE NOT b.admitted GROUP BY b.tier, b.tenant_id;

    RETURN QUERY
    WITH ins AS (
        INSERT INTO pgqueue.jobs AS j (tenant_id, kind, origin, sla_seconds, priority, payload,
                                       model, est_input_tokens, max_output_tokens, cost)
        -- (+ 0.0: -0 is stored as 0)
        SELECT b.tenant_id, b.kind, b.o, b.sla + 0.0, b.tier, b.payload, b.payload ->> 'model',
               e.est,
               pgqueue.payload_max_tokens(b.payload), pgqueue.job_cost(e.est)
        FROM unnest(batch) b
        CROSS JOIN LATERAL (SELECT pgqueue.estimate_input_tokens(b.payload) AS est) e
        WHERE b.admitted
        ORDER BY b.ord
        RETURNING j.id
    ), ids AS (
        SELECT ins.id, row_number() OVER (ORDER BY ins.id) AS k FROM ins
    ), admitted AS (
        SELECT b.ord, row_number() OVER (ORDER BY b.ord) AS k
        FROM unnest(batch) b WHERE b.admitted
    )
    SELECT b.ord, ids.id,
           CASE WHEN b.admitted THEN 'enqueued' ELSE 'dropped' END::text,
           b.tier, b.policy, b.scope, b.depth, b.cap
    FROM unnest(batch) b
    LEFT JOIN admitted a ON a.ord = b.ord
    LEFT JOIN ids ON ids.k = a.k
    ORDER BY b.ord;
END
$$;

-- The SQL entry point for many jobs takes the fast path too (its jsonb[] becomes one jsonb
-- array); it raises PQ010 for a refused reject/block job, as before.
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
        SELECT * FROM pgqueue.try_enqueue_batch(tenant_ids, origins,
                                                coalesce(to_jsonb(payloads), '[]'::jsonb),
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

-- Many jobs in one statement, the payloads as ONE jsonb array (not jsonb[]: a client sends
-- one JSON text and the server parses it once). Same contract as pgqueue.try_enqueue_many:
-- one row per input position (ord, 1-based); bad input raises the first bad job's PQ001..
-- PQ009 error and writes nothing; admission in input order, a refused reject/block job makes
-- the call write nothing and return only the refused rows (outcome 'full'), jobs of drop
-- tiers that find no room are dropped ('dropped', counted).
--
-- The common case is one pass: every job validated set-based (pgqueue.job_is_valid, inlined;
-- validate_job runs only for a job that fails it, to raise its error), classified, then
-- pgqueue.admission_check asked once per (tier, tenant) for that key's job count and once per
-- tier for the tier's count. When all say admitted, every job is admitted whatever the order
-- and the jobs are inserted in one statement. Otherwise (a cap is near) the call is handed
-- to pgqueue.try_enqueue_many, which decides job by job in input order.
CREATE OR REPLACE FUNCTION pgqueue.try_enqueue_batch(
    tenant_ids text[],
    origins text[],
    payloads jsonb,
    sla_seconds double precision[] DEFAULT NULL::double precision[],
    kinds text[] DEFAULT NULL::text[]
)
RETURNS TABLE(ord bigint, id bigint, outcome text, tier pgqueue.tier, policy text, scope text, depth bigint, cap bigint)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    n integer := coalesce(cardinality(tenant_ids), 0);
    max_bytes bigint := pgqueue.setting_value(
        'max_payload_bytes', pgqueue.guarded_setting('max_payload_bytes'), 1048576)::bigint;
    demoted text[];
    bad bigint;
    r record;
    v record;
    fits boolean := true;
    err_state text;
    err_message text;
BEGIN
    PERFORM pgqueue.check_tenant_scope(tenant_ids);  -- before any read
    IF payloads IS NULL OR jsonb_typeof(payloads) <> 'array' THEN
        RAISE EXCEPTION 'enqueue_many: payloads must be a JSON array' USING ERRCODE = 'PQ009';
    END IF;
    IF coalesce(cardinality(origins), 0) <> n OR jsonb_array_length(payloads) <> n
       OR (try_enqueue_batch.sla_seconds IS NOT NULL
           AND cardinality(try_enqueue_batch.sla_seconds) <> n)
       OR (kinds IS NOT NULL AND cardinality(kinds) <> n) THEN
        RAISE EXCEPTION 'enqueue_many: all arrays must have the same length'
            USING ERRCODE = 'PQ009';
    END IF;
    -- Jobs are matched across the arrays by position 1..n (unnest, and try_enqueue_many's
    -- subscripts); an array declared with other bounds ('[0:1]={a,b}') would pair them wrong.
    IF coalesce(array_lower(tenant_ids, 1), 1) <> 1 OR coalesce(array_lower(origins, 1), 1) <> 1
       OR coalesce(array_lower(try_enqueue_batch.sla_seconds, 1), 1) <> 1
       OR coalesce(array_lower(kinds, 1), 1) <> 1
       OR coalesce(array_ndims(tenant_ids), 1) <> 1 OR coalesce(array_ndims(origins), 1) <> 1
       OR coalesce(array_ndims(try_enqueue_batch.sla_seconds), 1) <> 1
       OR coalesce(array_ndims(kinds), 1) <> 1 THEN
        RAISE EXCEPTION 'enqueue_many: arrays must be one-dimensional and start at index 1'
            USING ERRCODE = 'PQ009';
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;

    -- Validation: the first job (in input order) that breaks a rule raises validate_job's
    -- error for it, before anything is read or written.
    SELECT min(i.ord) INTO bad
    FROM ROWS FROM (unnest(tenant_ids), unnest(origins), jsonb_array_elements(payloads),
                    unnest(try_enqueue_batch.sla_seconds), unnest(kinds))
         WITH ORDINALITY AS i(tenant_id, origin, payload, sla, kind, ord)
    WHERE pgqueue.job_is_valid(i.tenant_id, i.origin, i.payload, i.sla,
                               coalesce(i.kind, 'anthropic.messages'), NULL, max_bytes)
          IS NOT TRUE;
    IF bad IS NOT NULL THEN
        FOR r IN
            SELECT i.tenant_id, i.origin, i.payload, i.sla, i.kind, i.ord
            FROM ROWS FROM (unnest(tenant_ids), unnest(origins), jsonb_array_elements(payloads),
                            unnest(try_enqueue_batch.sla_seconds), unnest(kinds))
                 WITH ORDINALITY AS i(tenant_id, origin, payload, sla, kind, ord)
            WHERE i.ord >= bad
            ORDER BY i.ord
        LOOP
            BEGIN  -- only on the error path: a valid batch never enters this block
                PERFORM pgqueue.validate_job(r.tenant_id, r.origin, r.payload, r.sla,
                                             coalesce(r.kind, 'anthropic.messages'), NULL);
            EXCEPTION WHEN OTHERS THEN
                -- (validate_job's errors carry no detail or hint)
                GET STACKED DIAGNOSTICS err_state = RETURNED_SQLSTATE, err_message = MESSAGE_TEXT;
                RAISE EXCEPTION 'job #% of the batch (counting from 1): %', r.ord, err_message
                    USING ERRCODE = err_state;
            END;
        END LOOP;
    END IF;

    -- pgqueue.is_demoted's rule, read once for the batch's tenants.
    demoted := ARRAY(SELECT DISTINCT d.tenant_id FROM pgqueue.demotions d
                     WHERE d.tenant_id = ANY (tenant_ids) AND d.expires_at > now());

    -- Admission: room for all of each key's jobs, and for all of each tier's jobs; only where
    -- a cap can refuse (revision 0029): with no cap on any tier and none on the batch's
    -- tenants, every check below would admit.
    IF EXISTS (SELECT 1 FROM pgqueue.admission a
               WHERE a.max_queued IS NOT NULL OR a.tenant_max_queued IS NOT NULL)
       OR EXISTS (SELECT 1 FROM pgqueue.tenants t
                  WHERE t.tenant_id = ANY (tenant_ids) AND t.max_queued IS NOT NULL) THEN
        FOR r IN
            SELECT k.tier, k.tenant_id, k.n, sum(k.n) OVER (PARTITION BY k.tier) AS tier_n,
                   row_number() OVER (PARTITION BY k.tier ORDER BY k.tenant_id) AS rn
            FROM (SELECT pgqueue.classify(i.origin::pgqueue.origin, i.sla,
                                          i.tenant_id = ANY (demoted)) AS tier,
                         i.tenant_id, count(*)::integer AS n
                  FROM ROWS FROM (unnest(tenant_ids), unnest(origins),
                                  unnest(try_enqueue_batch.sla_seconds))
                       AS i(tenant_id, origin, sla)
                  GROUP BY 1, 2) k
        LOOP
            v := pgqueue.admission_check(r.tier, r.tenant_id, r.n);
            IF v.admitted AND r.rn = 1 AND r.tier_n > r.n THEN
                v := pgqueue.admission_check(r.tier, r.tenant_id, r.tier_n::integer);
            END IF;
            IF NOT v.admitted THEN
                fits := false;
                EXIT;
            END IF;
        END LOOP;
    END IF;
    IF NOT fits THEN
        RETURN QUERY
        SELECT * FROM pgqueue.try_enqueue_many(
            tenant_ids, origins,
            ARRAY(SELECT p.payload FROM jsonb_array_elements(payloads) WITH ORDINALITY
                                         AS p(payload, ord)
                  ORDER BY p.ord),
            try_enqueue_batch.sla_seconds, kinds);
        RETURN;
    END IF;

    -- New tenants are registered in one global order, so that two batches registering the
    -- same new tenants cannot deadlock on each other's uncommitted tenant rows.
    -- (each distinct tenant probed once: revision 0029)
    PERFORM pgqueue.ensure_tenant(d.tenant_id)
    FROM (SELECT DISTINCT u.tenant_id FROM unnest(tenant_ids) AS u(tenant_id)) d
    WHERE NOT EXISTS (SELECT 1 FROM pgqueue.tenants known WHERE known.tenant_id = d.tenant_id)
    ORDER BY d.tenant_id COLLATE "C";

    RETURN QUERY
    WITH ins AS (
        INSERT INTO pgqueue.jobs AS j (tenant_id, kind, origin, sla_seconds, priority, payload,
                                       model, est_input_tokens, max_output_tokens, cost)
        SELECT i.tenant_id, coalesce(i.kind, 'anthropic.messages'), i.origin::pgqueue.origin,
               i.sla + 0.0,  -- -0 is stored as 0
               pgqueue.classify(i.origin::pgqueue.origin, i.sla, i.tenant_id = ANY (demoted)),
               i.payload, i.payload ->> 'model', e.est, pgqueue.payload_max_tokens(i.payload),
               pgqueue.job_cost(e.est)
        FROM ROWS FROM (unnest(tenant_ids), unnest(origins), jsonb_array_elements(payloads),
                        unnest(try_enqueue_batch.sla_seconds), unnest(kinds))
             WITH ORDINALITY AS i(tenant_id, origin, payload, sla, kind, ord)
        CROSS JOIN LATERAL pgqueue.input_token_estimate(i.payload) e
        ORDER BY i.ord
        RETURNING j.id, j.priority
    )
    SELECT row_number() OVER (ORDER BY ins.id), ins.id, 'enqueued'::text, ins.priority,
           a.policy, NULL::text, NULL::bigint, NULL::bigint
    FROM ins
    JOIN pgqueue.admission a ON a.tier = ins.priority
    ORDER BY ins.id;
END
$$;
