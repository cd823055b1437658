"""The class of characters that show nothing is written once in SQL, takes U+2800, and a
refused tenant id is shown with those characters escaped.

``pgqueue.is_invisible(t)`` (010_tables.sql) is an inlinable SQL function with the text of
``pgqueue.validation.INVISIBLE_CLASS``; ``pgqueue.validate_job`` and ``pgqueue.job_is_valid``
(030_validation.sql) and the CHECK ``tenants_tenant_id_visible`` on pgqueue.tenants call it
(before, each wrote the class out: three copies, held equal only by a test). The class gains
U+2800 BRAILLE PATTERN BLANK, drawn as an empty cell, which was taken as a tenant id (the
Hangul fillers U+115F, U+1160, U+3164 and U+FFA0 were in it already, as default-ignorable).
The CHECK is dropped and added again, NOT VALID (rows stored before stay).

validate_job's two PQ006 messages for such an id showed it raw (U+200B as ''): they show
``pgqueue.shown_invisible(t)`` (030_validation.sql), each invisible character but the space as
<U+XXXX>, as Python's InvalidTenant does. The texts are the schema files'.

Revision ID: 0069
Revises: 0068
"""

from __future__ import annotations

from alembic import op

revision = "0069"
down_revision = "0068"
branch_labels = None
depends_on = None

FUNCTIONS = r"""CREATE OR REPLACE FUNCTION pgqueue.is_invisible(t text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT t ~ ('^[\u0001-\u0020\u007f-\u00a0\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f'
                || '\u0890-\u0891\u08e2\u115f-\u1160\u1680\u17b4-\u17b5\u180b-\u180f'
                || '\u2000-\u200f\u2028-\u202f\u205f-\u206f\u2800\u3000\u3164\ufe00-\ufe0f'
                || '\ufeff\uffa0\ufff0-\ufffb\U000110bd\U000110cd\U00013430-\U00013438'
                || '\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]+$')
$$;

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

CREATE OR REPLACE FUNCTION pgqueue.job_is_valid(tenant_id text, origin text, payload jsonb,
                                                sla_seconds double precision, kind text,
                                                max_attempts integer, max_payload_bytes bigint)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN tenant_id IS NULL OR tenant_id = '' OR char_length(tenant_id) > 128 THEN false
        -- white space, or only characters that show nothing
        WHEN pgqueue.is_invisible(tenant_id) THEN false
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
"""

# Dropped and added again (same name, NOT VALID: rows stored before stay), now calling
# pgqueue.is_invisible.
CONSTRAINT = r"""ALTER TABLE pgqueue.tenants DROP CONSTRAINT IF EXISTS tenants_tenant_id_visible;
ALTER TABLE pgqueue.tenants
    ADD CONSTRAINT tenants_tenant_id_visible CHECK (NOT pgqueue.is_invisible(tenant_id))
    NOT VALID;"""

# Revision 0067's constraint and 0066's functions, then the new functions go.
CONSTRAINT_BEFORE = r"""ALTER TABLE pgqueue.tenants DROP CONSTRAINT IF EXISTS tenants_tenant_id_visible;
ALTER TABLE pgqueue.tenants
    ADD CONSTRAINT tenants_tenant_id_visible CHECK (tenant_id !~ (
        '^[\u0001-\u0020\u007f-\u00a0\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f'
        || '\u0890-\u0891\u08e2\u115f-\u1160\u1680\u17b4-\u17b5\u180b-\u180f'
        || '\u2000-\u200f\u2028-\u202f\u205f-\u206f\u3000\u3164\ufe00-\ufe0f'
        || '\ufeff\uffa0\ufff0-\ufffb\U000110bd\U000110cd\U00013430-\U00013438'
        || '\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]+$')) NOT VALID;"""

FUNCTIONS_BEFORE = r"""CREATE OR REPLACE FUNCTION pgqueue.validate_job(tenant_id text, origin text, payload jsonb,
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
            quote_literal(tenant_id) USING ERRCODE = 'PQ006';
    END IF;
    -- Only characters that show nothing: pgqueue/validation.py's INVISIBLE_CLASS, the same text.
    IF tenant_id ~ ('^[\u0001-\u0020\u007f-\u00a0\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f'
                    || '\u0890-\u0891\u08e2\u115f-\u1160\u1680\u17b4-\u17b5\u180b-\u180f'
                    || '\u2000-\u200f\u2028-\u202f\u205f-\u206f\u3000\u3164\ufe00-\ufe0f'
                    || '\ufeff\uffa0\ufff0-\ufffb\U000110bd\U000110cd\U00013430-\U00013438'
                    || '\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]+$') THEN
        RAISE EXCEPTION 'tenant_id must hold a visible character, not only control or format '
            'characters (such as U+200B), got %', quote_literal(tenant_id) USING ERRCODE = 'PQ006';
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

CREATE OR REPLACE FUNCTION pgqueue.job_is_valid(tenant_id text, origin text, payload jsonb,
                                                sla_seconds double precision, kind text,
                                                max_attempts integer, max_payload_bytes bigint)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN tenant_id IS NULL OR tenant_id = '' OR char_length(tenant_id) > 128 THEN false
        -- white space, or only characters that show nothing (INVISIBLE_CLASS)
        WHEN tenant_id ~ ('^[\u0001-\u0020\u007f-\u00a0\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f'
                          || '\u0890-\u0891\u08e2\u115f-\u1160\u1680\u17b4-\u17b5\u180b-\u180f'
                          || '\u2000-\u200f\u2028-\u202f\u205f-\u206f\u3000\u3164\ufe00-\ufe0f'
                          || '\ufeff\uffa0\ufff0-\ufffb\U000110bd\U000110cd\U00013430-\U00013438'
                          || '\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]+$')
            THEN false
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

DROP FUNCTION IF EXISTS pgqueue.shown_invisible(text);
DROP FUNCTION IF EXISTS pgqueue.is_invisible(text);
"""


def upgrade() -> None:
    op.execute(FUNCTIONS)
    op.execute(CONSTRAINT)


def downgrade() -> None:
    op.execute(CONSTRAINT_BEFORE)
    op.execute(FUNCTIONS_BEFORE)
