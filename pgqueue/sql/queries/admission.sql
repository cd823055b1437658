-- Admission control: caps and policies per tier, the exact queued counters.

-- name: admission_set :exec
SELECT pgqueue.admission_set(%(tier)s, %(max_queued)s, %(tenant_max_queued)s, %(policy)s)

-- name: admission_status :many
-- Per tier: queued jobs (counters), caps, policy, jobs dropped by admission so far.
SELECT s.tier::text AS tier, s.queued, s.max_queued, s.tenant_max_queued, s.policy, s.dropped
FROM pgqueue.admission_status s

-- name: tenant_set_max_queued :execrows
-- A tenant's own cap of queued jobs per tier (NULL: the tier's tenant_max_queued).
UPDATE pgqueue.tenants
SET max_queued = %(max_queued)s, updated_at = now()
WHERE tenant_id = %(tenant_id)s

-- name: queue_counts_compact :one
-- Fold the counters' delta rows (skips rows another transaction is folding).
SELECT pgqueue.queue_counts_compact(NULL, NULL, %(max_rows)s) AS folded

-- name: queue_counts_by_key :many
-- The counters per (tier, tenant); tenant_id NULL is the tier's total.
SELECT c.tier::text AS tier, c.tenant_id, sum(c.queued)::bigint AS queued,
       sum(c.dropped)::bigint AS dropped
FROM pgqueue.queue_counts c
GROUP BY c.tier, c.tenant_id
ORDER BY c.tier, c.tenant_id NULLS FIRST

-- name: queue_counts_actual :many
-- The same numbers by count(*) over pgqueue.jobs (tests, repair checks; scans the queue).
SELECT j.priority::text AS tier, j.tenant_id, count(*)::bigint AS queued
FROM pgqueue.jobs j
WHERE j.state = 'queued'
GROUP BY GROUPING SETS ((j.priority, j.tenant_id), (j.priority))
ORDER BY 1, 2 NULLS FIRST

-- name: queue_counts_release_claims :one
-- Turn the claims' own counter rows (one per key, revision 0017: scheduler v1's claims wrote
-- them; v2's count through the update trigger) into ordinary rows, which
-- queue_counts_compact then folds (run it in a transaction of its own).
SELECT pgqueue.queue_counts_release_claims() AS released
