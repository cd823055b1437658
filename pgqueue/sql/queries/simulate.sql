-- `pgqueue simulate`: what the experiment reads from its own scenario database.

-- name: simulate_latencies :many
-- Enqueue-to-finish latency (database clock) of every job that finished.
SELECT j.kind, extract(epoch FROM j.finished_at - j.enqueued_at)::double precision
           AS latency_seconds
FROM pgqueue.jobs j
WHERE j.state = 'succeeded'

-- name: simulate_unfinished :many
-- Jobs admitted but not finished when the scenario ended, per kind.
SELECT j.kind, count(*) AS jobs
FROM pgqueue.jobs j
WHERE j.state IN ('queued', 'running')
GROUP BY j.kind

-- name: simulate_backlog :one
-- Queued jobs now, all tiers, from the admission counters (no scan of jobs).
SELECT coalesce(sum(c.queued), 0)::bigint AS queued
FROM pgqueue.queue_counts c
WHERE c.tenant_id IS NULL
