-- What the metrics exporter reads (one process per database exports these; see
-- pgqueue/observability/metrics.py).

-- name: metrics_queue_depth :many
SELECT tier::text AS tier, queued, running FROM pgqueue.queue_depth

-- name: metrics_throttles_by_tenant :many
-- 429/529 per tenant in the last 60 s (the article's rolling window).
SELECT e.tenant_id, count(*) AS throttles
FROM pgqueue.throttle_events e
WHERE e.occurred_at > now() - interval '60 seconds'
GROUP BY e.tenant_id

-- name: metrics_demoted_tenants :one
SELECT count(DISTINCT d.tenant_id) AS demoted
FROM pgqueue.demotions d
WHERE d.expires_at > now()

-- name: metrics_fairness :one
-- Jain's index over all tiers in the 5-minute window (weight-normalised); NULL: no data
-- (fewer than two tenants backlogged, or less than a DRR round served), never 1.0 for it.
SELECT f.jain_weighted, f.jain_unweighted
FROM (SELECT 1) one
LEFT JOIN pgqueue.fairness f ON f.window_name = '5m' AND f.tier IS NULL

-- name: metrics_input_tokens_by_tenant :many
-- Input tokens ever charged per tenant (the usage ledger).
SELECT u.tenant_id, sum(u.input_tokens)::bigint AS input_tokens
FROM pgqueue.usage_daily u
GROUP BY u.tenant_id

-- name: metrics_finished_since :many
-- Jobs finished after a cursor (finished_at, id), with their enqueue-to-finish latency.
-- Served jobs only, as pgqueue.latency_slo counts them: a cancelled job made no request, and
-- one cancelled after an hour in the queue is not an hour of request latency.
SELECT j.id, j.finished_at, j.priority::text AS tier,
       extract(epoch FROM j.finished_at - j.enqueued_at)::double precision AS latency_seconds
FROM pgqueue.jobs j
WHERE j.state IN ('succeeded', 'failed')
  AND j.finished_at <= now()
  AND (j.finished_at, j.id) > (%(after_time)s, %(after_id)s)
ORDER BY j.finished_at, j.id
LIMIT %(limit)s
