-- Enqueue, part 2: one job. try_enqueue validates, classifies, asks admission control
-- (050_admission.sql) and inserts; enqueue is the SQL entry point that raises PQ010 for a full
-- tier. The insert trigger keeps the counters and wakes workers (NOTIFY).

-- Raised for a full tier whose policy is reject or block: SQLSTATE PQ010, the verdict as JSON
-- in DETAIL (tier, tenant_id, policy, scope, depth, cap). depth NULL (a full tier, told to a
-- producer, pgqueue.admission_check): the message says the tier is full, not how full.
CREATE OR REPLACE FUNCTION pgqueue.raise_queue_full(p_tier pgqueue.tier, p_tenant text, p_policy text,
                                                    p_scope text, p_depth bigint, p_cap bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'queue full: % % (cap %, policy %)',
        CASE p_scope WHEN 'tier' THEN 'tier ' || p_tier
                     ELSE 'tenant ' || quote_literal(p_tenant) || ' in tier ' || p_tier END,
        coalesce('holds ' || p_depth || ' queued jobs', 'is at its cap of queued jobs'),
        p_cap, p_policy
        USING ERRCODE = 'PQ010',
              DETAIL = json_build_object('tier', p_tier, 'tenant_id', p_tenant,
                                         'policy', p_policy, 'scope', p_scope,
                                         'depth', p_depth, 'cap', p_cap)::text,
              HINT = 'retry later; inside a transaction, enqueue under a SAVEPOINT to keep it';
END
$$;

-- Enqueue one job unless admission control refuses it; never raises for a full queue.
-- outcome: 'enqueued' (id set), 'dropped' (tier policy drop: nothing stored, the drop
-- counted) or 'full' (policy reject or block: nothing written at all). Bad input raises the
-- PQ001..PQ009 SQLSTATEs as pgqueue.enqueue does; a session confined to another tenant is
-- refused (42501, pgqueue.check_tenant_scope) before anything else; an unknown tenant under
-- pgqueue.require_known_tenant is refused (PQ007) before admission has a say. The Python
-- enqueue calls this, so that a full queue leaves the caller's transaction usable without a
-- savepoint. Kept cheap: the rules are checked by job_is_valid (one inlined expression;
-- validate_job runs only to raise a bad job's error), the demotion and tenant lookups are one
-- query planned once per session, the token estimate is inlined into the INSERT,
-- ensure_tenant runs only for a tenant not registered yet, and the row is returned without a
-- second query.
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
BEGIN
    PERFORM pgqueue.check_tenant_scope(ARRAY[try_enqueue.tenant_id]);  -- before any read
    IF pgqueue.job_is_valid(try_enqueue.tenant_id, try_enqueue.origin, try_enqueue.payload,
                            try_enqueue.sla_seconds, try_enqueue.kind, try_enqueue.max_attempts,
                            pgqueue.setting_value('max_payload_bytes',
                                                  pgqueue.guarded_setting('max_payload_bytes'),
                                                  1048576)::bigint) IS NOT TRUE THEN
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
        IF try_enqueue.dedupe_key ~ '[\x01-\x1f\x7f-\x9f]' THEN
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

-- Enqueue one job inside the caller's transaction; returns its id. Callers pass origin and
-- sla_seconds, never a tier. Raises PQxxx SQLSTATEs for bad input before writing anything,
-- and PQ010 when admission control refuses the job (reject or block).
CREATE OR REPLACE FUNCTION pgqueue.enqueue(
    tenant_id text,
    origin text,
    payload jsonb,
    sla_seconds double precision DEFAULT NULL::double precision,
    kind text DEFAULT 'anthropic.messages'::text,
    max_attempts integer DEFAULT NULL::integer,
    run_at timestamp with time zone DEFAULT NULL::timestamp with time zone,
    dedupe_key text DEFAULT NULL::text
)
RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r
    FROM pgqueue.try_enqueue(enqueue.tenant_id, enqueue.origin, enqueue.payload,
                             enqueue.sla_seconds, enqueue.kind, enqueue.max_attempts,
                             enqueue.run_at, enqueue.dedupe_key);
    IF r.outcome = 'full' THEN
        PERFORM pgqueue.raise_queue_full(r.tier, enqueue.tenant_id, r.policy, r.scope, r.depth,
                                         r.cap);
    END IF;
    RETURN r.id;
END
$$;

-- New rows: queued counters and one NOTIFY
-- naming the tiers touched. Runs for every insert: nothing a caller can set skips it (found
-- by a hostile tester, issue 32: revision 0019 skipped it when a transaction-local setting
-- named the transaction, which a producer could set by hand before enqueue_many, leaving
-- jobs no counter saw; a cancel then drove the tier's count below zero and lifted its cap).
CREATE OR REPLACE FUNCTION pgqueue.jobs_after_insert() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    tiers pgqueue.tier[];
    unknown text;
    tenants text[];
    deltas bigint[];
    touched text;
BEGIN
    -- What the foreign key to pgqueue.tenants did, once per statement (revision 0013): every
    -- tenant exists, and stays (FOR KEY SHARE) until this transaction ends.
    -- One statement: each distinct tenant locked by a probe; the first one missing, if any.
    SELECT n.tenant_id INTO unknown
    FROM (SELECT DISTINCT r.tenant_id FROM new_rows r) AS n
    LEFT JOIN LATERAL (SELECT true AS known FROM pgqueue.tenants t
                       WHERE t.tenant_id = n.tenant_id FOR KEY SHARE) AS k ON true
    WHERE k.known IS NULL
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'unknown tenant %: register it first (pgqueue.ensure_tenant)',
            quote_literal(unknown) USING ERRCODE = 'foreign_key_violation';
    END IF;
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
        PERFORM pgqueue.queue_counts_add(tiers, tenants, deltas);
    END IF;
    PERFORM pg_notify('pgqueue_jobs', coalesce(touched, ''));
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_after_insert
    AFTER INSERT ON pgqueue.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgqueue.jobs_after_insert();
