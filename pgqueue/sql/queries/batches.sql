-- The batches lane (pgqueue.batches, docs/batches.md): jobs join a collecting batch, a worker
-- takes a due batch (seals it, submits it, polls it) and finishes its jobs from the results.

-- name: batch_collecting :one
-- A collecting batch with room for `n` more requests, locked until this transaction ends (a
-- taker skips it meanwhile); no row: open one with batch_open.
SELECT b.id
FROM pgqueue.batches b
WHERE b.state = 'collecting' AND b.requests + %(n)s <= %(max_requests)s
ORDER BY b.id
LIMIT 1
FOR UPDATE SKIP LOCKED

-- name: batch_open :one
INSERT INTO pgqueue.batches DEFAULT VALUES RETURNING id

-- name: batch_add_jobs :one
-- Links the claimed jobs (ids, tenants, lease tokens: arrays) still held under those leases to
-- the batch; returns the batch's request count.
WITH added AS (
    INSERT INTO pgqueue.batch_jobs (batch_id, job_id, tenant_id)
    SELECT %(batch_id)s, j.id, j.tenant_id
    FROM unnest(%(ids)s::bigint[], %(tenants)s::text[], %(tokens)s::uuid[]) AS k(id, tenant, token)
    JOIN pgqueue.jobs j ON j.id = k.id AND j.tenant_id = k.tenant
    WHERE j.state = 'running' AND j.lease_token = k.token
    RETURNING 1
)
UPDATE pgqueue.batches
SET requests = requests + (SELECT count(*) FROM added)
WHERE id = %(batch_id)s
RETURNING requests

-- name: batch_take :one
-- The next batch that needs a worker, moved a lease ahead (a dead worker's batch is taken
-- again when that runs out): a collecting batch once full or old (sealed here: state
-- submitting, submit_started_at = now, `fresh`), a submitting batch whose worker died, or a
-- submitted batch due for a poll.
WITH pick AS (
    SELECT b.id
    FROM pgqueue.batches b
    WHERE b.state <> 'ended' AND b.due_at <= now()
      AND (b.state <> 'collecting'
           OR (b.requests > 0
               AND (b.requests >= %(max_requests)s
                    OR b.created_at <= now() - make_interval(secs => %(max_age_seconds)s))))
    ORDER BY b.due_at, b.id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE pgqueue.batches b
SET due_at = now() + make_interval(secs => %(lease_seconds)s),
    worker_id = %(worker_id)s,
    state = CASE WHEN b.state = 'collecting' THEN 'submitting' ELSE b.state END,
    submit_started_at = CASE WHEN b.state = 'collecting' THEN now() ELSE b.submit_started_at END
FROM pick
WHERE b.id = pick.id
RETURNING b.id, b.state, b.provider_batch_id, b.submit_started_at,
          b.submit_started_at = now() AS fresh

-- name: batch_jobs_lease :exec
-- The batch's running jobs keep their leases while it is out (the poller renews them).
UPDATE pgqueue.jobs j
SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
FROM pgqueue.batch_jobs bj
WHERE bj.batch_id = %(batch_id)s AND j.id = bj.job_id AND j.tenant_id = bj.tenant_id
  AND j.state = 'running'

-- name: batch_requests :many
-- The batch's jobs, in id order, with their state and lease (custom_id = the job id).
SELECT j.id, j.tenant_id, j.payload, j.attempts, j.state::text AS state,
       j.lease_token::text AS lease_token
FROM pgqueue.batch_jobs bj
JOIN pgqueue.jobs j ON j.id = bj.job_id AND j.tenant_id = bj.tenant_id
WHERE bj.batch_id = %(batch_id)s
ORDER BY j.id

-- name: batch_submitted :exec
UPDATE pgqueue.batches
SET state = 'submitted', provider_batch_id = %(provider_batch_id)s, submitted_at = now(),
    due_at = now() + make_interval(secs => %(poll_seconds)s), last_error = NULL
WHERE id = %(id)s

-- name: batch_release :exec
-- Back to due in `poll_seconds` (the next poll, or the next try after an error).
UPDATE pgqueue.batches
SET due_at = now() + make_interval(secs => %(poll_seconds)s), worker_id = NULL,
    last_error = %(error)s
WHERE id = %(id)s

-- name: batch_known :many
-- Which of these provider batch ids (text[]) are already rows.
SELECT b.provider_batch_id FROM pgqueue.batches b
WHERE b.provider_batch_id = ANY (%(ids)s::text[])

-- name: batch_outcomes :exec
-- Each job's result type, {"<job id>": "succeeded" | "errored" | "expired" | "canceled"}.
UPDATE pgqueue.batch_jobs bj
SET outcome = %(outcomes)s::jsonb ->> bj.job_id::text
WHERE bj.batch_id = %(batch_id)s AND %(outcomes)s::jsonb ? bj.job_id::text

-- name: batch_end :exec
UPDATE pgqueue.batches
SET state = 'ended', ended_at = now(), worker_id = NULL, last_error = NULL,
    succeeded = %(succeeded)s, errored = %(errored)s, expired = %(expired)s,
    canceled = %(canceled)s, input_tokens = %(input_tokens)s, output_tokens = %(output_tokens)s
WHERE id = %(id)s

-- name: batch_lane_set :exec
-- Switch the lane on or off for a tenant ('' = every tenant without a row of its own).
INSERT INTO pgqueue.batch_lane (tenant_id, enabled) VALUES (%(tenant_id)s, %(enabled)s)
ON CONFLICT (tenant_id) DO UPDATE SET enabled = EXCLUDED.enabled, updated_at = now()

-- name: batch_totals :one
-- The lane's totals: batches, requests, results by type, tokens of succeeded requests.
SELECT count(*) AS batches, coalesce(sum(requests), 0) AS requests,
       coalesce(sum(succeeded), 0) AS succeeded, coalesce(sum(errored), 0) AS errored,
       coalesce(sum(expired), 0) AS expired, coalesce(sum(canceled), 0) AS canceled,
       coalesce(sum(input_tokens), 0) AS input_tokens,
       coalesce(sum(output_tokens), 0) AS output_tokens
FROM pgqueue.batches

-- name: batch_open_count :one
SELECT count(*) AS open FROM pgqueue.batches WHERE state <> 'ended'

-- name: batch_lane_list :many
SELECT tenant_id, enabled FROM pgqueue.batch_lane ORDER BY tenant_id

-- name: batch_list :many
-- The newest batches first.
SELECT id, state, provider_batch_id, requests, succeeded, errored, expired, canceled,
       submitted_at, ended_at
FROM pgqueue.batches
ORDER BY id DESC
LIMIT %(limit)s

-- name: batch_refused :exec
-- The provider refused the batch (nothing created): it ends with the error, no counts.
UPDATE pgqueue.batches
SET state = 'ended', ended_at = now(), worker_id = NULL, last_error = %(error)s
WHERE id = %(id)s

-- name: batch_lane_by_tenant :many
-- The lane per tenant (the view pgqueue.batch_lane_service), most tokens first.
SELECT tenant_id, requests, pending, succeeded, errored, expired, canceled, input_tokens,
       output_tokens
FROM pgqueue.batch_lane_service
ORDER BY input_tokens + output_tokens DESC, tenant_id
LIMIT %(limit)s
