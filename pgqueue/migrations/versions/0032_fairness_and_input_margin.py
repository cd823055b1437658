"""Jain's index over the tenants backlogged now, over the span they were all backlogged, no
data (NULL) is not 1.0; and the limiter keeps a margin for its input-token estimate.

``pgqueue.fairness_in`` (behind the view ``pgqueue.fairness``) counted as backlogged every tenant
served in the window, so once most tenants had drained a fair schedule read unfair (8 tenants
at 0.997 while all were backlogged, then 0.33 over 5 minutes), and with nothing served it read
1.0. Now it compares the tenants with due work waiting now, over the span since the latest of
their backlogs began (at most the window), and answers NULL with fewer than two of them or
less than one DRR round served (issue 29, item 5).

``pgqueue.ratelimit_try_take`` admitted input tokens up to the bucket's whole level, though
they are an estimate: a worker starting on a full 40k bucket admitted 40.3-40.4k in its first
second and met a 429. The input bucket now keeps a margin (GUC
``pgqueue.ratelimit_input_margin``, 2 % of the per-minute limit) (issue 29, item 12).

Revision ID: 0032
Revises: 0030
"""

from __future__ import annotations

from alembic import op

revision = "0032"
down_revision = "0030"
branch_labels = None
depends_on = None

FAIRNESS_IN = """\
CREATE OR REPLACE FUNCTION pgqueue.fairness_in(service_window interval)
RETURNS TABLE (tier pgqueue.tier, tenants bigint, jain_weighted double precision,
               jain_unweighted double precision)
LANGUAGE sql STABLE
AS $$
    WITH bounds AS (
        SELECT now() - service_window AS t0, now() AS t1
    ), waits AS (
        -- when each job waited (due, not yet started), in or reaching into the window; the
        -- jobs waiting now as one interval per tenant and tier (they all reach now)
        SELECT j.tenant_id, j.priority AS tier, min(greatest(j.enqueued_at, j.run_at)) AS s,
               b.t1 AS e
        FROM pgqueue.jobs j, bounds b
        WHERE j.state = 'queued' AND j.run_at <= b.t1
        GROUP BY j.tenant_id, j.priority, b.t1
        UNION ALL
        SELECT j.tenant_id, j.priority, greatest(j.enqueued_at, j.run_at), j.started_at
        FROM pgqueue.jobs j, bounds b
        WHERE j.started_at >= b.t0 AND j.state <> 'queued'
    ), marked AS (
        SELECT w.tenant_id, w.tier, w.s, w.e,
               w.s > coalesce(max(w.e) OVER (PARTITION BY w.tenant_id, w.tier ORDER BY w.s, w.e
                                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                              '-infinity') AS starts_backlog
        FROM waits w
    ), backlogged AS (
        SELECT m.tenant_id, m.tier, greatest(max(m.s) FILTER (WHERE m.starts_backlog), b.t0)
                   AS since
        FROM marked m, bounds b
        GROUP BY m.tenant_id, m.tier, b.t0, b.t1
        HAVING max(m.e) >= b.t1
    ), spans AS (
        SELECT k.tenant_id, k.tier, max(k.since) OVER (PARTITION BY k.tier) AS tier_since,
               max(k.since) OVER () AS all_since
        FROM backlogged k
    ), served AS (
        SELECT p.tenant_id, p.tier,
               coalesce(sum(j.cost) FILTER (WHERE j.started_at >= p.tier_since), 0) AS c_tier,
               coalesce(sum(j.cost) FILTER (WHERE j.started_at >= p.all_since), 0) AS c_all
        FROM spans p
        LEFT JOIN pgqueue.jobs j
               ON j.tenant_id = p.tenant_id AND j.priority = p.tier
              AND j.started_at >= least(p.tier_since, p.all_since)
        GROUP BY p.tenant_id, p.tier
    ), per_tenant AS (
        SELECT s.tier, s.tenant_id, s.c_tier AS c, pgqueue.tenant_quantum(s.tenant_id) AS q
        FROM served s
        UNION ALL
        SELECT NULL, s.tenant_id, sum(s.c_all), pgqueue.tenant_quantum(s.tenant_id)
        FROM served s
        GROUP BY s.tenant_id
    )
    SELECT p.tier, count(*),
           CASE WHEN count(*) >= 2 AND sum(p.c / p.q) >= count(*)
                THEN least(1.0, sum(p.c / p.q) ^ 2 / (count(*) * sum((p.c / p.q) ^ 2))) END,
           CASE WHEN count(*) >= 2 AND sum(p.c / p.q) >= count(*)
                THEN least(1.0, sum(p.c) ^ 2 / (count(*) * sum(p.c ^ 2))) END
    FROM per_tenant p
    GROUP BY p.tier
$$;
"""

FAIRNESS_IN_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.fairness_in(service_window interval)
RETURNS TABLE (tier pgqueue.tier, tenants bigint, jain_weighted double precision,
               jain_unweighted double precision)
LANGUAGE sql STABLE
AS $$
    WITH per_tenant AS (
        SELECT s.tier, s.tenant_id, sum(s.cost_served) AS c, max(s.quantum) AS q
        FROM pgqueue.tenant_service_in(service_window) s
        WHERE s.backlogged
        GROUP BY GROUPING SETS ((s.tier, s.tenant_id), (s.tenant_id))
    )
    SELECT p.tier, count(*),
           CASE WHEN sum((p.c / p.q) ^ 2) > 0
                THEN least(1.0, sum(p.c / p.q) ^ 2 / (count(*) * sum((p.c / p.q) ^ 2)))
                ELSE 1.0 END,
           CASE WHEN sum(p.c ^ 2) > 0
                THEN least(1.0, sum(p.c) ^ 2 / (count(*) * sum(p.c ^ 2)))
                ELSE 1.0 END
    FROM per_tenant p
    GROUP BY p.tier
$$;
"""

RATELIMIT_TRY_TAKE = """\
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_try_take(p_model text, p_input_tokens double precision,
                                                      p_output_tokens double precision)
RETURNS double precision
LANGUAGE plpgsql
AS $$
DECLARE
    r pgqueue.rate_limits := pgqueue.ratelimit_row(p_model);
    need_in double precision := p_input_tokens * r.input_estimate_ratio;
    margin double precision := least(
        pgqueue.setting('ratelimit_input_margin', 0.02) * r.input_tokens_per_minute,
        greatest(0, r.input_tokens_per_minute - need_in));
    wait double precision := 0;
BEGIN
    IF r.cooldown_until > now() THEN
        RETURN extract(epoch FROM r.cooldown_until - now());
    END IF;
    IF need_in > r.input_tokens_per_minute OR p_output_tokens > r.output_tokens_per_minute THEN
        RETURN 'Infinity'::double precision;
    END IF;
    wait := greatest(
        (1 - r.requests_available) / (r.requests_per_minute / 60.0),
        (need_in + margin - r.input_tokens_available) / (r.input_tokens_per_minute / 60.0),
        (p_output_tokens - r.output_tokens_available) / (r.output_tokens_per_minute / 60.0),
        0);
    IF wait > 0 THEN
        PERFORM pgqueue.ratelimit_save(r);
        RETURN wait;
    END IF;
    r.requests_available := r.requests_available - 1;
    r.input_tokens_available := r.input_tokens_available - need_in;
    r.output_tokens_available := r.output_tokens_available - p_output_tokens;
    PERFORM pgqueue.ratelimit_save(r);
    RETURN 0;
END
$$;
"""

RATELIMIT_TRY_TAKE_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.ratelimit_try_take(p_model text, p_input_tokens double precision,
                                                      p_output_tokens double precision)
RETURNS double precision
LANGUAGE plpgsql
AS $$
DECLARE
    r pgqueue.rate_limits := pgqueue.ratelimit_row(p_model);
    need_in double precision := p_input_tokens * r.input_estimate_ratio;
    wait double precision := 0;
BEGIN
    IF r.cooldown_until > now() THEN
        RETURN extract(epoch FROM r.cooldown_until - now());
    END IF;
    IF need_in > r.input_tokens_per_minute OR p_output_tokens > r.output_tokens_per_minute THEN
        RETURN 'Infinity'::double precision;
    END IF;
    wait := greatest(
        (1 - r.requests_available) / (r.requests_per_minute / 60.0),
        (need_in - r.input_tokens_available) / (r.input_tokens_per_minute / 60.0),
        (p_output_tokens - r.output_tokens_available) / (r.output_tokens_per_minute / 60.0),
        0);
    IF wait > 0 THEN
        PERFORM pgqueue.ratelimit_save(r);
        RETURN wait;
    END IF;
    r.requests_available := r.requests_available - 1;
    r.input_tokens_available := r.input_tokens_available - need_in;
    r.output_tokens_available := r.output_tokens_available - p_output_tokens;
    PERFORM pgqueue.ratelimit_save(r);
    RETURN 0;
END
$$;
"""


def upgrade() -> None:
    op.execute(FAIRNESS_IN)
    op.execute(RATELIMIT_TRY_TAKE)


def downgrade() -> None:
    op.execute(FAIRNESS_IN_BEFORE)
    op.execute(RATELIMIT_TRY_TAKE_BEFORE)
