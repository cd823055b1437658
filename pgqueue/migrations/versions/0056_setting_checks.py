"""Issue 28's loose ends: a malformed setting is a typed error, not a cast's; the oldest queued
job's age is one index probe per tier.

``pgqueue.setting`` cast the GUC's text, so ``SET pgqueue.stamp_horizon_rounds = 'abc'`` (or
'NaN', '1e20') failed every claim with "invalid input syntax for type double precision" or
"integer out of range", and a negative count was taken as it was. ``pgqueue.setting_value``
(new) checks every numeric setting the SQL reads against its range and raises PQ012
(``InvalidSetting``) naming the setting, its range and the value; ``pgqueue.setting``,
``base_quantum`` and the three readers of ``max_payload_bytes`` (``validate_job``,
``try_enqueue``, ``try_enqueue_batch``) go through it, and an unknown ``pgqueue.tier_policy``
raises PQ012 too (was PQ009).

``pgqueue.queue_depth``'s ``oldest_queued_seconds`` grouped every queued job (~0.2 s a read at
1M queued); it is now a min() per tier that the planner turns into one probe of the new index
``jobs_queued_enqueued_idx`` (priority, enqueued_at) of queued jobs. The index is built here
without CONCURRENTLY: on a large queue, run this revision when a short write pause is fine.

The texts are the schema files'.

Revision ID: 0056
Revises: 0055
"""

from __future__ import annotations

from alembic import op

revision = "0056"
down_revision = "0055"
branch_labels = None
depends_on = None

SETTING_VALUE = r"""
CREATE OR REPLACE FUNCTION pgqueue.setting_value(name text, raw text,
                                                 default_value double precision)
RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    b constant numeric[] := CASE setting_value.name
        WHEN 'default_quantum' THEN '{0.001, 1e9, 0}'
        WHEN 'max_payload_bytes' THEN '{1, 1073741824, 1}'
        WHEN 'stamp_horizon_rounds' THEN '{0, 1000, 1}'
        WHEN 'stamp_slice_flows' THEN '{1, 1000000, 1}'
        WHEN 'stamp_arrival_margin' THEN '{0, 60, 0}'
        WHEN 'tier_weight_critical' THEN '{0, 1e6, 0}'
        WHEN 'tier_weight_standard' THEN '{0, 1e6, 0}'
        WHEN 'tier_weight_batch' THEN '{0, 1e6, 0}'
        WHEN 'default_requests_per_minute' THEN '{0.001, 1e9, 0}'
        WHEN 'default_input_tokens_per_minute' THEN '{0.001, 1e12, 0}'
        WHEN 'default_output_tokens_per_minute' THEN '{0.001, 1e12, 0}'
        WHEN 'ratelimit_trunk_reserve' THEN '{0, 1, 0}'
        WHEN 'ratelimit_trunk_reserve_jobs' THEN '{0, 1e6, 0}'
        WHEN 'ratelimit_input_margin' THEN '{0, 1, 0}'
        WHEN 'demotion_throttle_threshold' THEN '{1, 2147483647, 1}'
        WHEN 'demotion_throttle_window_seconds' THEN '{0, 1e7, 0}'
        WHEN 'demotion_budget_ratio' THEN '{0, 1e6, 0}'
        WHEN 'demotion_seconds' THEN '{0, 1e8, 0}'
        WHEN 'default_daily_budget' THEN '{0, 1e15, 1}'
        WHEN 'slo_p99_critical_seconds' THEN '{0, 1e7, 0}'
        WHEN 'slo_p99_standard_seconds' THEN '{0, 1e7, 0}'
        WHEN 'slo_p99_batch_seconds' THEN '{0, 1e7, 0}' END;
    v numeric;
BEGIN
    IF b IS NULL THEN
        RAISE EXCEPTION 'pgqueue.% is not a numeric setting of pgqueue', setting_value.name
            USING ERRCODE = 'PQ012';
    END IF;
    IF raw IS NULL OR btrim(raw) = '' THEN
        RETURN default_value;
    END IF;
    IF raw ~ '^\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,4})?\s*$' THEN
        v := raw::numeric;
        IF v BETWEEN b[1] AND b[2] AND (b[3] = 0 OR v = trunc(v)) THEN
            RETURN v::double precision;
        END IF;
    END IF;
    RAISE EXCEPTION 'pgqueue.% must be % from % to %, got %', setting_value.name,
        CASE WHEN b[3] = 1 THEN 'an integer' ELSE 'a number' END, b[1], b[2], quote_literal(raw)
        USING ERRCODE = 'PQ012',
              HINT = format('Fix or RESET pgqueue.%s (ALTER DATABASE, ALTER ROLE or SET; '
                            'default %s).', setting_value.name, default_value);
END
$$;"""

SETTING = r"""
CREATE OR REPLACE FUNCTION pgqueue.setting(name text, default_value double precision)
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN coalesce(current_setting('pgqueue.' || name, true), '') = ''
                THEN default_value
                ELSE pgqueue.setting_value(name, current_setting('pgqueue.' || name, true),
                                           default_value) END
$$;"""

SETTING_BEFORE = r"""
CREATE OR REPLACE FUNCTION pgqueue.setting(name text, default_value double precision)
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT coalesce(nullif(current_setting('pgqueue.' || name, true), '')::double precision,
                    default_value)
$$;"""

BASE_QUANTUM = r"""
CREATE OR REPLACE FUNCTION pgqueue.base_quantum()
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT pgqueue.setting('default_quantum', 5.0)
$$;"""

BASE_QUANTUM_BEFORE = r"""
CREATE OR REPLACE FUNCTION pgqueue.base_quantum()
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT coalesce(nullif(current_setting('pgqueue.default_quantum', true), '')::float8, 5.0)
$$;"""

VALIDATE_JOB = r"""
CREATE OR REPLACE FUNCTION pgqueue.validate_job(tenant_id text, origin text, payload jsonb,
                                                sla_seconds double precision, kind text,
                                                max_attempts integer)
RETURNS pgqueue.origin
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    max_bytes bigint := pgqueue.setting_value(
        'max_payload_bytes', pgqueue.guarded_setting('max_payload_bytes'), 1048576)::bigint;
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
$$;"""

VALIDATE_JOB_BEFORE = r"""
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
$$;"""

TRY_ENQUEUE = r"""
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
$$;"""

TRY_ENQUEUE_BEFORE = r"""
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
$$;"""

TRY_ENQUEUE_BATCH = r"""
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
$$;"""

TRY_ENQUEUE_BATCH_BEFORE = r"""
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
$$;"""

TIER_POLICY = r"""
CREATE OR REPLACE FUNCTION pgqueue.tier_policy()
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    name text := lower(btrim(coalesce(
        nullif(current_setting('pgqueue.tier_policy', true), ''), 'weighted')));
BEGIN
    IF name NOT IN ('weighted', 'probabilistic', 'strict') THEN
        RAISE EXCEPTION 'unknown tier policy %: pgqueue.tier_policy must be weighted, '
            'probabilistic or strict', quote_literal(name) USING ERRCODE = 'PQ012';
    END IF;
    RETURN name;
END
$$;"""

TIER_POLICY_BEFORE = r"""
CREATE OR REPLACE FUNCTION pgqueue.tier_policy()
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    name text := lower(btrim(coalesce(
        nullif(current_setting('pgqueue.tier_policy', true), ''), 'weighted')));
BEGIN
    IF name NOT IN ('weighted', 'probabilistic', 'strict') THEN
        RAISE EXCEPTION 'unknown tier policy %; expected weighted, probabilistic or strict',
            quote_literal(name) USING ERRCODE = 'PQ009';
    END IF;
    RETURN name;
END
$$;"""

INDEX = r"""
CREATE INDEX IF NOT EXISTS jobs_queued_enqueued_idx ON pgqueue.jobs USING btree (priority, enqueued_at) WHERE (state = 'queued'::pgqueue.job_state);
"""

QUEUE_DEPTH = r"""
CREATE OR REPLACE VIEW pgqueue.queue_depth AS
SELECT t.tier,
       coalesce(c.queued, 0)::bigint AS queued,
       coalesce(c.queued, 0)::bigint - coalesce(l.later, 0) AS due,
       coalesce(r.running, 0) AS running,
       (SELECT extract(epoch FROM now() - min(j.enqueued_at))::double precision
        FROM pgqueue.jobs j
        WHERE j.state = 'queued' AND j.priority = t.tier) AS oldest_queued_seconds
FROM unnest(enum_range(NULL::pgqueue.tier)) AS t(tier)
LEFT JOIN (
    SELECT qc.tier, sum(qc.queued) AS queued
    FROM pgqueue.queue_counts qc
    WHERE qc.tenant_id IS NULL
    GROUP BY qc.tier
) c ON c.tier = t.tier
LEFT JOIN (
    SELECT j.priority, count(*) AS later
    FROM pgqueue.jobs j
    WHERE j.state = 'queued' AND j.run_at > now()
    GROUP BY j.priority
) l ON l.priority = t.tier
LEFT JOIN (
    SELECT j.priority, count(*) AS running
    FROM pgqueue.jobs j
    WHERE j.state = 'running'
    GROUP BY j.priority
) r ON r.priority = t.tier
ORDER BY t.tier;
"""

QUEUE_DEPTH_BEFORE = r"""
CREATE OR REPLACE VIEW pgqueue.queue_depth AS
SELECT t.tier,
       coalesce(c.queued, 0)::bigint AS queued,
       coalesce(c.queued, 0)::bigint - coalesce(l.later, 0) AS due,
       coalesce(r.running, 0) AS running,
       o.oldest_queued_seconds
FROM unnest(enum_range(NULL::pgqueue.tier)) AS t(tier)
LEFT JOIN (
    SELECT qc.tier, sum(qc.queued) AS queued
    FROM pgqueue.queue_counts qc
    WHERE qc.tenant_id IS NULL
    GROUP BY qc.tier
) c ON c.tier = t.tier
LEFT JOIN (
    SELECT j.priority, count(*) AS later
    FROM pgqueue.jobs j
    WHERE j.state = 'queued' AND j.run_at > now()
    GROUP BY j.priority
) l ON l.priority = t.tier
LEFT JOIN (
    SELECT j.priority, count(*) AS running
    FROM pgqueue.jobs j
    WHERE j.state = 'running'
    GROUP BY j.priority
) r ON r.priority = t.tier
LEFT JOIN (
    SELECT j.priority,
           extract(epoch FROM now() - min(j.enqueued_at))::double precision
               AS oldest_queued_seconds
    FROM pgqueue.jobs j
    WHERE j.state = 'queued'
    GROUP BY j.priority
) o ON o.priority = t.tier
ORDER BY t.tier;
"""


def upgrade() -> None:
    for statement in (
        SETTING_VALUE,
        SETTING,
        BASE_QUANTUM,
        VALIDATE_JOB,
        TRY_ENQUEUE,
        TRY_ENQUEUE_BATCH,
        TIER_POLICY,
        INDEX,
        QUEUE_DEPTH,
    ):
        op.execute(statement)


def downgrade() -> None:
    for statement in (
        SETTING_BEFORE,
        BASE_QUANTUM_BEFORE,
        VALIDATE_JOB_BEFORE,
        TRY_ENQUEUE_BEFORE,
        TRY_ENQUEUE_BATCH_BEFORE,
        TIER_POLICY_BEFORE,
        QUEUE_DEPTH_BEFORE,
    ):
        op.execute(statement)
    op.execute("DROP FUNCTION pgqueue.setting_value(text, text, double precision)")
    op.execute("DROP INDEX IF EXISTS pgqueue.jobs_queued_enqueued_idx")
