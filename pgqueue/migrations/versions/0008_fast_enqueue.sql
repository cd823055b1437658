-- pgqueue schema, revision 0008: fast enqueue. Same rules, same errors, same admission; less
-- work per job. What made enqueue slow was not the rules but how they were called: SQL helper
-- functions that Postgres cannot inline (is_demoted, estimate_input_tokens) were planned again
-- in every transaction from plpgsql, and the batch path called plpgsql validate_job and
-- those helpers once per row. Here the rules become set-based, inlinable SQL, and the Python
-- producer sends a batch's payloads as ONE jsonb array instead of a jsonb[] of texts.

-- CREATE OR REPLACE below resets SECURITY DEFINER and search_path on the enqueue functions,
-- and new functions start executable by PUBLIC: `pgqueue migrate` re-applies `pgqueue grant`
-- afterwards when it had been run (pgqueue/db/migrate.py).

-- --------------------------------------------------------------------------------- rules

-- Estimated input tokens (revision 0001's rule: ceil(characters / 4) over the strings that
-- the four paths below select) as a one-row table function: LANGUAGE sql, IMMUTABLE, not
-- STRICT, returning a set, so Postgres inlines it as a subquery wherever it is used in FROM
-- (`CROSS JOIN LATERAL pgqueue.input_token_estimate(payload) e`), planned once with the
-- calling statement. The paths' results are gathered with jsonb_path_query_array (plain
-- functions) into one array and counted with one set-returning call: the same strings as
-- 0001's four jsonb_path_query calls, about a third of the cost. The one copy of the rule;
-- pgqueue.estimate_input_tokens(payload) reads it.
CREATE FUNCTION pgqueue.input_token_estimate(payload jsonb)
RETURNS TABLE (est integer)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ceil(coalesce(sum(char_length(t.s)), 0) / 4.0)::integer
    FROM jsonb_array_elements_text(
            jsonb_path_query_array(payload, 'lax $.system ? (@.type() == "string")')
         || jsonb_path_query_array(payload, 'lax $.system[*].text ? (@.type() == "string")')
         || jsonb_path_query_array(payload,
                                   'lax $.messages[*].content ? (@.type() == "string")')
         || jsonb_path_query_array(payload,
                                   'lax $.messages[*].content[*].text ? (@.type() == "string")')
         ) AS t(s)
$$;

CREATE OR REPLACE FUNCTION pgqueue.estimate_input_tokens(payload jsonb)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT e.est FROM pgqueue.input_token_estimate(payload) e $$;

-- True when pgqueue.validate_job would accept these arguments; never raises. One boolean
-- expression (LANGUAGE sql, no FROM, not STRICT), so Postgres inlines it into the calling
-- query: the batch enqueue checks all its jobs in one pass and calls validate_job only for a
-- job this rejects, to raise that job's exact error. CASE (not AND/OR) guards every cast, so
-- evaluation order never matters. A test holds it equal to validate_job.
CREATE FUNCTION pgqueue.job_is_valid(tenant_id text, origin text, payload jsonb,
                                     sla_seconds double precision, kind text,
                                     max_attempts integer, max_payload_bytes bigint)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN tenant_id IS NULL OR tenant_id = '' OR char_length(tenant_id) > 128 THEN false
        WHEN origin IS NULL OR origin NOT IN ('user_action', 'scheduled', 'batch_job') THEN false
        WHEN sla_seconds IS NOT NULL
             AND (sla_seconds < 0 OR sla_seconds = 'NaN'::float8
                  OR sla_seconds = 'Infinity'::float8) THEN false
        WHEN kind IS NULL OR kind = '' OR char_length(kind) > 128 THEN false
        WHEN max_attempts IS NOT NULL AND (max_attempts < 1 OR max_attempts > 1000) THEN false
        WHEN payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN false
        WHEN octet_length(payload::text) > max_payload_bytes THEN false
        WHEN kind <> 'anthropic.messages' THEN true
        WHEN jsonb_typeof(payload -> 'model') IS DISTINCT FROM 'string'
             OR payload ->> 'model' = '' THEN false
        WHEN jsonb_typeof(payload -> 'max_tokens') IS DISTINCT FROM 'number' THEN false
        WHEN (payload -> 'max_tokens')::numeric <= 0
             OR (payload -> 'max_tokens')::numeric > 2147483647
             OR (payload -> 'max_tokens')::numeric
                <> trunc((payload -> 'max_tokens')::numeric) THEN false
        WHEN jsonb_typeof(payload -> 'messages') IS DISTINCT FROM 'array' THEN false
        ELSE jsonb_array_length(payload -> 'messages') > 0
    END
$$;

-- ---------------------------------------------------------------------------------- enqueue

-- One job: as revision 0006, with less work. The rules are checked by job_is_valid (one
-- inlined expression; validate_job runs only to raise a bad job's error), the demotion and
-- tenant lookups are one query planned once per session (pgqueue.is_demoted, a SQL function
-- with a subquery, cannot be inlined and was planned again in every transaction, as was
-- estimate_input_tokens), the token estimate is inlined into the INSERT, ensure_tenant runs
-- only for a tenant not registered yet, a job without a dedupe key is inserted without ON
-- CONFLICT, and the row is returned without a second query. Admission control is
-- pgqueue.admission_check, as before.
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
    demoted boolean;
    known boolean;
    new_id bigint;
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
    -- pgqueue.is_demoted's rule, and whether the tenant is registered, in one statement.
    SELECT EXISTS (SELECT 1 FROM pgqueue.demotions d
                   WHERE d.tenant_id = try_enqueue.tenant_id AND d.expires_at > now()),
           EXISTS (SELECT 1 FROM pgqueue.tenants r WHERE r.tenant_id = try_enqueue.tenant_id)
    INTO demoted, known;
    t := pgqueue.classify(o, try_enqueue.sla_seconds, demoted);
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
        id := new_id; outcome := 'enqueued'; tier := t; policy := v.policy;
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
    id := new_id; outcome := 'enqueued'; tier := t; policy := v.policy;
    RETURN NEXT;
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
CREATE FUNCTION pgqueue.try_enqueue_batch(tenant_ids text[], origins text[], payloads jsonb,
                                          sla_seconds double precision[] DEFAULT NULL,
                                          kinds text[] DEFAULT NULL)
RETURNS TABLE (ord bigint, id bigint, outcome text, tier pgqueue.tier, policy text,
               scope text, depth bigint, cap bigint)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    n integer := coalesce(cardinality(tenant_ids), 0);
    max_bytes bigint := coalesce(
        nullif(current_setting('pgqueue.max_payload_bytes', true), '')::bigint, 1048576);
    demoted text[];
    bad bigint;
    r record;
    v record;
    fits boolean := true;
BEGIN
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
            SELECT i.tenant_id, i.origin, i.payload, i.sla, i.kind
            FROM ROWS FROM (unnest(tenant_ids), unnest(origins), jsonb_array_elements(payloads),
                            unnest(try_enqueue_batch.sla_seconds), unnest(kinds))
                 WITH ORDINALITY AS i(tenant_id, origin, payload, sla, kind, ord)
            WHERE i.ord >= bad
            ORDER BY i.ord
        LOOP
            PERFORM pgqueue.validate_job(r.tenant_id, r.origin, r.payload, r.sla,
                                         coalesce(r.kind, 'anthropic.messages'), NULL);
        END LOOP;
    END IF;

    -- pgqueue.is_demoted's rule, read once for the batch's tenants.
    demoted := ARRAY(SELECT DISTINCT d.tenant_id FROM pgqueue.demotions d
                     WHERE d.tenant_id = ANY (tenant_ids) AND d.expires_at > now());

    -- Admission: room for all of each key's jobs, and for all of each tier's jobs.
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
    PERFORM pgqueue.ensure_tenant(d.tenant_id)
    FROM (SELECT DISTINCT u.tenant_id FROM unnest(tenant_ids) AS u(tenant_id)
          WHERE NOT EXISTS (SELECT 1 FROM pgqueue.tenants known
                            WHERE known.tenant_id = u.tenant_id)) d
    ORDER BY d.tenant_id COLLATE "C";

    RETURN QUERY
    WITH ins AS (
        INSERT INTO pgqueue.jobs AS j (tenant_id, kind, origin, sla_seconds, priority, payload,
                                       model, est_input_tokens, max_output_tokens, cost)
        SELECT i.tenant_id, coalesce(i.kind, 'anthropic.messages'), i.origin::pgqueue.origin,
               i.sla,
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
