"""A worker checks every setting before it claims (issue 28's loose ends, after a tester).

A malformed ``pgqueue.*`` setting read only where a job's outcome is written
(``demotion_check``) failed the completion after the request was sent, and each rescue sent it
again. ``pgqueue.settings_check`` (new) reads every numeric setting and the tier policy; a
worker runs it when it starts and every half minute, and a bad value pauses its claims. The
list of numeric settings moves from ``setting_value``'s CASE to ``pgqueue.numeric_settings``
(new), which both read. The texts are 020_settings_and_tenants.sql's.

Revision ID: 0058
Revises: 0057
"""

from __future__ import annotations

from alembic import op

revision = "0058"
down_revision = "0057"
branch_labels = None
depends_on = None

FUNCTIONS = r"""CREATE OR REPLACE FUNCTION pgqueue.numeric_settings()
RETURNS TABLE(name text, bounds numeric[])
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT v.name, v.bounds::numeric[] FROM (VALUES
        ('default_quantum', '{0.001, 1e9, 0}'),
        ('max_payload_bytes', '{1, 1073741824, 1}'),
        ('stamp_horizon_rounds', '{0, 1000, 1}'),
        ('stamp_slice_flows', '{1, 1000000, 1}'),
        ('stamp_arrival_margin', '{0, 60, 0}'),
        ('tier_weight_critical', '{0, 1e6, 0}'),
        ('tier_weight_standard', '{0, 1e6, 0}'),
        ('tier_weight_batch', '{0, 1e6, 0}'),
        ('default_requests_per_minute', '{0.001, 1e9, 0}'),
        ('default_input_tokens_per_minute', '{0.001, 1e12, 0}'),
        ('default_output_tokens_per_minute', '{0.001, 1e12, 0}'),
        ('ratelimit_trunk_reserve', '{0, 1, 0}'),
        ('ratelimit_trunk_reserve_jobs', '{0, 1e6, 0}'),
        ('ratelimit_input_margin', '{0, 1, 0}'),
        ('demotion_throttle_threshold', '{1, 2147483647, 1}'),
        ('demotion_throttle_window_seconds', '{0, 1e7, 0}'),
        ('demotion_budget_ratio', '{0, 1e6, 0}'),
        ('demotion_seconds', '{0, 1e8, 0}'),
        ('default_daily_budget', '{0, 1e15, 1}'),
        ('slo_p99_critical_seconds', '{0, 1e7, 0}'),
        ('slo_p99_standard_seconds', '{0, 1e7, 0}'),
        ('slo_p99_batch_seconds', '{0, 1e7, 0}')) AS v(name, bounds)
$$;

CREATE OR REPLACE FUNCTION pgqueue.setting_value(name text, raw text,
                                                 default_value double precision)
RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    b constant numeric[] := (SELECT n.bounds FROM pgqueue.numeric_settings() n
                             WHERE n.name = setting_value.name);
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
$$;

CREATE OR REPLACE FUNCTION pgqueue.settings_check()
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    PERFORM pgqueue.setting(n.name, 0) FROM pgqueue.numeric_settings() n;
    PERFORM pgqueue.tier_policy();
END
$$;

"""

SETTING_VALUE_BEFORE = r"""CREATE OR REPLACE FUNCTION pgqueue.setting_value(name text, raw text,
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
$$;

"""


def upgrade() -> None:
    op.execute(FUNCTIONS)


def downgrade() -> None:
    op.execute(SETTING_VALUE_BEFORE)
    op.execute("DROP FUNCTION IF EXISTS pgqueue.settings_check(), pgqueue.numeric_settings()")
