"""The trunk reserve counted in requests (issue 29: the demo's standard tier waited 14 s).

A tier below an idle higher tier kept 1/4 of the per-minute limit in the bucket: 15 s of
refill at any limit, so after a drain (the demo starts with its buckets spent; a restart mid-way
through a busy hour; a header from another client of the key) standard and batch stood still
for 15 s. The reserve is now room for ``pgqueue.ratelimit_trunk_reserve_jobs`` (default 20)
requests of the model's mean size (new column ``rate_limits.mean_input_tokens``, a running mean
of the takes), capped at the old share. The texts are 010_tables.sql's and 060_rate_limiter.sql's.

Revision ID: 0050
Revises: 0047
"""

from __future__ import annotations

from alembic import op

revision = "0050"
down_revision = "0047"
branch_labels = None
depends_on = None

ADD_COLUMN = """\
ALTER TABLE pgqueue.rate_limits
    ADD COLUMN IF NOT EXISTS mean_input_tokens double precision DEFAULT 0 NOT NULL
"""

FUNCTIONS = """\
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_save(r pgqueue.rate_limits)
RETURNS void
LANGUAGE sql
AS $$
    UPDATE pgqueue.rate_limits l
    SET requests_per_minute = r.requests_per_minute,
        input_tokens_per_minute = r.input_tokens_per_minute,
        output_tokens_per_minute = r.output_tokens_per_minute,
        requests_available = r.requests_available,
        input_tokens_available = r.input_tokens_available,
        output_tokens_available = r.output_tokens_available,
        refreshed_at = r.refreshed_at,
        cooldown_until = r.cooldown_until,
        input_estimate_ratio = r.input_estimate_ratio,
        limits_from_headers = r.limits_from_headers,
        -- Σ guarantees never above the level (lowered by a header, an untiered take): the
        -- lowest tiers give back first
        guarantee_critical = least(r.guarantee_critical, greatest(0, r.input_tokens_available)),
        guarantee_standard = least(r.guarantee_standard,
            greatest(0, r.input_tokens_available - r.guarantee_critical)),
        guarantee_batch = least(r.guarantee_batch, greatest(0,
            r.input_tokens_available - r.guarantee_critical - r.guarantee_standard)),
        guarantees_at = r.guarantees_at,
        tiers_backlogged = r.tiers_backlogged,
        mean_input_tokens = r.mean_input_tokens
    WHERE l.model = r.model
$$;

CREATE OR REPLACE FUNCTION pgqueue.ratelimit_tier_reserve(r pgqueue.rate_limits,
                                                          p_tier pgqueue.tier,
                                                          p_need double precision)
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        -- the tiers from critical down to p_tier: all backlogged, or p_tier itself
        WHEN enum_range(NULL::pgqueue.tier, p_tier) <@ (r.tiers_backlogged || p_tier) THEN 0
        ELSE greatest(0, least(
            pgqueue.setting('ratelimit_trunk_reserve', 0.25) * r.input_tokens_per_minute,
            pgqueue.setting('ratelimit_trunk_reserve_jobs', 20) * r.mean_input_tokens,
            r.input_tokens_per_minute - p_need))
    END
$$;

CREATE OR REPLACE FUNCTION pgqueue.ratelimit_try_take(p_model text, p_input_tokens double precision,
                                                      p_output_tokens double precision,
                                                      p_tier pgqueue.tier DEFAULT NULL)
RETURNS double precision
LANGUAGE plpgsql
AS $$
DECLARE
    r pgqueue.rate_limits := pgqueue.ratelimit_row(p_model);
    need_in double precision := p_input_tokens * r.input_estimate_ratio;
    wait double precision := pgqueue.ratelimit_wait(r, p_tier, p_input_tokens, p_output_tokens);
BEGIN
    IF wait = 0 THEN
        r.requests_available := r.requests_available - 1;
        r.input_tokens_available := r.input_tokens_available - need_in;
        r.output_tokens_available := r.output_tokens_available - p_output_tokens;
        r.guarantee_critical := greatest(0, r.guarantee_critical
            - CASE WHEN p_tier = 'critical' THEN need_in ELSE 0 END);
        r.guarantee_standard := greatest(0, r.guarantee_standard
            - CASE WHEN p_tier = 'standard' THEN need_in ELSE 0 END);
        r.guarantee_batch := greatest(0, r.guarantee_batch
            - CASE WHEN p_tier = 'batch' THEN need_in ELSE 0 END);
        r.mean_input_tokens := CASE WHEN r.mean_input_tokens = 0 THEN need_in
            ELSE r.mean_input_tokens + (need_in - r.mean_input_tokens) / 16 END;
    END IF;
    PERFORM pgqueue.ratelimit_save(r);
    RETURN wait;
END
$$;

"""

FUNCTIONS_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_save(r pgqueue.rate_limits)
RETURNS void
LANGUAGE sql
AS $$
    UPDATE pgqueue.rate_limits l
    SET requests_per_minute = r.requests_per_minute,
        input_tokens_per_minute = r.input_tokens_per_minute,
        output_tokens_per_minute = r.output_tokens_per_minute,
        requests_available = r.requests_available,
        input_tokens_available = r.input_tokens_available,
        output_tokens_available = r.output_tokens_available,
        refreshed_at = r.refreshed_at,
        cooldown_until = r.cooldown_until,
        input_estimate_ratio = r.input_estimate_ratio,
        limits_from_headers = r.limits_from_headers,
        -- Σ guarantees never above the level (lowered by a header, an untiered take): the
        -- lowest tiers give back first
        guarantee_critical = least(r.guarantee_critical, greatest(0, r.input_tokens_available)),
        guarantee_standard = least(r.guarantee_standard,
            greatest(0, r.input_tokens_available - r.guarantee_critical)),
        guarantee_batch = least(r.guarantee_batch, greatest(0,
            r.input_tokens_available - r.guarantee_critical - r.guarantee_standard)),
        guarantees_at = r.guarantees_at,
        tiers_backlogged = r.tiers_backlogged
    WHERE l.model = r.model
$$;

CREATE OR REPLACE FUNCTION pgqueue.ratelimit_tier_reserve(r pgqueue.rate_limits,
                                                          p_tier pgqueue.tier,
                                                          p_need double precision)
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        -- the tiers from critical down to p_tier: all backlogged, or p_tier itself
        WHEN enum_range(NULL::pgqueue.tier, p_tier) <@ (r.tiers_backlogged || p_tier) THEN 0
        ELSE greatest(0, least(
            pgqueue.setting('ratelimit_trunk_reserve', 0.25) * r.input_tokens_per_minute,
            r.input_tokens_per_minute - p_need))
    END
$$;

CREATE OR REPLACE FUNCTION pgqueue.ratelimit_try_take(p_model text, p_input_tokens double precision,
                                                      p_output_tokens double precision,
                                                      p_tier pgqueue.tier DEFAULT NULL)
RETURNS double precision
LANGUAGE plpgsql
AS $$
DECLARE
    r pgqueue.rate_limits := pgqueue.ratelimit_row(p_model);
    need_in double precision := p_input_tokens * r.input_estimate_ratio;
    wait double precision := pgqueue.ratelimit_wait(r, p_tier, p_input_tokens, p_output_tokens);
BEGIN
    IF wait = 0 THEN
        r.requests_available := r.requests_available - 1;
        r.input_tokens_available := r.input_tokens_available - need_in;
        r.output_tokens_available := r.output_tokens_available - p_output_tokens;
        r.guarantee_critical := greatest(0, r.guarantee_critical
            - CASE WHEN p_tier = 'critical' THEN need_in ELSE 0 END);
        r.guarantee_standard := greatest(0, r.guarantee_standard
            - CASE WHEN p_tier = 'standard' THEN need_in ELSE 0 END);
        r.guarantee_batch := greatest(0, r.guarantee_batch
            - CASE WHEN p_tier = 'batch' THEN need_in ELSE 0 END);
    END IF;
    PERFORM pgqueue.ratelimit_save(r);
    RETURN wait;
END
$$;

"""


def upgrade() -> None:
    op.execute(ADD_COLUMN)
    op.execute(FUNCTIONS)


def downgrade() -> None:
    op.execute(FUNCTIONS_BEFORE)
    op.execute("ALTER TABLE pgqueue.rate_limits DROP COLUMN IF EXISTS mean_input_tokens")
