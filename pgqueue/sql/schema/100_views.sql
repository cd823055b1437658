-- Views for dashboards and `pgqueue status`, with the table functions behind them (a window
-- as argument): queue depth, the claim order, service per tenant, Jain's fairness index,
-- latency against the SLOs, the rate limiter's state, admission.

-- Jobs waiting and running per tier (every tier listed, zeros included), the oldest queued
-- job's age in seconds, and how many queued jobs are due now. It never reads finished jobs
-- (revision 0046; `state IN ('queued', 'running')` matched no partial index and read the whole
-- table): queued from the exact counters (queue_counts, the tier's total rows), due as queued
-- less the jobs not due yet (jobs_queued_run_at_idx from now on: such a job is never stamped,
-- revision 0060), running through jobs_running_lease_idx, the oldest by one probe of
-- jobs_queued_enqueued_idx per tier
-- (revision 0049: it read every queued job, ~0.2 s at 1M). Each is a join or subquery of its
-- own, which the planner drops when its column is not read: the exporter's `SELECT tier,
-- queued, running` reads counters and running jobs.
CREATE VIEW pgqueue.queue_depth AS
SELECT t.tier,
       coalesce(c.queued, 0)::bigint AS queued,
       coalesce(c.queued, 0)::bigint - coalesce(l.later, 0) AS due,
       coalesce(r.running, 0) AS running,
       (SELECT extract(epoch FROM now() - min(j.enqueued_at))::double precision
        FROM pgqueue.jobs j
        WHERE j.state = 'queued' AND j.priority = t.tier) AS oldest_queued_seconds
FROM unnest(enum_range(NULL::pgqueue.tier)) AS t(tier)
LEFT JOIN (
    SELECT qc.tier, sum(qc.queued) AS queued
    FROM pgqueue.queue_counts qc
    WHERE qc.tenant_id IS NULL
    GROUP BY qc.tier
) c ON c.tier = t.tier
LEFT JOIN (
    SELECT j.priority, count(*) AS later
    FROM pgqueue.jobs j
    WHERE j.state = 'queued' AND j.key_round IS NULL AND j.run_at > now()
    GROUP BY j.priority
) l ON l.priority = t.tier
LEFT JOIN (
    SELECT j.priority, count(*) AS running
    FROM pgqueue.jobs j
    WHERE j.state = 'running'
    GROUP BY j.priority
) r ON r.priority = t.tier
ORDER BY t.tier;

-- The fair order (070_scheduler.sql): per lane and tier, highest tier first, the stamped
-- queued jobs in key order up to the frontier (past it, a later fold may stamp jobs with
-- smaller keys), then the due jobs no claim has stamped yet (round, place and seq NULL: the
-- next fold places them). Round 0 is the cursor's (the round of the last job claimed). Within
-- a lane and tier the claims take the stamped ones in this order; across lanes and tiers, see
-- pgqueue.claim_lanes.
CREATE VIEW pgqueue.claim_order AS
SELECT j.lane, j.priority AS tier, j.tenant_id, j.id AS job_id, j.cost,
       j.key_round - coalesce(c.key_round, 0) AS round, j.key_place AS place, j.key_seq AS seq
FROM pgqueue.jobs j
LEFT JOIN pgqueue.lane_tiers l ON l.lane = j.lane AND l.tier = j.priority
LEFT JOIN LATERAL (SELECT x.key_round FROM pgqueue.cursors x
                   WHERE x.lane = j.lane AND x.tier = j.priority
                   ORDER BY x.key_round DESC LIMIT 1) c ON true
WHERE j.state = 'queued'
  AND CASE WHEN j.key_round IS NULL THEN j.run_at <= now()
           ELSE l.frontier_round IS NULL OR (j.key_round, j.key_place, j.key_seq)
                                            <= (l.frontier_round, l.frontier_place, l.frontier_seq)
      END
ORDER BY j.priority, j.lane, j.key_round NULLS LAST, j.key_place, j.key_seq, j.run_at, j.id;

-- The jobs started (claimed) at or after `since`, whatever their state now: the jobs served in
-- a window. By three partial indexes, none of which a claim or a success writes an entry in
-- (revision 0060; jobs_started_at_idx held every started job, two entries per job): the
-- running ones (jobs_running_lease_idx), the succeeded ones by when they finished
-- (jobs_finished_at_idx; a success is written after its claim committed, so it finished at or
-- after it started), the others (queued again, failed, cancelled) by jobs_started_at_idx.
CREATE OR REPLACE FUNCTION pgqueue.jobs_started_since(since timestamp with time zone)
RETURNS SETOF pgqueue.jobs
LANGUAGE sql STABLE
AS $$
    SELECT j.* FROM pgqueue.jobs j
    WHERE j.state = 'running' AND j.started_at >= since
    UNION ALL
    SELECT j.* FROM pgqueue.jobs j
    WHERE j.state = 'succeeded' AND j.finished_at >= since AND j.started_at >= since
    UNION ALL
    SELECT j.* FROM pgqueue.jobs j
    WHERE j.state IN ('queued', 'failed', 'cancelled') AND j.started_at >= since
$$;

-- Per tenant and tier, over the last `service_window`: jobs and cost units served (claimed),
-- queued now, the tenant's quantum (its DRR weight), and whether it was backlogged in the
-- window (had work waiting at some moment of it: served in it, or queued now).
CREATE OR REPLACE FUNCTION pgqueue.tenant_service_in(service_window interval)
RETURNS TABLE (tenant_id text, tier pgqueue.tier, jobs_served bigint,
               cost_served double precision, jobs_queued bigint,
               cost_queued double precision, quantum double precision, backlogged boolean)
LANGUAGE sql STABLE
AS $$
    WITH served AS (
        SELECT j.tenant_id, j.priority AS tier, count(*) AS n, sum(j.cost) AS c
        FROM pgqueue.jobs_started_since(now() - service_window) j
        GROUP BY j.tenant_id, j.priority
    ), queued AS (
        SELECT j.tenant_id, j.priority AS tier, count(*) AS n, sum(j.cost) AS c
        FROM pgqueue.jobs j
        WHERE j.state = 'queued' AND j.enqueued_at <= now()
        GROUP BY j.tenant_id, j.priority
    )
    SELECT coalesce(s.tenant_id, q.tenant_id), coalesce(s.tier, q.tier),
           coalesce(s.n, 0), coalesce(s.c, 0)::double precision,
           coalesce(q.n, 0), coalesce(q.c, 0)::double precision,
           pgqueue.tenant_quantum(coalesce(s.tenant_id, q.tenant_id)),
           true
    FROM served s
    FULL JOIN queued q ON q.tenant_id = s.tenant_id AND q.tier = s.tier
$$;

CREATE VIEW pgqueue.tenant_service AS
SELECT w.window_name, w.service_window, ts.*
FROM (VALUES ('1m', interval '1 minute'), ('5m', interval '5 minutes'),
             ('1h', interval '1 hour')) AS w(window_name, service_window)
CROSS JOIN LATERAL pgqueue.tenant_service_in(w.service_window) ts;

-- The batches lane per tenant since the start (docs/batches.md): requests sent in batches,
-- their results by type (pending: in a batch not ended yet), and the tokens of the succeeded
-- ones (their jobs' usage; a job removed by retention no longer counts).
CREATE VIEW pgqueue.batch_lane_service AS
SELECT bj.tenant_id, count(*) AS requests,
       count(*) FILTER (WHERE bj.outcome IS NULL) AS pending,
       count(*) FILTER (WHERE bj.outcome = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE bj.outcome = 'errored') AS errored,
       count(*) FILTER (WHERE bj.outcome = 'expired') AS expired,
       count(*) FILTER (WHERE bj.outcome = 'canceled') AS canceled,
       coalesce(sum(j.input_tokens) FILTER (WHERE bj.outcome = 'succeeded'), 0)::bigint
           AS input_tokens,
       coalesce(sum(j.output_tokens) FILTER (WHERE bj.outcome = 'succeeded'), 0)::bigint
           AS output_tokens
FROM pgqueue.batch_jobs bj
LEFT JOIN pgqueue.jobs j ON j.id = bj.job_id AND j.tenant_id = bj.tenant_id
GROUP BY bj.tenant_id;

-- Jain's index (Σx)²/(n·Σx²) over the tenants backlogged now, per tier and over all tiers
-- (tier NULL): x = cost served / quantum (weight-normalised), and x = cost served, counted
-- over the span in which every one of them was backlogged without a break (from the latest
-- of their backlogs' starts, at most `service_window` ago, to now). A tenant is backlogged
-- while it has a due job waiting; a tenant that drained is no longer compared (its earlier
-- service was fair or not against the others then, not now). NULL, no data: fewer than two
-- tenants backlogged, or less than one DRR round (a quantum each) served in the span.
CREATE OR REPLACE FUNCTION pgqueue.fairness_in(service_window interval)
RETURNS TABLE (tier pgqueue.tier, tenants bigint, jain_weighted double precision,
               jain_unweighted double precision)
LANGUAGE sql STABLE
AS $$
    WITH bounds AS (
        SELECT now() - service_window AS t0, now() AS t1
    ), started AS (  -- the window's jobs, read once (not a sort of the whole table: 3 s at 1M)
        SELECT j.tenant_id, j.priority, j.state, j.cost, j.enqueued_at, j.run_at, j.started_at
        FROM pgqueue.jobs_started_since(now() - service_window) j
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
        FROM started j
        WHERE j.state <> 'queued'
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
        LEFT JOIN started j  -- every span starts in the window
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

CREATE VIEW pgqueue.fairness AS
SELECT w.window_name, w.service_window, f.*
FROM (VALUES ('1m', interval '1 minute'), ('5m', interval '5 minutes'),
             ('1h', interval '1 hour')) AS w(window_name, service_window)
CROSS JOIN LATERAL pgqueue.fairness_in(w.service_window) f;

-- The latency SLOs per tier, in seconds of enqueue-to-finish at p99 (the article's figures):
-- critical 2 s, standard 6 s, batch 120 s. GUCs pgqueue.slo_p99_<tier>_seconds override.
CREATE OR REPLACE FUNCTION pgqueue.slo_p99_seconds(tier pgqueue.tier)
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT pgqueue.setting('slo_p99_' || tier::text || '_seconds',
                           CASE tier WHEN 'critical' THEN 2 WHEN 'standard' THEN 6 ELSE 120 END)
$$;

-- p50 / p95 / p99 of enqueue-to-finish latency (seconds) of jobs that finished in the window,
-- per tier, against the SLO; meets_slo is NULL when nothing finished.
CREATE OR REPLACE FUNCTION pgqueue.latency_slo_in(slo_window interval)
RETURNS TABLE (tier pgqueue.tier, finished bigint, succeeded bigint, failed bigint,
               p50_seconds double precision, p95_seconds double precision,
               p99_seconds double precision, slo_p99_seconds double precision,
               meets_slo boolean)
LANGUAGE sql STABLE
AS $$
    SELECT t.tier, coalesce(l.finished, 0), coalesce(l.succeeded, 0), coalesce(l.failed, 0),
           l.p50, l.p95, l.p99, pgqueue.slo_p99_seconds(t.tier),
           CASE WHEN l.p99 IS NULL THEN NULL ELSE l.p99 <= pgqueue.slo_p99_seconds(t.tier) END
    FROM unnest(enum_range(NULL::pgqueue.tier)) AS t(tier)
    LEFT JOIN (
        SELECT j.priority,
               count(*) AS finished,
               count(*) FILTER (WHERE j.state = 'succeeded') AS succeeded,
               count(*) FILTER (WHERE j.state = 'failed') AS failed,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM j.finished_at - j.enqueued_at)) AS p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM j.finished_at - j.enqueued_at)) AS p95,
               percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM j.finished_at - j.enqueued_at)) AS p99
        FROM pgqueue.jobs j
        WHERE j.state IN ('succeeded', 'failed') AND j.finished_at >= now() - slo_window
        GROUP BY j.priority
    ) l ON l.priority = t.tier
    ORDER BY t.tier
$$;

CREATE VIEW pgqueue.latency_slo AS
SELECT w.window_name, w.slo_window, s.*
FROM (VALUES ('5m', interval '5 minutes'), ('1h', interval '1 hour'),
             ('24h', interval '24 hours')) AS w(window_name, slo_window)
CROSS JOIN LATERAL pgqueue.latency_slo_in(w.slo_window) s;

-- Per model: limits, levels refilled to now, cooldown, estimate ratio, and the input tokens
-- each tier's guarantee held at the last pick (guarantees_at), with the tiers then backlogged
-- (read-only).
CREATE VIEW pgqueue.rate_limit_state AS
SELECT l.model, l.requests_per_minute, l.input_tokens_per_minute, l.output_tokens_per_minute,
       least(l.requests_per_minute, l.requests_available
             + greatest(0, extract(epoch FROM now() - l.refreshed_at)) * l.requests_per_minute / 60.0)
           AS requests_available,
       least(l.input_tokens_per_minute, l.input_tokens_available
             + greatest(0, extract(epoch FROM now() - l.refreshed_at)) * l.input_tokens_per_minute / 60.0)
           AS input_tokens_available,
       least(l.output_tokens_per_minute, l.output_tokens_available
             + greatest(0, extract(epoch FROM now() - l.refreshed_at)) * l.output_tokens_per_minute / 60.0)
           AS output_tokens_available,
       coalesce(l.cooldown_until > now(), false) AS cooling_down,
       l.cooldown_until, l.input_estimate_ratio, l.limits_from_headers,
       l.guarantee_critical, l.guarantee_standard, l.guarantee_batch, l.guarantees_at,
       l.tiers_backlogged
FROM pgqueue.rate_limits l;

-- Per tier: queued jobs (from the counters, no scan of jobs), the caps and policy, and the
-- jobs dropped by admission so far.
CREATE VIEW pgqueue.admission_status AS
SELECT a.tier, coalesce(c.queued, 0)::bigint AS queued, a.max_queued, a.tenant_max_queued,
       a.policy, coalesce(c.dropped, 0)::bigint AS dropped
FROM pgqueue.admission a
LEFT JOIN (
    SELECT qc.tier,
           sum(qc.queued) FILTER (WHERE qc.tenant_id IS NULL) AS queued,
           sum(qc.dropped) FILTER (WHERE qc.tenant_id IS NOT NULL) AS dropped
    FROM pgqueue.queue_counts qc
    GROUP BY qc.tier
) c ON c.tier = a.tier
ORDER BY a.tier;
