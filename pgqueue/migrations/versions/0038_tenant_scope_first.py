"""The tenant-scope check comes first in every enqueue path (issue 32, found by a tester): a
tenant's role learnt whether another tenant's dedupe key existed (and that job's id) from
``pgqueue.try_enqueue`` / ``enqueue``, and an enqueue for another tenant into a full drop tier
was reported 'dropped', because only the ``jobs_tenant_scope`` trigger of ``pgqueue grant``
checked the tenant, at the INSERT. The new ``pgqueue.check_tenant_scope`` (030_validation.sql)
raises 42501 for a tenant the session may not enqueue for; ``try_enqueue`` (040_enqueue.sql),
``try_enqueue_many`` and ``try_enqueue_batch`` (041_enqueue_many.sql) call it before anything
else (``enqueue`` and ``enqueue_many`` go through them). CREATE OR REPLACE resets the
SECURITY DEFINER that ``pgqueue grant`` sets on these functions: run ``pgqueue grant`` again
after migrating, as after every migrate.

Revision ID: 0038
Revises: 0037
"""

from __future__ import annotations

from alembic import op

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None

CHECK_TENANT_SCOPE = """\
CREATE OR REPLACE FUNCTION pgqueue.check_tenant_scope(tenant_ids text[])
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    scope text := pgqueue.session_tenant_scope();
BEGIN
    IF scope IS NOT NULL AND EXISTS (SELECT 1 FROM unnest(tenant_ids) AS u(tenant_id)
                                     WHERE u.tenant_id <> scope) THEN
        RAISE EXCEPTION 'this session may only enqueue jobs of tenant %', quote_literal(scope)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END
$$;
"""

TRY_ENQUEUE = """\
CREATE OR REPLACE FUNCTION pgqueue.try_enqueue(
    tenant_id text,
    origin text,
    payload jsonb,
    sla_seconds double precision DEFAULT NULL::double precision,
    kind text DEFAULT 'anthropic.messages'::text,
    max_attempts integer DEFAULT NULL::integer,
    run_at timestamp with time zone DEFAULT NULL::timestamp with time zone,
    dedupe_key text DEFAULT NULL::text
)
RETURNS TABLE(id bigint, outcome text, tier pgqueue.tier, policy text, scope text, depth bigint, cap bigint)
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
    ruled boolean;
    bookkept text;
    row_tenant text;
    row_tier pgqueue.tier;
    row_queued boolean;
    tier_counted boolean;
    tenant_counted boolean;
BEGIN
    PERFORM pgqueue.check_tenant_scope(ARRAY[try_enqueue.tenant_id]);  -- before any read
    IF pgqueue.job_is_valid(try_enqueue.tenant_id, try_enqueue.origin, try_enqueue.payload,
                            try_enqueue.sla_seconds, try_enqueue.kind, try_enqueue.max_attempts,
                            coalesce(nullif(current_setting('pgqueue.max_payload_bytes', true),
                                            '')::bigint, 1048576)) IS NOT TRUE THEN
        PERFORM pgqueue.validate_job(try_enqueue.tenant_id, try_enqueue.origin,
                                     try_enqueue.payload, try_enqueue.sla_seconds,
                                     try_enqueue.kind, try_enqueue.max_attempts);
    END IF;
    o := try_enqueue.origin::pgqueue.origin;
    try_enqueue.sla_seconds := try_enqueue.sla_seconds + 0.0;  -- -0 is stored as 0
    IF try_enqueue.dedupe_key IS NOT NULL THEN
        IF try_enqueue.dedupe_key = '' OR char_length(try_enqueue.dedupe_key) > 256 THEN
            RAISE EXCEPTION 'dedupe_key must be 1 to 256 characters' USING ERRCODE = 'PQ009';
        END IF;
        -- Control characters (C0, DEL, C1) print as nothing or move the cursor: refused, as
        -- pgqueue.validation.check_dedupe_key does (found by a fault run: U+0001 was stored).
        IF try_enqueue.dedupe_key ~ '[\\x01-\\x1f\\x7f-\\x9f]' THEN
            RAISE EXCEPTION 'dedupe_key holds a control character' USING ERRCODE = 'PQ009';
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
    -- insert trigger's check would lock it; and whether pgqueue.jobs has rules, which a
    -- statement with data-modifying CTEs cannot run (found by a tester: a DO ALSO rule of the
    -- user's made every single enqueue fail).
    SELECT k.tier, a.policy, a.max_queued, coalesce(r.max_queued, a.tenant_max_queued),
           coalesce(r.known, false),
           (SELECT c.relhasrules FROM pg_catalog.pg_class c
            WHERE c.oid = 'pgqueue.jobs'::regclass)
    INTO t, pol, tier_cap, tenant_cap, known, ruled
    FROM (SELECT pgqueue.classify(o, try_enqueue.sla_seconds,
                                  EXISTS (SELECT 1 FROM pgqueue.demotions d
                                          WHERE d.tenant_id = try_enqueue.tenant_id
                                            AND d.expires_at > now())) AS tier) k
    LEFT JOIN pgqueue.admission a ON a.tier = k.tier
    LEFT JOIN LATERAL (SELECT true AS known, x.max_queued FROM pgqueue.tenants x
                       WHERE x.tenant_id = try_enqueue.tenant_id FOR KEY SHARE) r ON true;
    IF NOT known AND pgqueue.tenants_required() THEN
        -- refused before admission has a say (revision 0030): raises PQ007 unless the
        -- tenant was registered since the lookup
        PERFORM pgqueue.ensure_tenant(try_enqueue.tenant_id);
    END IF;
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
    IF try_enqueue.dedupe_key IS NULL AND known AND NOT ruled
       AND current_setting('transaction_isolation') = 'read committed' THEN
        -- The trigger's work for this one row, driven by the row as inserted (a BEFORE
        -- trigger of the user's may change its tenant, tier or state, or drop it): its inbox
        -- row and counters (as pgqueue.queue_counts_add updates them in READ COMMITTED: a row
        -- of the key no other transaction holds) and NOTIFY; another tenant is checked and
        -- locked after it. The setting is put back as it was after, for an enqueue nested in
        -- such a trigger.
        bookkept := current_setting('pgqueue.insert_bookkept', true);
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
            RETURNING j.id, j.tenant_id, j.priority, j.state = 'queued' AS queued
        ), inbox AS (
            INSERT INTO pgqueue.drr_inbox (tier, tenant_id)
            SELECT i.priority, i.tenant_id FROM ins i WHERE i.queued
        ), counted AS (
            UPDATE pgqueue.queue_counts c SET queued = c.queued + 1
            WHERE c.ctid = ANY (ARRAY[
                (SELECT x.ctid FROM pgqueue.queue_counts x, ins i
                 WHERE i.queued AND x.tier = i.priority AND x.tenant_id IS NULL
                   AND NOT x.claim_stripe
                 LIMIT 1 FOR UPDATE OF x SKIP LOCKED),
                (SELECT x.ctid FROM pgqueue.queue_counts x, ins i
                 WHERE i.queued AND x.tier = i.priority AND x.tenant_id = i.tenant_id
                   AND NOT x.claim_stripe
                 LIMIT 1 FOR UPDATE OF x SKIP LOCKED)])
            RETURNING c.tenant_id IS NULL AS tier_total
        )
        SELECT i.id, i.tenant_id, i.priority, i.queued,
               coalesce((SELECT bool_or(k.tier_total) FROM counted k), false),
               coalesce((SELECT bool_or(NOT k.tier_total) FROM counted k), false),
               pg_notify('pgqueue_jobs', CASE WHEN i.queued THEN i.priority::text ELSE '' END)
        INTO new_id, row_tenant, row_tier, row_queued, tier_counted, tenant_counted
        FROM ins i;
        PERFORM set_config('pgqueue.insert_bookkept', coalesce(bookkept, ''), true);
        -- Another tenant than the one looked up: checked and locked as the trigger would, by
        -- a statement of its own, whose snapshot sees a tenant registered meanwhile (by that
        -- BEFORE trigger, or by another transaction; found by a tester).
        IF new_id IS NOT NULL AND row_tenant <> try_enqueue.tenant_id THEN
            PERFORM 1 FROM pgqueue.tenants r WHERE r.tenant_id = row_tenant FOR KEY SHARE;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'unknown tenant %: register it first (pgqueue.ensure_tenant)',
                    quote_literal(row_tenant) USING ERRCODE = 'foreign_key_violation';
            END IF;
        END IF;
        -- No row of a key updated (all held, or the one locked changed after the snapshot):
        -- a new row, as queue_counts_add does.
        IF row_queued AND NOT tier_counted THEN
            INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
            VALUES (row_tier, NULL, 1);
        END IF;
        IF row_queued AND NOT tenant_counted THEN
            INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
            VALUES (row_tier, row_tenant, 1);
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
"""

TRY_ENQUEUE_MANY = """\
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
               CASE WHEN j.ok THEN NULL WHEN NOT j.tenant_ok THEN j.tenant_depth
                    ELSE j.tier_depth END,
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
"""

TRY_ENQUEUE_BATCH = """\
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
    max_bytes bigint := coalesce(
        nullif(current_setting('pgqueue.max_payload_bytes', true), '')::bigint, 1048576);
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
"""

TRY_ENQUEUE_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.try_enqueue(
    tenant_id text,
    origin text,
    payload jsonb,
    sla_seconds double precision DEFAULT NULL::double precision,
    kind text DEFAULT 'anthropic.messages'::text,
    max_attempts integer DEFAULT NULL::integer,
    run_at timestamp with time zone DEFAULT NULL::timestamp with time zone,
    dedupe_key text DEFAULT NULL::text
)
RETURNS TABLE(id bigint, outcome text, tier pgqueue.tier, policy text, scope text, depth bigint, cap bigint)
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
    ruled boolean;
    bookkept text;
    row_tenant text;
    row_tier pgqueue.tier;
    row_queued boolean;
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
    try_enqueue.sla_seconds := try_enqueue.sla_seconds + 0.0;  -- -0 is stored as 0
    IF try_enqueue.dedupe_key IS NOT NULL THEN
        IF try_enqueue.dedupe_key = '' OR char_length(try_enqueue.dedupe_key) > 256 THEN
            RAISE EXCEPTION 'dedupe_key must be 1 to 256 characters' USING ERRCODE = 'PQ009';
        END IF;
        -- Control characters (C0, DEL, C1) print as nothing or move the cursor: refused, as
        -- pgqueue.validation.check_dedupe_key does (found by a fault run: U+0001 was stored).
        IF try_enqueue.dedupe_key ~ '[\\x01-\\x1f\\x7f-\\x9f]' THEN
            RAISE EXCEPTION 'dedupe_key holds a control character' USING ERRCODE = 'PQ009';
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
    -- insert trigger's check would lock it; and whether pgqueue.jobs has rules, which a
    -- statement with data-modifying CTEs cannot run (found by a tester: a DO ALSO rule of the
    -- user's made every single enqueue fail).
    SELECT k.tier, a.policy, a.max_queued, coalesce(r.max_queued, a.tenant_max_queued),
           coalesce(r.known, false),
           (SELECT c.relhasrules FROM pg_catalog.pg_class c
            WHERE c.oid = 'pgqueue.jobs'::regclass)
    INTO t, pol, tier_cap, tenant_cap, known, ruled
    FROM (SELECT pgqueue.classify(o, try_enqueue.sla_seconds,
                                  EXISTS (SELECT 1 FROM pgqueue.demotions d
                                          WHERE d.tenant_id = try_enqueue.tenant_id
                                            AND d.expires_at > now())) AS tier) k
    LEFT JOIN pgqueue.admission a ON a.tier = k.tier
    LEFT JOIN LATERAL (SELECT true AS known, x.max_queued FROM pgqueue.tenants x
                       WHERE x.tenant_id = try_enqueue.tenant_id FOR KEY SHARE) r ON true;
    IF NOT known AND pgqueue.tenants_required() THEN
        -- refused before admission has a say (revision 0030): raises PQ007 unless the
        -- tenant was registered since the lookup
        PERFORM pgqueue.ensure_tenant(try_enqueue.tenant_id);
    END IF;
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
    IF try_enqueue.dedupe_key IS NULL AND known AND NOT ruled
       AND current_setting('transaction_isolation') = 'read committed' THEN
        -- The trigger's work for this one row, driven by the row as inserted (a BEFORE
        -- trigger of the user's may change its tenant, tier or state, or drop it): its inbox
        -- row and counters (as pgqueue.queue_counts_add updates them in READ COMMITTED: a row
        -- of the key no other transaction holds) and NOTIFY; another tenant is checked and
        -- locked after it. The setting is put back as it was after, for an enqueue nested in
        -- such a trigger.
        bookkept := current_setting('pgqueue.insert_bookkept', true);
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
            RETURNING j.id, j.tenant_id, j.priority, j.state = 'queued' AS queued
        ), inbox AS (
            INSERT INTO pgqueue.drr_inbox (tier, tenant_id)
            SELECT i.priority, i.tenant_id FROM ins i WHERE i.queued
        ), counted AS (
            UPDATE pgqueue.queue_counts c SET queued = c.queued + 1
            WHERE c.ctid = ANY (ARRAY[
                (SELECT x.ctid FROM pgqueue.queue_counts x, ins i
                 WHERE i.queued AND x.tier = i.priority AND x.tenant_id IS NULL
                   AND NOT x.claim_stripe
                 LIMIT 1 FOR UPDATE OF x SKIP LOCKED),
                (SELECT x.ctid FROM pgqueue.queue_counts x, ins i
                 WHERE i.queued AND x.tier = i.priority AND x.tenant_id = i.tenant_id
                   AND NOT x.claim_stripe
                 LIMIT 1 FOR UPDATE OF x SKIP LOCKED)])
            RETURNING c.tenant_id IS NULL AS tier_total
        )
        SELECT i.id, i.tenant_id, i.priority, i.queued,
               coalesce((SELECT bool_or(k.tier_total) FROM counted k), false),
               coalesce((SELECT bool_or(NOT k.tier_total) FROM counted k), false),
               pg_notify('pgqueue_jobs', CASE WHEN i.queued THEN i.priority::text ELSE '' END)
        INTO new_id, row_tenant, row_tier, row_queued, tier_counted, tenant_counted
        FROM ins i;
        PERFORM set_config('pgqueue.insert_bookkept', coalesce(bookkept, ''), true);
        -- Another tenant than the one looked up: checked and locked as the trigger would, by
        -- a statement of its own, whose snapshot sees a tenant registered meanwhile (by that
        -- BEFORE trigger, or by another transaction; found by a tester).
        IF new_id IS NOT NULL AND row_tenant <> try_enqueue.tenant_id THEN
            PERFORM 1 FROM pgqueue.tenants r WHERE r.tenant_id = row_tenant FOR KEY SHARE;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'unknown tenant %: register it first (pgqueue.ensure_tenant)',
                    quote_literal(row_tenant) USING ERRCODE = 'foreign_key_violation';
            END IF;
        END IF;
        -- No row of a key updated (all held, or the one locked changed after the snapshot):
        -- a new row, as queue_counts_add does.
        IF row_queued AND NOT tier_counted THEN
            INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
            VALUES (row_tier, NULL, 1);
        END IF;
        IF row_queued AND NOT tenant_counted THEN
            INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
            VALUES (row_tier, row_tenant, 1);
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
"""

TRY_ENQUEUE_MANY_BEFORE = """\
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
               CASE WHEN j.ok THEN NULL WHEN NOT j.tenant_ok THEN j.tenant_depth
                    ELSE j.tier_depth END,
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
"""

TRY_ENQUEUE_BATCH_BEFORE = """\
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
    max_bytes bigint := coalesce(
        nullif(current_setting('pgqueue.max_payload_bytes', true), '')::bigint, 1048576);
    demoted text[];
    bad bigint;
    r record;
    v record;
    fits boolean := true;
    err_state text;
    err_message text;
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
"""


def upgrade() -> None:
    op.execute(CHECK_TENANT_SCOPE)
    op.execute(TRY_ENQUEUE)
    op.execute(TRY_ENQUEUE_MANY)
    op.execute(TRY_ENQUEUE_BATCH)


def downgrade() -> None:
    op.execute(TRY_ENQUEUE_BEFORE)
    op.execute(TRY_ENQUEUE_MANY_BEFORE)
    op.execute(TRY_ENQUEUE_BATCH_BEFORE)
    op.execute("DROP FUNCTION IF EXISTS pgqueue.check_tenant_scope(text[])")
