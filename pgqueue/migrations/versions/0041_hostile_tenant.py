"""A producer (a tenant's role after ``pgqueue grant``) can no longer switch off bookkeeping or
raise the system's limits with settings it sets itself (issue 32, found by a hostile tester):

- the insert trigger ``jobs_after_insert`` always runs: revision 0019's one-statement path of
  ``try_enqueue`` and the trigger's ``WHEN`` on ``pgqueue.insert_bookkept`` are gone (a
  producer set that value by hand before ``enqueue_many``; its jobs were never counted, and
  ``cancel_queued`` drove the tier's count below zero, lifting its cap for everyone);
- ``jobs_after_update`` honours the claim's mark ``pgqueue.claim_counted`` only for a session
  that may write ``pgqueue.jobs`` itself (a producer set it before ``cancel_queued``: the
  cancelled jobs stayed counted and filled the tier for everyone);
- ``pgqueue.max_payload_bytes`` and ``pgqueue.require_known_tenant`` are read by the new
  ``pgqueue.guarded_setting``: for a producer, only what an admin set (ALTER DATABASE ... SET,
  ALTER ROLE ALL SET), never the session's value;
- a full tier tells a producer its cap, not its depth (every tenant's jobs);
- one rescuer and one pruner at a time by a row of the new ``pgqueue.leader_locks`` (locked
  FOR UPDATE SKIP LOCKED), and one demotion at a time per tenant by its ``pgqueue.tenants`` row
  (``demotion_check``), not by advisory locks, which any role may hold (a producer that held
  the rescuer's key stopped every rescue).

CREATE OR REPLACE resets the SECURITY DEFINER that ``pgqueue grant`` sets on the enqueue
functions: run ``pgqueue grant`` again after migrating, as after every migrate.

Revision ID: 0041
Revises: 0040
"""

from __future__ import annotations

from alembic import op

revision = "0041"
down_revision = "0040"
branch_labels = None
depends_on = None

LEADER_LOCKS = """\
CREATE TABLE IF NOT EXISTS pgqueue.leader_locks (
    name text NOT NULL,
    CONSTRAINT leader_locks_pkey PRIMARY KEY (name)
);
INSERT INTO pgqueue.leader_locks (name) VALUES ('prune'), ('rescue') ON CONFLICT DO NOTHING;
"""

GUARDED_SETTING = """\
CREATE OR REPLACE FUNCTION pgqueue.guarded_setting(name text)
RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
    IF pgqueue.session_writes_jobs() THEN
        RETURN current_setting('pgqueue.' || guarded_setting.name, true);
    END IF;
    RETURN (SELECT substr(c.item, char_length(guarded_setting.name) + 10)
            FROM pg_catalog.pg_db_role_setting s
            CROSS JOIN LATERAL unnest(s.setconfig) AS c(item)
            WHERE s.setrole = 0
              AND s.setdatabase IN (0, (SELECT d.oid FROM pg_catalog.pg_database d
                                        WHERE d.datname = current_database()))
              AND starts_with(c.item, 'pgqueue.' || guarded_setting.name || '=')
            ORDER BY s.setdatabase DESC
            LIMIT 1);
END
$$;
"""

TENANTS_REQUIRED = """\
CREATE OR REPLACE FUNCTION pgqueue.tenants_required() RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    -- Whether jobs of tenants not in pgqueue.tenants are refused (PQ007) rather than their
    -- tenants registered: the pgqueue.require_known_tenant setting (pgqueue.guarded_setting:
    -- a producer cannot switch it off), read as Postgres reads a boolean (on, true, yes, 1,
    -- t, y; any case, spaces around). Found by a tester: 'ON', 'yes' and 'True ' read as off.
    SELECT lower(btrim(coalesce(pgqueue.guarded_setting('require_known_tenant'), '')))
           IN ('on', 'true', 'yes', '1', 't', 'y')
$$;
"""

TENANTS_REQUIRED_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.tenants_required() RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    -- Whether jobs of tenants not in pgqueue.tenants are refused (PQ007) rather than their
    -- tenants registered: the pgqueue.require_known_tenant setting, read as Postgres reads a
    -- boolean (on, true, yes, 1, t, y; any case, spaces around). Found by a tester: 'ON',
    -- 'yes' and 'True ' read as off.
    SELECT lower(btrim(coalesce(current_setting('pgqueue.require_known_tenant', true), '')))
           IN ('on', 'true', 'yes', '1', 't', 'y')
$$;
"""

VALIDATE_JOB = """\
CREATE OR REPLACE FUNCTION pgqueue.validate_job(tenant_id text, origin text, payload jsonb,
                                                sla_seconds double precision, kind text,
                                                max_attempts integer)
RETURNS pgqueue.origin
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    max_bytes bigint := coalesce(
        nullif(pgqueue.guarded_setting('max_payload_bytes'), '')::bigint, 1048576);
    size_bytes bigint;
    problem text;
BEGIN
    IF tenant_id IS NULL OR tenant_id = '' OR char_length(tenant_id) > 128 THEN
        RAISE EXCEPTION 'tenant_id must be 1 to 128 characters'
            USING ERRCODE = 'PQ006';
    END IF;
    IF origin IS NULL OR origin NOT IN ('user_action', 'scheduled', 'batch_job') THEN
        RAISE EXCEPTION 'unknown origin %; expected user_action, scheduled or batch_job',
            quote_nullable(origin) USING ERRCODE = 'PQ004';
    END IF;
    IF sla_seconds IS NOT NULL AND (sla_seconds < 0 OR sla_seconds = 'NaN'::float8
                                    OR sla_seconds = 'Infinity'::float8) THEN
        RAISE EXCEPTION 'sla_seconds must be a finite number >= 0 or NULL, got %', sla_seconds
            USING ERRCODE = 'PQ005';
    END IF;
    IF sla_seconds > 315576000 THEN
        RAISE EXCEPTION 'sla_seconds must be at most 315576000 (ten years; NULL for no SLA), got %',
            sla_seconds USING ERRCODE = 'PQ005';
    END IF;
    IF kind IS NULL OR kind = '' OR char_length(kind) > 128 THEN
        RAISE EXCEPTION 'kind must be 1 to 128 characters' USING ERRCODE = 'PQ008';
    END IF;
    IF max_attempts IS NOT NULL AND (max_attempts < 1 OR max_attempts > 1000) THEN
        RAISE EXCEPTION 'max_attempts must be between 1 and 1000, got %', max_attempts
            USING ERRCODE = 'PQ009';
    END IF;
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION 'payload must be a JSON object' USING ERRCODE = 'PQ001';
    END IF;
    size_bytes := octet_length(payload::text);
    IF size_bytes > max_bytes THEN
        RAISE EXCEPTION 'payload is % bytes, over the cap of % bytes', size_bytes, max_bytes
            USING ERRCODE = 'PQ002';
    END IF;
    problem := pgqueue.payload_problem(payload);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem USING ERRCODE = 'PQ001';
    END IF;
    IF kind = 'anthropic.messages' THEN
        IF jsonb_typeof(payload -> 'model') IS DISTINCT FROM 'string'
           OR payload ->> 'model' = '' THEN
            RAISE EXCEPTION 'payload.model must be a non-empty string' USING ERRCODE = 'PQ001';
        END IF;
        IF jsonb_typeof(payload -> 'max_tokens') IS DISTINCT FROM 'number'
           OR (payload ->> 'max_tokens')::numeric <= 0
           OR (payload ->> 'max_tokens')::numeric > 2147483647
           OR (payload ->> 'max_tokens')::numeric <> trunc((payload ->> 'max_tokens')::numeric)
        THEN
            RAISE EXCEPTION 'payload.max_tokens must be a positive integer'
                USING ERRCODE = 'PQ001';
        END IF;
        IF jsonb_typeof(payload -> 'messages') IS DISTINCT FROM 'array'
           OR jsonb_array_length(payload -> 'messages') = 0 THEN
            RAISE EXCEPTION 'payload.messages must be a non-empty array'
                USING ERRCODE = 'PQ001';
        END IF;
    END IF;
    RETURN origin::pgqueue.origin;
END
$$;
"""

VALIDATE_JOB_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.validate_job(tenant_id text, origin text, payload jsonb,
                                                sla_seconds double precision, kind text,
                                                max_attempts integer)
RETURNS pgqueue.origin
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    max_bytes bigint := coalesce(
        nullif(current_setting('pgqueue.max_payload_bytes', true), '')::bigint, 1048576);
    size_bytes bigint;
    problem text;
BEGIN
    IF tenant_id IS NULL OR tenant_id = '' OR char_length(tenant_id) > 128 THEN
        RAISE EXCEPTION 'tenant_id must be 1 to 128 characters'
            USING ERRCODE = 'PQ006';
    END IF;
    IF origin IS NULL OR origin NOT IN ('user_action', 'scheduled', 'batch_job') THEN
        RAISE EXCEPTION 'unknown origin %; expected user_action, scheduled or batch_job',
            quote_nullable(origin) USING ERRCODE = 'PQ004';
    END IF;
    IF sla_seconds IS NOT NULL AND (sla_seconds < 0 OR sla_seconds = 'NaN'::float8
                                    OR sla_seconds = 'Infinity'::float8) THEN
        RAISE EXCEPTION 'sla_seconds must be a finite number >= 0 or NULL, got %', sla_seconds
            USING ERRCODE = 'PQ005';
    END IF;
    IF sla_seconds > 315576000 THEN
        RAISE EXCEPTION 'sla_seconds must be at most 315576000 (ten years; NULL for no SLA), got %',
            sla_seconds USING ERRCODE = 'PQ005';
    END IF;
    IF kind IS NULL OR kind = '' OR char_length(kind) > 128 THEN
        RAISE EXCEPTION 'kind must be 1 to 128 characters' USING ERRCODE = 'PQ008';
    END IF;
    IF max_attempts IS NOT NULL AND (max_attempts < 1 OR max_attempts > 1000) THEN
        RAISE EXCEPTION 'max_attempts must be between 1 and 1000, got %', max_attempts
            USING ERRCODE = 'PQ009';
    END IF;
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION 'payload must be a JSON object' USING ERRCODE = 'PQ001';
    END IF;
    size_bytes := octet_length(payload::text);
    IF size_bytes > max_bytes THEN
        RAISE EXCEPTION 'payload is % bytes, over the cap of % bytes', size_bytes, max_bytes
            USING ERRCODE = 'PQ002';
    END IF;
    problem := pgqueue.payload_problem(payload);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem USING ERRCODE = 'PQ001';
    END IF;
    IF kind = 'anthropic.messages' THEN
        IF jsonb_typeof(payload -> 'model') IS DISTINCT FROM 'string'
           OR payload ->> 'model' = '' THEN
            RAISE EXCEPTION 'payload.model must be a non-empty string' USING ERRCODE = 'PQ001';
        END IF;
        IF jsonb_typeof(payload -> 'max_tokens') IS DISTINCT FROM 'number'
           OR (payload ->> 'max_tokens')::numeric <= 0
           OR (payload ->> 'max_tokens')::numeric > 2147483647
           OR (payload ->> 'max_tokens')::numeric <> trunc((payload ->> 'max_tokens')::numeric)
        THEN
            RAISE EXCEPTION 'payload.max_tokens must be a positive integer'
                USING ERRCODE = 'PQ001';
        END IF;
        IF jsonb_typeof(payload -> 'messages') IS DISTINCT FROM 'array'
           OR jsonb_array_length(payload -> 'messages') = 0 THEN
            RAISE EXCEPTION 'payload.messages must be a non-empty array'
                USING ERRCODE = 'PQ001';
        END IF;
    END IF;
    RETURN origin::pgqueue.origin;
END
$$;
"""

RAISE_QUEUE_FULL = """\
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
"""

RAISE_QUEUE_FULL_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.raise_queue_full(p_tier pgqueue.tier, p_tenant text, p_policy text,
                                                    p_scope text, p_depth bigint, p_cap bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'queue full: % holds % queued jobs (cap %, policy %)',
        CASE p_scope WHEN 'tier' THEN 'tier ' || p_tier
                     ELSE 'tenant ' || quote_literal(p_tenant) || ' in tier ' || p_tier END,
        p_depth, p_cap, p_policy
        USING ERRCODE = 'PQ010',
              DETAIL = json_build_object('tier', p_tier, 'tenant_id', p_tenant,
                                         'policy', p_policy, 'scope', p_scope,
                                         'depth', p_depth, 'cap', p_cap)::text,
              HINT = 'retry later; inside a transaction, enqueue under a SAVEPOINT to keep it';
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
BEGIN
    PERFORM pgqueue.check_tenant_scope(ARRAY[try_enqueue.tenant_id]);  -- before any read
    IF pgqueue.job_is_valid(try_enqueue.tenant_id, try_enqueue.origin, try_enqueue.payload,
                            try_enqueue.sla_seconds, try_enqueue.kind, try_enqueue.max_attempts,
                            coalesce(nullif(pgqueue.guarded_setting('max_payload_bytes'),
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

JOBS_AFTER_INSERT_TRIGGER = """\
DROP TRIGGER IF EXISTS jobs_after_insert ON pgqueue.jobs;
CREATE TRIGGER jobs_after_insert
    AFTER INSERT ON pgqueue.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgqueue.jobs_after_insert();
"""

JOBS_AFTER_INSERT_TRIGGER_BEFORE = """\
DROP TRIGGER IF EXISTS jobs_after_insert ON pgqueue.jobs;
CREATE TRIGGER jobs_after_insert
    AFTER INSERT ON pgqueue.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT
    WHEN ((current_setting('pgqueue.insert_bookkept'::text, true) IS DISTINCT FROM (((pg_current_xact_id())::text || '/'::text) || pg_trigger_depth())))
    EXECUTE FUNCTION pgqueue.jobs_after_insert();
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
        nullif(pgqueue.guarded_setting('max_payload_bytes'), '')::bigint, 1048576);
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

ADMISSION_CHECK = """\
CREATE OR REPLACE FUNCTION pgqueue.admission_check(p_tier pgqueue.tier, p_tenant text,
                                                   n integer DEFAULT 1,
                                                   OUT admitted boolean, OUT policy text,
                                                   OUT scope text, OUT depth bigint,
                                                   OUT cap bigint)
LANGUAGE plpgsql
AS $$
DECLARE
    tier_cap bigint;
    tenant_cap bigint;
    tier_depth bigint := 0;
    tenant_depth bigint := 0;
    tier_rows integer := 0;
    tenant_rows integer := 0;
BEGIN
    SELECT a.policy, a.max_queued, coalesce(t.max_queued, a.tenant_max_queued)
    INTO policy, tier_cap, tenant_cap
    FROM pgqueue.admission a
    LEFT JOIN pgqueue.tenants t ON t.tenant_id = p_tenant
    WHERE a.tier = p_tier;
    admitted := true;
    IF tier_cap IS NULL AND tenant_cap IS NULL THEN
        RETURN;
    END IF;
    IF tier_cap IS NOT NULL THEN
        SELECT coalesce(sum(c.queued), 0), count(*) INTO tier_depth, tier_rows
        FROM pgqueue.queue_counts c
        WHERE c.tier = p_tier AND c.tenant_id IS NULL;
    END IF;
    IF tenant_cap IS NOT NULL THEN
        SELECT coalesce(sum(c.queued), 0), count(*) INTO tenant_depth, tenant_rows
        FROM pgqueue.queue_counts c
        WHERE c.tier = p_tier AND c.tenant_id = p_tenant;
    END IF;
    -- Fold only in READ COMMITTED: under REPEATABLE READ or SERIALIZABLE, locking a row that
    -- changed after the snapshot raises a serialization failure (the workers fold anyway).
    IF tier_rows + tenant_rows > 32
       AND current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM pgqueue.queue_counts_compact(p_tier, p_tenant, 1000);
    END IF;
    IF tier_cap IS NOT NULL AND tier_depth + n > tier_cap THEN
        -- The tier's depth counts every tenant's jobs: only for a session that may see them
        -- all (pgqueue.session_writes_jobs); a producer learns the cap and that it is reached
        -- (found by a hostile tester, issue 32: the error told a tenant others' queue depth).
        admitted := false; scope := 'tier'; cap := tier_cap;
        depth := CASE WHEN pgqueue.session_writes_jobs() THEN tier_depth END;
    ELSIF tenant_cap IS NOT NULL AND tenant_depth + n > tenant_cap THEN
        admitted := false; scope := 'tenant'; depth := tenant_depth; cap := tenant_cap;
    END IF;
END
$$;
"""

ADMISSION_CHECK_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.admission_check(p_tier pgqueue.tier, p_tenant text,
                                                   n integer DEFAULT 1,
                                                   OUT admitted boolean, OUT policy text,
                                                   OUT scope text, OUT depth bigint,
                                                   OUT cap bigint)
LANGUAGE plpgsql
AS $$
DECLARE
    tier_cap bigint;
    tenant_cap bigint;
    tier_depth bigint := 0;
    tenant_depth bigint := 0;
    tier_rows integer := 0;
    tenant_rows integer := 0;
BEGIN
    SELECT a.policy, a.max_queued, coalesce(t.max_queued, a.tenant_max_queued)
    INTO policy, tier_cap, tenant_cap
    FROM pgqueue.admission a
    LEFT JOIN pgqueue.tenants t ON t.tenant_id = p_tenant
    WHERE a.tier = p_tier;
    admitted := true;
    IF tier_cap IS NULL AND tenant_cap IS NULL THEN
        RETURN;
    END IF;
    IF tier_cap IS NOT NULL THEN
        SELECT coalesce(sum(c.queued), 0), count(*) INTO tier_depth, tier_rows
        FROM pgqueue.queue_counts c
        WHERE c.tier = p_tier AND c.tenant_id IS NULL;
    END IF;
    IF tenant_cap IS NOT NULL THEN
        SELECT coalesce(sum(c.queued), 0), count(*) INTO tenant_depth, tenant_rows
        FROM pgqueue.queue_counts c
        WHERE c.tier = p_tier AND c.tenant_id = p_tenant;
    END IF;
    -- Fold only in READ COMMITTED: under REPEATABLE READ or SERIALIZABLE, locking a row that
    -- changed after the snapshot raises a serialization failure (the workers fold anyway).
    IF tier_rows + tenant_rows > 32
       AND current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM pgqueue.queue_counts_compact(p_tier, p_tenant, 1000);
    END IF;
    IF tier_cap IS NOT NULL AND tier_depth + n > tier_cap THEN
        admitted := false; scope := 'tier'; depth := tier_depth; cap := tier_cap;
    ELSIF tenant_cap IS NOT NULL AND tenant_depth + n > tenant_cap THEN
        admitted := false; scope := 'tenant'; depth := tenant_depth; cap := tenant_cap;
    END IF;
END
$$;
"""

JOBS_AFTER_UPDATE = """\
CREATE OR REPLACE FUNCTION pgqueue.jobs_after_update() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    tiers pgqueue.tier[];
    tenants text[];
    deltas bigint[];
    t text;
BEGIN
    -- A claim's batch write (drr_dispatch) counted its rows itself, and none succeeded: nothing
    -- to do (revision 0017). The mark names the claim's transaction, so a value left in the
    -- session (SET, ALTER ROLE) or by another transaction never switches counting off; and it
    -- is honoured only for a session that may write pgqueue.jobs itself (a worker: it could
    -- write the counters anyway). Found by a hostile tester (issue 32): a producer set it by
    -- hand (set_config(..., pg_current_xact_id()::text, true)) before cancel_queued, and the
    -- cancelled jobs stayed counted, filling the tier's cap for every tenant.
    IF current_setting('pgqueue.claim_counted', true) = pg_current_xact_id()::text
       AND pgqueue.session_writes_jobs() THEN
        RETURN NULL;
    END IF;
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
"""

JOBS_AFTER_UPDATE_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.jobs_after_update() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    tiers pgqueue.tier[];
    tenants text[];
    deltas bigint[];
    t text;
BEGIN
    -- A claim's batch write (drr_dispatch) counted its rows itself, and none succeeded: nothing
    -- to do (revision 0017). The mark names the claim's transaction, so a value left in the
    -- session (SET, ALTER ROLE) or by another transaction never switches counting off.
    IF current_setting('pgqueue.claim_counted', true) = pg_current_xact_id()::text THEN
        RETURN NULL;
    END IF;
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
"""

DEMOTION_CHECK = """\
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
        UPDATE pgqueue.jobs j SET priority = 'batch'
        WHERE j.tenant_id = p_tenant AND j.state = 'queued' AND j.priority = 'standard';
    END IF;
    RETURN why;
END
$$;
"""

DEMOTION_CHECK_BEFORE = """\
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
"""


def upgrade() -> None:
    op.execute(LEADER_LOCKS)
    op.execute(GUARDED_SETTING)
    op.execute(TENANTS_REQUIRED)
    op.execute(VALIDATE_JOB)
    op.execute(RAISE_QUEUE_FULL)
    op.execute(TRY_ENQUEUE)
    op.execute(JOBS_AFTER_INSERT_TRIGGER)
    op.execute(TRY_ENQUEUE_MANY)
    op.execute(TRY_ENQUEUE_BATCH)
    op.execute(ADMISSION_CHECK)
    op.execute(JOBS_AFTER_UPDATE)
    op.execute(DEMOTION_CHECK)


def downgrade() -> None:
    op.execute(TENANTS_REQUIRED_BEFORE)
    op.execute(VALIDATE_JOB_BEFORE)
    op.execute(RAISE_QUEUE_FULL_BEFORE)
    op.execute(TRY_ENQUEUE_BEFORE)
    op.execute(JOBS_AFTER_INSERT_TRIGGER_BEFORE)
    op.execute(TRY_ENQUEUE_MANY_BEFORE)
    op.execute(TRY_ENQUEUE_BATCH_BEFORE)
    op.execute(ADMISSION_CHECK_BEFORE)
    op.execute(JOBS_AFTER_UPDATE_BEFORE)
    op.execute(DEMOTION_CHECK_BEFORE)
    op.execute("DROP FUNCTION IF EXISTS pgqueue.guarded_setting(text)")
    op.execute("DROP TABLE IF EXISTS pgqueue.leader_locks")
