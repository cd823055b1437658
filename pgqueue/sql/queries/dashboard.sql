-- What `pgqueue dashboard` and `pgqueue jobs list|show` read (pgqueue/dashboard,
-- pgqueue/observability/jobs.py). The overview also runs report.sql's report_latency_slo,
-- report_fairness, report_demotions and report_throttles_by_tenant, and ratelimit_list, the
-- statements `pgqueue status` and `pgqueue limits list` run (the views latency_slo,
-- fairness, rate_limit_state).

-- name: dashboard_depth_by_lane :many
-- Per lane and tier: queued jobs, those due now, the oldest queued one's age (seconds), and
-- running jobs. A lane is a rate-limit pool: the model for anthropic.messages jobs, the kind
-- otherwise (pgqueue.jobs.lane, the scheduler's). Two scans, one of each partial index
-- (queued, running), never the finished jobs: `state IN ('queued', 'running')` matches
-- neither index, and read the whole table (0.6 s at 1M jobs; bench/dashboard.py).
WITH live AS (
    SELECT j.lane, j.priority, 1 AS queued, (j.run_at <= now())::int AS due,
           0 AS running, j.enqueued_at
    FROM pgqueue.jobs j
    WHERE j.state = 'queued'
    UNION ALL
    SELECT j.lane, j.priority, 0, 0, 1, NULL
    FROM pgqueue.jobs j
    WHERE j.state = 'running'
)
SELECT l.lane, l.priority::text AS tier,
       sum(l.queued) AS queued, sum(l.due) AS due, sum(l.running) AS running,
       extract(epoch FROM now() - min(l.enqueued_at))::double precision AS oldest_queued_seconds
FROM live l
GROUP BY 1, l.priority
ORDER BY 1, l.priority

-- name: dashboard_throttles_by_model :many
-- Throttle events (429/529) per model in the last window_seconds.
SELECT coalesce(e.model, '') AS model, count(*) AS throttles,
       count(*) FILTER (WHERE e.status_code = 429) AS http_429,
       count(*) FILTER (WHERE e.status_code = 529) AS http_529
FROM pgqueue.throttle_events e
WHERE e.occurred_at > now() - make_interval(secs => %(window_seconds)s)
GROUP BY 1
ORDER BY throttles DESC, 1

-- name: dashboard_tenants :many
-- Per tenant: plan and quantum (its DRR weight), cost served over the window and its share
-- of all cost served, queued jobs, throttles in the last minute, demoted until, input tokens
-- used today against the daily budget, tokens of the batches lane (pgqueue.batch_lane_service).
-- Tenants with work queued or served first.
WITH service AS (
    SELECT s.tenant_id, sum(s.jobs_served) AS jobs_served, sum(s.cost_served) AS cost_served,
           sum(s.jobs_queued) AS jobs_queued
    FROM pgqueue.tenant_service_in(make_interval(secs => %(window_seconds)s)) s
    GROUP BY s.tenant_id
), throttles AS (
    SELECT e.tenant_id, count(*) AS throttles
    FROM pgqueue.throttle_events e
    WHERE e.occurred_at > now() - interval '60 seconds'
    GROUP BY e.tenant_id
), demoted AS (
    SELECT d.tenant_id, max(d.expires_at) AS demoted_until
    FROM pgqueue.demotions d
    WHERE d.expires_at > now()
    GROUP BY d.tenant_id
)
SELECT t.tenant_id, t.plan, t.quantum AS quantum_set,
       pgqueue.tenant_quantum(t.tenant_id) AS quantum,
       coalesce(s.jobs_served, 0) AS jobs_served,
       coalesce(s.cost_served, 0)::double precision AS cost_served,
       coalesce(s.cost_served / nullif(sum(s.cost_served) OVER (), 0), 0)::double precision
           AS service_share,
       (pgqueue.tenant_quantum(t.tenant_id)
        / nullif(sum(pgqueue.tenant_quantum(t.tenant_id))
                     FILTER (WHERE s.tenant_id IS NOT NULL) OVER (), 0))::double precision
           AS weight_share,
       coalesce(s.jobs_queued, 0) AS queued,
       coalesce(th.throttles, 0) AS throttles,
       d.demoted_until,
       coalesce(u.input_tokens, 0) AS input_tokens_today,
       coalesce(t.daily_token_budget, pgqueue.setting('default_daily_budget', 100000)::bigint)
           AS daily_token_budget,
       coalesce(b.input_tokens, 0) AS batch_input_tokens,
       coalesce(b.output_tokens, 0) AS batch_output_tokens
FROM pgqueue.tenants t
LEFT JOIN service s ON s.tenant_id = t.tenant_id
LEFT JOIN throttles th ON th.tenant_id = t.tenant_id
LEFT JOIN demoted d ON d.tenant_id = t.tenant_id
LEFT JOIN pgqueue.usage_daily u ON u.tenant_id = t.tenant_id AND u.day = pgqueue.budget_day()
LEFT JOIN pgqueue.batch_lane_service b ON b.tenant_id = t.tenant_id
ORDER BY (s.tenant_id IS NULL), coalesce(s.jobs_queued, 0) DESC, coalesce(s.cost_served, 0) DESC,
         t.tenant_id
LIMIT %(limit)s

-- name: dashboard_claim_order :many
-- What runs next, per tier and lane in key order: the view, as it is (its columns are shown
-- as they come: lane, tier, tenant_id, job_id, cost, round, place, seq). Only stamped jobs
-- have a key; claims stamp the due ones (pgqueue.fold), so with workers running the view
-- lags new arrivals by about a poll interval.
SELECT * FROM pgqueue.claim_order LIMIT %(limit)s

-- name: dashboard_unstamped :many
-- The lanes and tiers with due jobs that have no key yet (claims stamp them; a skip scan, one
-- probe per lane and tier). The page only reads: a fold here, even rolled back, would hold
-- the lane's stamping lock and its rows while the workers' folds skip it.
SELECT u.lane, u.tier::text AS tier FROM pgqueue.lane_tiers_due() u
ORDER BY u.tier, u.lane

-- name: job_list :many
-- Jobs matching every given filter, newest first, `limit` of them from below `before_id`
-- (a page: pass the last id shown). A scan of jobs_pkey backwards.
SELECT j.id, j.tenant_id, j.kind,
       j.lane,
       j.priority::text AS tier, j.state::text AS state, j.attempts, j.max_attempts, j.cost,
       j.enqueued_at, j.run_at, j.started_at, j.finished_at,
       left(j.last_error, 200) AS last_error
FROM pgqueue.jobs j
WHERE (%(state)s::text IS NULL OR j.state = %(state)s::pgqueue.job_state)
  AND (%(tenant_id)s::text IS NULL OR j.tenant_id = %(tenant_id)s::text)
  AND (%(tier)s::text IS NULL OR j.priority = %(tier)s::pgqueue.tier)
  AND (%(kind)s::text IS NULL OR j.kind = %(kind)s::text)
  AND (%(before_id)s::bigint IS NULL OR j.id < %(before_id)s::bigint)
ORDER BY j.id DESC
LIMIT %(limit)s

-- name: job_get :one
-- One job, every column a user may look at (the lease token is not shown).
SELECT j.id, j.tenant_id, j.kind,
       j.lane,
       j.origin::text AS origin, j.sla_seconds, j.priority::text AS tier,
       j.state::text AS state, j.payload, j.result, j.last_error, j.cost, j.est_input_tokens,
       j.max_output_tokens, j.input_tokens, j.output_tokens, j.attempts, j.max_attempts,
       j.throttle_retries, j.dedupe_key, j.worker_id, j.enqueued_at, j.run_at, j.started_at,
       j.finished_at, j.lease_expires_at
FROM pgqueue.jobs j
WHERE j.id = %(job_id)s

-- name: job_throttles :many
-- The throttle events (429/529) recorded for one job, oldest first (by the tenant's index).
SELECT e.occurred_at, e.status_code, e.retry_after_seconds, e.model
FROM pgqueue.throttle_events e
WHERE e.tenant_id = %(tenant_id)s AND e.occurred_at >= %(since)s AND e.job_id = %(job_id)s
ORDER BY e.occurred_at, e.id

-- name: job_retry_one :one
-- Put one failed or cancelled job back in the queue with fresh counters (pgqueue.retry,
-- revision 0034): its state after, 'queued' or its state unchanged. PQ011: no such job;
-- PQ013: a live job holds its dedupe key.
SELECT pgqueue.retry(%(job_id)s, %(tenant_id)s) AS state
