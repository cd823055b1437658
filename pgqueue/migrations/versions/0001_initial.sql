-- pgqueue schema, revision 0001: jobs, tenants, throttle events, demotions, enqueue, NOTIFY.
-- Runs inside alembic's transaction, after env.py took the migration advisory lock.

CREATE SCHEMA IF NOT EXISTS pgqueue;

CREATE TYPE pgqueue.tier AS ENUM ('critical', 'standard', 'batch');
CREATE TYPE pgqueue.origin AS ENUM ('user_action', 'scheduled', 'batch_job');
CREATE TYPE pgqueue.job_state AS ENUM ('queued', 'running', 'succeeded', 'failed', 'cancelled');

CREATE TABLE pgqueue.tenants (
    tenant_id           text PRIMARY KEY
                        CHECK (tenant_id <> '' AND char_length(tenant_id) <= 128),
    plan                text NOT NULL DEFAULT 'free',
    quantum             double precision CHECK (quantum IS NULL OR quantum > 0),
    daily_token_budget  bigint CHECK (daily_token_budget IS NULL OR daily_token_budget >= 0),
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- tenant_id is part of every key so that the table can be distributed by tenant (Citus).
CREATE TABLE pgqueue.jobs (
    id                bigint GENERATED ALWAYS AS IDENTITY,
    tenant_id         text NOT NULL REFERENCES pgqueue.tenants (tenant_id),
    kind              text NOT NULL DEFAULT 'anthropic.messages',
    origin            pgqueue.origin NOT NULL,
    sla_seconds       double precision,
    priority          pgqueue.tier NOT NULL,
    state             pgqueue.job_state NOT NULL DEFAULT 'queued',
    payload           jsonb NOT NULL,
    model             text,
    est_input_tokens  integer NOT NULL DEFAULT 0,
    max_output_tokens integer NOT NULL DEFAULT 0,
    cost              double precision NOT NULL DEFAULT 1 CHECK (cost >= 1),
    attempts          integer NOT NULL DEFAULT 0,
    max_attempts      integer NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    throttle_retries  integer NOT NULL DEFAULT 0,
    run_at            timestamptz NOT NULL DEFAULT now(),
    enqueued_at       timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz,
    lease_expires_at  timestamptz,
    lease_token       uuid,
    worker_id         text,
    result            jsonb,
    last_error        text,
    input_tokens      integer,
    output_tokens     integer,
    PRIMARY KEY (id, tenant_id)
);

-- The claim path reads only queued rows; finished rows never enter these indexes.
CREATE INDEX jobs_queued_priority_idx ON pgqueue.jobs (priority, id) WHERE state = 'queued';
CREATE INDEX jobs_queued_run_at_idx ON pgqueue.jobs (run_at) WHERE state = 'queued';
CREATE INDEX jobs_running_lease_idx ON pgqueue.jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX jobs_finished_at_idx ON pgqueue.jobs (finished_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled');

CREATE TABLE pgqueue.throttle_events (
    id                  bigint GENERATED ALWAYS AS IDENTITY,
    tenant_id           text NOT NULL,
    job_id              bigint,
    model               text,
    status_code         integer NOT NULL,
    retry_after_seconds double precision,
    occurred_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, tenant_id)
);
CREATE INDEX throttle_events_tenant_time_idx ON pgqueue.throttle_events (tenant_id, occurred_at);
CREATE INDEX throttle_events_time_idx ON pgqueue.throttle_events (occurred_at);

CREATE TABLE pgqueue.demotions (
    id          bigint GENERATED ALWAYS AS IDENTITY,
    tenant_id   text NOT NULL REFERENCES pgqueue.tenants (tenant_id),
    reason      text NOT NULL,
    demoted_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (id, tenant_id),
    CHECK (expires_at > demoted_at)
);
CREATE INDEX demotions_tenant_expiry_idx ON pgqueue.demotions (tenant_id, expires_at);

-- ------------------------------------------------------------------ classification, estimates

-- The one place a tier is chosen (mirrored by pgqueue.scheduling.tiers.classify, and tested
-- against it): a demoted tenant -> batch; user_action -> critical; no SLA or >= 1 day -> batch;
-- else standard.
CREATE FUNCTION pgqueue.classify(origin pgqueue.origin, sla_seconds double precision,
                                 demoted boolean)
RETURNS pgqueue.tier
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN demoted THEN 'batch'::pgqueue.tier
        WHEN origin = 'user_action' THEN 'critical'::pgqueue.tier
        WHEN sla_seconds IS NULL OR sla_seconds >= 86400 THEN 'batch'::pgqueue.tier
        ELSE 'standard'::pgqueue.tier
    END
$$;

-- Estimated input tokens: ceil(characters / 4) over the text of `system` and every message
-- content (a string, or text blocks). Anthropic's rule of thumb is ~4 characters per token.
CREATE FUNCTION pgqueue.estimate_input_tokens(payload jsonb)
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

-- payload.max_tokens when it is a positive integer in range, else 0 (non-Messages kinds).
CREATE FUNCTION pgqueue.payload_max_tokens(payload jsonb)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN jsonb_typeof(payload -> 'max_tokens') = 'number'
             AND (payload ->> 'max_tokens')::numeric BETWEEN 1 AND 2147483647
        THEN floor((payload ->> 'max_tokens')::numeric)::integer
        ELSE 0
    END
$$;

-- Cost in DRR cost units: max(1, estimated input tokens / 1000).
CREATE FUNCTION pgqueue.job_cost(est_input_tokens integer)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT greatest(1.0, est_input_tokens / 1000.0)::double precision $$;

-- ------------------------------------------------------------------------------ validation

-- Raises a PQxxx SQLSTATE (see pgqueue/errors.py) for bad input; returns the parsed origin.
CREATE FUNCTION pgqueue.validate_job(tenant_id text, origin text, payload jsonb,
                                     sla_seconds double precision, kind text,
                                     max_attempts integer)
RETURNS pgqueue.origin
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    max_bytes bigint := coalesce(
        nullif(current_setting('pgqueue.max_payload_bytes', true), '')::bigint, 1048576);
    size_bytes bigint;
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

-- Registers the tenant on first use, unless the GUC pgqueue.require_known_tenant is on.
CREATE FUNCTION pgqueue.ensure_tenant(tenant_id text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM 1 FROM pgqueue.tenants t WHERE t.tenant_id = ensure_tenant.tenant_id;
    IF FOUND THEN
        RETURN;
    END IF;
    IF coalesce(current_setting('pgqueue.require_known_tenant', true), '') IN ('on', 'true', '1')
    THEN
        RAISE EXCEPTION 'unknown tenant %', quote_literal(ensure_tenant.tenant_id)
            USING ERRCODE = 'PQ007';
    END IF;
    INSERT INTO pgqueue.tenants (tenant_id) VALUES (ensure_tenant.tenant_id)
    ON CONFLICT DO NOTHING;
END
$$;

CREATE FUNCTION pgqueue.is_demoted(tenant_id text)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (SELECT 1 FROM pgqueue.demotions d
                   WHERE d.tenant_id = is_demoted.tenant_id AND d.expires_at > now())
$$;

-- ---------------------------------------------------------------------------------- enqueue

-- Enqueue one job inside the caller's transaction; returns its id. Callers pass origin and
-- sla_seconds, never a tier. Raises PQxxx SQLSTATEs for bad input before writing anything.
CREATE FUNCTION pgqueue.enqueue(tenant_id text, origin text, payload jsonb,
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
CREATE FUNCTION pgqueue.enqueue_many(tenant_ids text[], origins text[], payloads jsonb[],
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

-- ------------------------------------------------------------------------------ wake-ups

-- Statement-level, tiny payload (the tiers touched), delivered only on commit.
CREATE FUNCTION pgqueue.notify_jobs()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_notify('pgqueue_jobs',
                      coalesce((SELECT string_agg(DISTINCT n.priority::text, ',')
                                FROM new_rows n), ''));
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_insert
    AFTER INSERT ON pgqueue.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.notify_jobs();
