r"""Tenant ids may not hold U+2028 LINE SEPARATOR, U+2029 PARAGRAPH SEPARATOR or a bidi
control (U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069) either; and an unrecognised
``pgqueue.require_known_tenant`` raises PQ012 instead of reading as off.

Found by a tester: revision 0071 refused category Cc only, and the README says a line break
anywhere is refused; but ``a\u2028b`` broke a row of ``tenants list`` in two and ``\u202e``
reversed the rest of the line. ``pgqueue.has_control`` (010_tables.sql), the one SQL copy of
``pgqueue.validation.CONTROL_CLASS``, holds them now; the CHECK
``tenants_tenant_id_without_control``, ``pgqueue.validate_job`` (its message names them) and
``pgqueue.job_is_valid`` call it. The CHECK stays NOT VALID: rows stored before stay.

``ALTER DATABASE d SET pgqueue.require_known_tenant = 'maybe'`` turned the rule off silently:
``pgqueue.tenants_required`` (020_settings_and_tenants.sql) read anything but on, true, yes, 1,
t, y as off. It reads Postgres' boolean spellings (either way, any case, blank or unset: off)
and raises PQ012 (InvalidSetting) for anything else. The texts are the schema files'.

Revision ID: 0073
Revises: 0072
"""

from __future__ import annotations

from alembic import op

revision = "0073"
down_revision = "0072"
branch_labels = None
depends_on = None

FUNCTIONS = r"""CREATE OR REPLACE FUNCTION pgqueue.has_control(t text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT t ~ '[\u0001-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]'
$$;

CREATE OR REPLACE FUNCTION pgqueue.tenants_required()
RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    raw constant text := pgqueue.guarded_setting('require_known_tenant');
    v constant text := lower(btrim(coalesce(raw, '')));
BEGIN
    IF v IN ('on', 'true', 'yes', '1', 't', 'y') THEN
        RETURN true;
    ELSIF v IN ('', 'off', 'false', 'no', '0', 'f', 'n') THEN
        RETURN false;
    END IF;
    RAISE EXCEPTION 'pgqueue.require_known_tenant must be a boolean (on or off), got %',
        quote_literal(raw)
        USING ERRCODE = 'PQ012',
              HINT = 'Fix or RESET pgqueue.require_known_tenant (ALTER DATABASE, ALTER ROLE '
                     'or SET; default off).';
END
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
"""

# Revision 0071's has_control and validate_job, and revision 0041's tenants_required (changing
# LANGUAGE in CREATE OR REPLACE is allowed).
FUNCTIONS_BEFORE = r"""CREATE OR REPLACE FUNCTION pgqueue.has_control(t text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT t ~ '[\u0001-\u001f\u007f-\u009f]'
$$;

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
"""


def upgrade() -> None:
    op.execute(FUNCTIONS)


def downgrade() -> None:
    op.execute(FUNCTIONS_BEFORE)
