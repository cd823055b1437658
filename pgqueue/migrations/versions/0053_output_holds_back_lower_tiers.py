"""A tier held back by the output tokens holds back the lower tiers (issue 28, tier capacity).

With the output-token bucket binding (``pgqueue replay --against-sandbox`` at Tier-1 limits,
the trace's own output sizes), lower tiers' smaller requests took the output tokens as they
came, and a critical head needing more never found them: critical p99 23 s. A head the input
rule admits but the output tokens or requests do not now holds back the lower tiers that are
not owed a job by their guarantee (EASY backfilling). The text is 060_rate_limiter.sql's.

Revision ID: 0053
Revises: 0050
"""

from __future__ import annotations

from alembic import op

revision = "0053"
down_revision = "0050"
branch_labels = None
depends_on = None

PICK_TIER = """\
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_pick_tier(p_model text, p_needs double precision[],
                                                       p_output_needs double precision[]
                                                           DEFAULT NULL)
RETURNS pgqueue.tier
LANGUAGE plpgsql
AS $$
DECLARE
    r pgqueue.rate_limits := pgqueue.ratelimit_row(p_model);
    tiers pgqueue.tier[] := enum_range(NULL::pgqueue.tier);
    need double precision[];
    g double precision[] := ARRAY[r.guarantee_critical, r.guarantee_standard, r.guarantee_batch];
    w double precision[] := ARRAY(SELECT pgqueue.tier_weight(u.t)
                                  FROM unnest(tiers) WITH ORDINALITY u(t, i) ORDER BY u.i);
    rate double precision := r.input_tokens_per_minute / 60.0;
    elapsed double precision := greatest(0, extract(epoch FROM now() - r.guarantees_at));
    total_w double precision := 0;
    grow double precision;
    picked pgqueue.tier;
    held_back boolean := false;
BEGIN
    IF array_length(p_needs, 1) IS DISTINCT FROM 3 THEN
        RAISE EXCEPTION 'p_needs must have one element per tier (3), got %', p_needs
            USING ERRCODE = '22023';
    END IF;
    need := ARRAY(SELECT n * r.input_estimate_ratio FROM unnest(p_needs) WITH ORDINALITY u(n, i)
                  ORDER BY i);
    r.tiers_backlogged := ARRAY(SELECT tiers[i] FROM generate_series(1, 3) i
                                WHERE need[i] IS NOT NULL ORDER BY i);
    FOR i IN 1 .. 3 LOOP
        g[i] := CASE WHEN need[i] IS NULL THEN 0 ELSE least(g[i], need[i]) END;
        total_w := total_w + CASE WHEN need[i] IS NULL THEN 0 ELSE w[i] END;
    END LOOP;
    FOR i IN 1 .. 3 LOOP
        CONTINUE WHEN need[i] IS NULL;
        grow := least(w[i] / total_w * rate * elapsed,
                      r.input_tokens_available - (g[1] + g[2] + g[3])
                      - pgqueue.ratelimit_tier_reserve(r, tiers[i], need[i]));
        IF grow > 0 THEN
            g[i] := g[i] + grow;
        END IF;
    END LOOP;
    r.guarantee_critical := g[1];
    r.guarantee_standard := g[2];
    r.guarantee_batch := g[3];
    r.guarantees_at := greatest(now(), r.guarantees_at);
    FOR i IN 1 .. 3 LOOP
        CONTINUE WHEN need[i] IS NULL OR (held_back AND g[i] < need[i]);
        IF pgqueue.ratelimit_wait(r, tiers[i], p_needs[i], coalesce(p_output_needs[i], 0))
               IN (0, 'Infinity'::double precision) THEN
            picked := tiers[i];
            EXIT;
        END IF;
        held_back := held_back OR pgqueue.ratelimit_wait(r, tiers[i], p_needs[i], 0) = 0;
    END LOOP;
    PERFORM pgqueue.ratelimit_save(r);
    RETURN picked;
END
$$;

"""

PICK_TIER_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_pick_tier(p_model text, p_needs double precision[],
                                                       p_output_needs double precision[]
                                                           DEFAULT NULL)
RETURNS pgqueue.tier
LANGUAGE plpgsql
AS $$
DECLARE
    r pgqueue.rate_limits := pgqueue.ratelimit_row(p_model);
    tiers pgqueue.tier[] := enum_range(NULL::pgqueue.tier);
    need double precision[];
    g double precision[] := ARRAY[r.guarantee_critical, r.guarantee_standard, r.guarantee_batch];
    w double precision[] := ARRAY(SELECT pgqueue.tier_weight(u.t)
                                  FROM unnest(tiers) WITH ORDINALITY u(t, i) ORDER BY u.i);
    rate double precision := r.input_tokens_per_minute / 60.0;
    elapsed double precision := greatest(0, extract(epoch FROM now() - r.guarantees_at));
    total_w double precision := 0;
    grow double precision;
    picked pgqueue.tier;
BEGIN
    IF array_length(p_needs, 1) IS DISTINCT FROM 3 THEN
        RAISE EXCEPTION 'p_needs must have one element per tier (3), got %', p_needs
            USING ERRCODE = '22023';
    END IF;
    need := ARRAY(SELECT n * r.input_estimate_ratio FROM unnest(p_needs) WITH ORDINALITY u(n, i)
                  ORDER BY i);
    r.tiers_backlogged := ARRAY(SELECT tiers[i] FROM generate_series(1, 3) i
                                WHERE need[i] IS NOT NULL ORDER BY i);
    FOR i IN 1 .. 3 LOOP
        g[i] := CASE WHEN need[i] IS NULL THEN 0 ELSE least(g[i], need[i]) END;
        total_w := total_w + CASE WHEN need[i] IS NULL THEN 0 ELSE w[i] END;
    END LOOP;
    FOR i IN 1 .. 3 LOOP
        CONTINUE WHEN need[i] IS NULL;
        grow := least(w[i] / total_w * rate * elapsed,
                      r.input_tokens_available - (g[1] + g[2] + g[3])
                      - pgqueue.ratelimit_tier_reserve(r, tiers[i], need[i]));
        IF grow > 0 THEN
            g[i] := g[i] + grow;
        END IF;
    END LOOP;
    r.guarantee_critical := g[1];
    r.guarantee_standard := g[2];
    r.guarantee_batch := g[3];
    r.guarantees_at := greatest(now(), r.guarantees_at);
    FOR i IN 1 .. 3 LOOP
        CONTINUE WHEN need[i] IS NULL;
        IF pgqueue.ratelimit_wait(r, tiers[i], p_needs[i], coalesce(p_output_needs[i], 0))
               IN (0, 'Infinity'::double precision) THEN
            picked := tiers[i];
            EXIT;
        END IF;
    END LOOP;
    PERFORM pgqueue.ratelimit_save(r);
    RETURN picked;
END
$$;

"""


def upgrade() -> None:
    op.execute(PICK_TIER)


def downgrade() -> None:
    op.execute(PICK_TIER_BEFORE)
