-- Statements of `pgqueue demo` (pgqueue/demo_compare.py), read in the demo's own databases.

-- name: demo_jobs :many
-- Every job with its times (epoch seconds), tier, cost, state and 429/529 retries.
SELECT id, tenant_id, origin::text AS origin, priority::text AS tier, state::text AS state,
       cost::double precision AS cost,
       extract(epoch FROM enqueued_at)::double precision AS enqueued,
       extract(epoch FROM started_at)::double precision AS started,
       extract(epoch FROM finished_at)::double precision AS finished,
       throttle_retries
FROM pgqueue.jobs
ORDER BY id

-- name: demo_progress :one
-- Jobs in all, jobs finished, and the database clock (epoch seconds).
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE state NOT IN ('queued', 'running')) AS finished,
       extract(epoch FROM now())::double precision AS now
FROM pgqueue.jobs

-- name: demo_job_state :one
SELECT state::text AS state FROM pgqueue.jobs WHERE id = %(id)s
