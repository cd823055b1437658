-- Read-only summaries for `pgqueue status`, the demo and replay reports.

-- name: report_depth :many
-- Queued and running jobs per tier, from pgqueue.queue_depth's counters and running jobs (a
-- `state IN ('queued', 'running')` on jobs read the whole table, finished jobs included).
SELECT d.tier::text AS tier, s.state,
       CASE s.state WHEN 'queued' THEN d.queued ELSE d.running END AS jobs
FROM pgqueue.queue_depth d
CROSS JOIN (VALUES ('queued'), ('running')) AS s(state)
ORDER BY d.tier, s.state

-- name: report_oldest_queued :many
-- The tiers with queued jobs, and the oldest one's age: pgqueue.queue_depth's probe of
-- jobs_queued_enqueued_idx (grouping the queued jobs read them all: ~0.2 s at 1M).
SELECT d.tier::text AS tier, d.oldest_queued_seconds AS oldest_seconds
FROM pgqueue.queue_depth d
WHERE d.oldest_queued_seconds IS NOT NULL
ORDER BY d.tier

-- name: report_top_tenants :many
SELECT tenant_id,
       count(*) FILTER (WHERE state = 'queued') AS queued,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE state = 'failed') AS failed,
       coalesce(sum(input_tokens), 0) AS input_tokens,
       coalesce(sum(output_tokens), 0) AS output_tokens
FROM pgqueue.jobs
WHERE enqueued_at >= coalesce(%(since)s, '-infinity'::timestamptz)
GROUP BY tenant_id
ORDER BY count(*) FILTER (WHERE state IN ('queued', 'running')) DESC,
         coalesce(sum(input_tokens), 0) DESC, tenant_id
LIMIT %(limit)s

-- name: report_tier_latency :many
-- Enqueue-to-finish latency (seconds) of jobs enqueued since a time, per tier.
SELECT priority::text AS tier,
       count(*) AS jobs,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE state = 'failed') AS failed,
       percentile_cont(0.5) WITHIN GROUP (
           ORDER BY extract(epoch FROM finished_at - enqueued_at)) AS p50_seconds,
       percentile_cont(0.99) WITHIN GROUP (
           ORDER BY extract(epoch FROM finished_at - enqueued_at)) AS p99_seconds
FROM pgqueue.jobs
WHERE enqueued_at >= %(since)s
GROUP BY priority
ORDER BY priority

-- name: report_throttles_since :one
SELECT count(*) AS throttles,
       count(*) FILTER (WHERE status_code = 429) AS http_429,
       count(*) FILTER (WHERE status_code = 529) AS http_529
FROM pgqueue.throttle_events
WHERE occurred_at >= %(since)s

-- name: report_unfinished_since :one
SELECT count(*) AS unfinished
FROM pgqueue.jobs
WHERE enqueued_at >= %(since)s AND state IN ('queued', 'running')

-- name: db_now :one
SELECT now() AS now

-- name: report_demotions :many
-- Tenants demoted now: why, since when, and when it expires (seconds from now).
SELECT d.tenant_id, d.reason, d.demoted_at, d.expires_at,
       extract(epoch FROM d.expires_at - now())::double precision AS expires_in_seconds
FROM pgqueue.demotions d
WHERE d.expires_at > now()
ORDER BY d.expires_at DESC

-- name: report_throttles_by_tenant :many
-- Throttle events (429/529) per tenant in the last window_seconds.
SELECT e.tenant_id, count(*) AS throttles
FROM pgqueue.throttle_events e
WHERE e.occurred_at > now() - make_interval(secs => %(window_seconds)s)
GROUP BY e.tenant_id
ORDER BY throttles DESC, e.tenant_id

-- name: report_latency_slo :many
-- p50/p95/p99 of enqueue-to-finish latency per tier over a window, against the SLOs.
SELECT tier::text AS tier, finished, succeeded, failed, p50_seconds, p95_seconds,
       p99_seconds, slo_p99_seconds, meets_slo
FROM pgqueue.latency_slo_in(make_interval(secs => %(window_seconds)s))

-- name: report_fairness :many
SELECT tier::text AS tier, tenants, jain_weighted, jain_unweighted
FROM pgqueue.fairness_in(make_interval(secs => %(window_seconds)s))
ORDER BY tier NULLS FIRST

-- name: report_backpressure_jobs :many
-- Jobs enqueued since a time: when their (last) request was sent, tokens, throttle retries.
SELECT state::text AS state, extract(epoch FROM started_at)::double precision AS started_epoch,
       input_tokens, output_tokens, throttle_retries
FROM pgqueue.jobs
WHERE enqueued_at >= %(since)s
