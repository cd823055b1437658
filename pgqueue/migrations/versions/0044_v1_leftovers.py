"""Leftovers of scheduler v1 after 0042: ``queue_counts_release_claims`` no longer takes v1's
advisory lock (nothing else takes it; any role could hold it and stall the worker's upkeep),
``ratelimit_pick_tier`` reads the tier weights through ``pgqueue.tier_weight`` like the rest
of the claim, and the ``claim_stripe`` column's comment says what v2 does.

Revision ID: 0044
Revises: 0043
"""

from __future__ import annotations

from alembic import op

revision = "0044"
down_revision = "0043"
branch_labels = None
depends_on = None

RELEASE_CLAIMS = """\
CREATE OR REPLACE FUNCTION pgqueue.queue_counts_release_claims() RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    released integer;
BEGIN
    UPDATE pgqueue.queue_counts c SET claim_stripe = false WHERE c.claim_stripe;
    GET DIAGNOSTICS released = ROW_COUNT;
    RETURN released;
END
$$;
"""

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

CLAIM_STRIPE_COMMENT = """\
COMMENT ON COLUMN pgqueue.queue_counts.claim_stripe IS 'The key''s claim row (revision 0017): written only by the v1 claim, one at a time under its lock; scheduler v2 (revision 0042) writes none, and queue_counts_release_claims turns those left by v1 into ordinary rows';
"""

RELEASE_CLAIMS_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.queue_counts_release_claims() RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    released integer;
BEGIN
    -- Under the scheduler's lock, so that no claim is writing its rows: the rows become
    -- ordinary counter rows, which queue_counts_compact folds (revision 0017).
    PERFORM pg_advisory_xact_lock(7310575183440224370);  -- 'pgq_drr!', drr_dispatch's
    UPDATE pgqueue.queue_counts c SET claim_stripe = false WHERE c.claim_stripe;
    GET DIAGNOSTICS released = ROW_COUNT;
    RETURN released;
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
    -- the tiers' weights (GUC pgqueue.tier_weight_<tier>, else 70, 25, 5)
    w double precision[] := ARRAY[pgqueue.setting('tier_weight_critical', 70),
                                  pgqueue.setting('tier_weight_standard', 25),
                                  pgqueue.setting('tier_weight_batch', 5)];
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

CLAIM_STRIPE_COMMENT_BEFORE = """\
COMMENT ON COLUMN pgqueue.queue_counts.claim_stripe IS 'The key''s claim row (revision 0017): written only by claims, one at a time under the scheduler lock; producers and the compactor leave it alone';
"""


def upgrade() -> None:
    for text in (RELEASE_CLAIMS, PICK_TIER, CLAIM_STRIPE_COMMENT):
        op.execute(text)


def downgrade() -> None:
    for text in (RELEASE_CLAIMS_BEFORE, PICK_TIER_BEFORE, CLAIM_STRIPE_COMMENT_BEFORE):
        op.execute(text)
