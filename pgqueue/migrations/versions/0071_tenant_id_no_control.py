r"""A tenant id with a control character anywhere is refused (found by a tester: tenant ids
``esc\x1b[31mRED\x1b[0m`` and ``\x1b]0;pwned\x07`` were taken, and ``pgqueue status``,
``jobs list`` and ``tenants list`` sent the escape sequences to the terminal; ``a\nb`` showed
as two rows, one a fake tenant "b").

``pgqueue.has_control(t)`` (010_tables.sql), an inlinable SQL function with the text of
``pgqueue.validation.CONTROL_CLASS`` (category Cc: C0, DEL, C1), is the rule's one SQL copy:
``pgqueue.validate_job`` raises PQ006 with the id shown escaped (``pgqueue.shown_invisible``,
as Python's InvalidTenant), ``pgqueue.job_is_valid`` is false (030_validation.sql), and the
CHECK ``tenants_tenant_id_without_control`` on pgqueue.tenants refuses such an id from every
writer (``pgqueue.tenant_set``, ``pgqueue.ensure_tenant``), NOT VALID: rows stored before
stay. Its name sorts after ``tenants_tenant_id_visible`` (Postgres checks in name order), so a
tenant id of a tab alone is still refused as one that shows nothing. The texts are the schema
files'.

Revision ID: 0071
Revises: 0070
"""

from __future__ import annotations

from alembic import op

revision = "0071"
down_revision = "0070"
branch_labels = None
depends_on = None

FUNCTIONS = r"""CREATE OR REPLACE FUNCTION pgqueue.has_control(t text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT t ~ '[\u0001-\u001f\u007f-\u009f]'
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
    -- A control character anywhere (pgqueue.has_control, 010_tables.sql).
    IF pgqueue.has_control(tenant_id) THEN
        RAISE EXCEPTION 'tenant_id must not hold a control character (U+0001-U+001F, '
            'U+007F-U+009F, such as ESC or a line break), got %',
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
"""

# Dropped first, so that the revision can run again.
CONSTRAINT = r"""ALTER TABLE pgqueue.tenants DROP CONSTRAINT IF EXISTS tenants_tenant_id_without_control;
ALTER TABLE pgqueue.tenants
    ADD CONSTRAINT tenants_tenant_id_without_control CHECK (NOT pgqueue.has_control(tenant_id))
    NOT VALID;"""

CONSTRAINT_BEFORE = (
    "ALTER TABLE pgqueue.tenants DROP CONSTRAINT IF EXISTS tenants_tenant_id_without_control;"
)

# Revision 0069's functions, then has_control goes.
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

DROP FUNCTION IF EXISTS pgqueue.has_control(text);
"""


def upgrade() -> None:
    op.execute(FUNCTIONS)
    op.execute(CONSTRAINT)


def downgrade() -> None:
    op.execute(
        "ALTER TABLE pgqueue.tenants DROP CONSTRAINT IF EXISTS tenants_tenant_id_without_control"
    )
    op.execute(FUNCTIONS_BEFORE)
