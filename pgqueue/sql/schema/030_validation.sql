-- Enqueue, part 1: validation and classification. Bad input raises a PQxxx SQLSTATE
-- (pgqueue/errors.py maps them to Python errors) before anything is written; the tier is
-- chosen in one place (classify); a job's cost is estimated from its payload.

-- The one place a tier is chosen (mirrored by pgqueue.scheduling.tiers.classify, and tested
-- against it): a demoted tenant -> batch; user_action -> critical; no SLA or >= 1 day -> batch;
-- else standard.
CREATE OR REPLACE FUNCTION pgqueue.classify(origin pgqueue.origin, sla_seconds double precision,
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

-- payload.max_tokens when it is a positive integer in range, else 0 (non-Messages kinds).
CREATE OR REPLACE FUNCTION pgqueue.payload_max_tokens(payload jsonb)
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

-- Estimated input tokens (revision 0001's rule: ceil(characters / 4) over the strings that
-- the four paths below select) as a one-row table function: LANGUAGE sql, IMMUTABLE, not
-- STRICT, returning a set, so Postgres inlines it as a subquery wherever it is used in FROM
-- (`CROSS JOIN LATERAL pgqueue.input_token_estimate(payload) e`), planned once with the
-- calling statement. The paths' results are gathered with jsonb_path_query_array (plain
-- functions) into one array and counted with one set-returning call: the same strings as
-- 0001's four jsonb_path_query calls, about a third of the cost. The one copy of the rule;
-- pgqueue.estimate_input_tokens(payload) reads it.
CREATE OR REPLACE FUNCTION pgqueue.input_token_estimate(payload jsonb)
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

-- Estimated input tokens of a payload (the rule is input_token_estimate's, above).
CREATE OR REPLACE FUNCTION pgqueue.estimate_input_tokens(payload jsonb)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT e.est FROM pgqueue.input_token_estimate(payload) e $$;

-- Cost in DRR cost units: max(1, estimated input tokens / 1000).
CREATE OR REPLACE FUNCTION pgqueue.job_cost(est_input_tokens integer)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT greatest(1.0, est_input_tokens / 1000.0)::double precision $$;

-- Why Python could not decode this payload, or NULL: nesting 512 levels deep or more (the
-- worker's json.loads is bounded by Python's recursion limit) or an integer of more than 4,300
-- digits (Python's int-to-text limit); pgqueue.validation refuses the same. Found by a fault
-- run: such a payload, enqueued through SQL, crashed every worker that claimed it. Cheap for
-- the usual payload: the exact walks run only when its text has 512 opening brackets, or 255
-- digits in a row.
CREATE OR REPLACE FUNCTION pgqueue.payload_problem(payload jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN octet_length(s.t) - octet_length(translate(s.t, '[{', '')) >= 512
             AND jsonb_path_exists(payload, 'strict $.**{512}')
            THEN 'payload is nested 512 levels deep or more'
        WHEN s.t ~ '[0-9]{255}'  -- (255: the longest repetition a regex may count)
             AND EXISTS (SELECT 1 FROM jsonb_path_query(payload, 'strict $.**') AS v(x)
                         WHERE jsonb_typeof(v.x) = 'number' AND v.x::text !~ '[.]'
                           AND octet_length(ltrim(v.x::text, '-')) > 4300)
            THEN 'payload holds an integer of more than 4300 digits'
    END
    FROM (SELECT payload::text) AS s(t)
$$;

-- A session confined to a tenant (pgqueue.session_tenant_scope) enqueues only that tenant's
-- jobs: 42501 when any of tenant_ids is another tenant. Every enqueue path calls this first,
-- before it reads a row (found by a tester: a tenant's role learnt whether another tenant's
-- dedupe key existed, and its job id, and a full drop tier reported its job 'dropped', before
-- the jobs_tenant_scope trigger of `pgqueue grant` had a say).
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

-- The index (from 0) of the first message whose text is empty or white space (Python's
-- str.isspace() characters), or NULL: a blank string content, an empty list, or a "text" block
-- with blank text; an empty ('' or []) final assistant message is a prefill, and allowed.
-- pgqueue.validation.empty_text_message and the sandbox apply the same rule. Found by a
-- tester: content '' was queued from Python and SQL, and the provider answered 400.
CREATE OR REPLACE FUNCTION pgqueue.empty_text_message(messages jsonb)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT min(m.i)::integer - 1
    FROM jsonb_array_elements(CASE WHEN jsonb_typeof(messages) = 'array' THEN messages END)
         WITH ORDINALITY AS m(msg, i)
    WHERE CASE
        WHEN jsonb_typeof(m.msg) <> 'object' THEN false
        WHEN m.msg -> 'content' IN ('""', '[]') THEN
            NOT (m.i = jsonb_array_length(messages) AND m.msg -> 'role' = '"assistant"')
        WHEN jsonb_typeof(m.msg -> 'content') = 'string' THEN
            m.msg ->> 'content' ~ ('^[\t\n\v\f\r\u001c-\u001f \u0085\u00a0\u1680\u2000-\u200a'
                                   || '\u2028\u2029\u202f\u205f\u3000]*$')
        WHEN jsonb_typeof(m.msg -> 'content') = 'array' THEN EXISTS (
            SELECT 1 FROM jsonb_array_elements(m.msg -> 'content') AS b(block)
            WHERE jsonb_typeof(b.block) = 'object' AND b.block -> 'type' = '"text"'
              AND jsonb_typeof(b.block -> 'text') = 'string'
              AND b.block ->> 'text' ~ ('^[\t\n\v\f\r\u001c-\u001f \u0085\u00a0\u1680'
                                        || '\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$'))
        ELSE false
    END
$$;

-- A refused tenant id as validate_job's PQ006 messages show it: quoted, each character
-- pgqueue.is_invisible holds (the control characters among them) but the space written as
-- <U+XXXX> (a refused U+200B printed as '', an ESC reached the terminal), the first 40
-- characters of a longer one, then "…".
-- pgqueue.validation.shown_invisible writes the same, so Python and SQL raise one message.
-- Runs only on the way to an error.
CREATE OR REPLACE FUNCTION pgqueue.shown_invisible(t text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    -- (lpad to at least 4 digits: lpad to 4 would cut U+E0041's five)
    SELECT '''' || coalesce(string_agg(
               CASE WHEN c.ch = ' ' OR NOT pgqueue.is_invisible(c.ch) THEN c.ch
                    ELSE '<U+' || upper(lpad(h.x, greatest(4, length(h.x)), '0')) || '>' END,
               '' ORDER BY c.i), '')
           || '''' || CASE WHEN char_length(t) > 40 THEN '…' ELSE '' END
    FROM unnest(string_to_array(left(t, 40), NULL)) WITH ORDINALITY AS c(ch, i)
    CROSS JOIN LATERAL (SELECT to_hex(ascii(c.ch))) AS h(x)
$$;

-- Raises a PQxxx SQLSTATE (see pgqueue/errors.py) for bad input; returns the parsed origin.
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
    -- Python's str.isspace() characters (pgqueue/validation.py holds the same rule).
    IF tenant_id ~ ('^[\t\n\v\f\r\u001c-\u001f \u0085\u00a0\u1680\u2000-\u200a'
                    || '\u2028\u2029\u202f\u205f\u3000]+$') THEN
        RAISE EXCEPTION 'tenant_id must hold a character other than white space, got %',
            pgqueue.shown_invisible(tenant_id) USING ERRCODE = 'PQ006';
    END IF;
    -- Only characters that show nothing (pgqueue.is_invisible, 010_tables.sql).
    IF pgqueue.is_invisible(tenant_id) THEN
        RAISE EXCEPTION 'tenant_id must hold a visible character, not only control or format '
            'characters (such as U+200B), got %', pgqueue.shown_invisible(tenant_id)
            USING ERRCODE = 'PQ006';
    END IF;
    -- A control character anywhere (pgqueue.has_control, 010_tables.sql).
    IF pgqueue.has_control(tenant_id) THEN
        RAISE EXCEPTION 'tenant_id must not hold a control character (U+0001-U+001F, '
            'U+007F-U+009F, U+2028, U+2029 or a bidi control, such as ESC or a line break), '
            'got %',
            pgqueue.shown_invisible(tenant_id) USING ERRCODE = 'PQ006';
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
        problem := pgqueue.empty_text_message(payload -> 'messages');
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'payload.messages[%]: text content must not be empty or white space',
                problem USING ERRCODE = 'PQ001';
        END IF;
    END IF;
    RETURN origin::pgqueue.origin;
END
$$;

-- True when pgqueue.validate_job would accept these arguments; never raises. One boolean
-- expression (LANGUAGE sql, no FROM, not STRICT), so Postgres inlines it into the calling
-- query: the batch enqueue checks all its jobs in one pass and calls validate_job only for a
-- job this rejects, to raise that job's exact error. CASE (not AND/OR) guards every cast, so
-- evaluation order never matters. A test holds it equal to validate_job.
CREATE OR REPLACE FUNCTION pgqueue.job_is_valid(tenant_id text, origin text, payload jsonb,
                                                sla_seconds double precision, kind text,
                                                max_attempts integer, max_payload_bytes bigint)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN tenant_id IS NULL OR tenant_id = '' OR char_length(tenant_id) > 128 THEN false
        -- white space, or only characters that show nothing; or a control character
        WHEN pgqueue.is_invisible(tenant_id) OR pgqueue.has_control(tenant_id) THEN false
        WHEN origin IS NULL OR origin NOT IN ('user_action', 'scheduled', 'batch_job') THEN false
        WHEN sla_seconds IS NOT NULL
             AND (sla_seconds < 0 OR sla_seconds = 'NaN'::float8
                  OR sla_seconds = 'Infinity'::float8) THEN false
        WHEN sla_seconds > 315576000 THEN false
        WHEN kind IS NULL OR kind = '' OR char_length(kind) > 128 THEN false
        WHEN max_attempts IS NOT NULL AND (max_attempts < 1 OR max_attempts > 1000) THEN false
        WHEN payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN false
        WHEN octet_length(payload::text) > max_payload_bytes THEN false
        WHEN pgqueue.payload_problem(payload) IS NOT NULL THEN false
        WHEN kind <> 'anthropic.messages' THEN true
        WHEN jsonb_typeof(payload -> 'model') IS DISTINCT FROM 'string'
             OR payload ->> 'model' = '' THEN false
        WHEN jsonb_typeof(payload -> 'max_tokens') IS DISTINCT FROM 'number' THEN false
        WHEN (payload -> 'max_tokens')::numeric <= 0
             OR (payload -> 'max_tokens')::numeric > 2147483647
             OR (payload -> 'max_tokens')::numeric
                <> trunc((payload -> 'max_tokens')::numeric) THEN false
        WHEN jsonb_typeof(payload -> 'messages') IS DISTINCT FROM 'array' THEN false
        WHEN jsonb_array_length(payload -> 'messages') = 0 THEN false
        ELSE pgqueue.empty_text_message(payload -> 'messages') IS NULL
    END
$$;
