-- The claim path and every guarded state transition of a job.

-- name: job_claim :many
-- Scheduler v2 (docs/drr.md): per lane (rate-limit pool: the model, else the kind), the tier
-- (pgqueue.tier_policy), then the jobs of that lane and tier in their DRR key order, taken
-- with FOR UPDATE SKIP LOCKED: claimers run side by side, with no scheduler lock between
-- them (a rate-limited model's bucket row is the one row they share). Only due, queued jobs
-- of kinds not in `skip_kinds` (this worker cannot run them), and only those the provider's
-- limits let through now (pgqueue.claim_admitted's claim, called here without that SQL
-- function, which Postgres 15 plans again at every call and whose rows it copies once more:
-- 1 to 4 percent of a claim and completion's instructions); a lane in cooldown or out of
-- tokens holds back no other lane. When the limiter stopped a lane and fewer than `limit` were claimed, a
-- last row with a NULL id carries blocked_seconds. `durable`: the claim's commit waits for
-- its WAL flush (else the worker runs job_claim_durable before the handlers start).
-- `to_batch`: the job goes to the batches lane (pgqueue.batches.lane parks it) instead of
-- running here (asked only of batch-tier Messages API jobs: the call cost a claim of 10
-- other jobs 0.2 ms).
SELECT (c.job).id, (c.job).tenant_id, (c.job).kind, (c.job).priority, (c.job).payload,
       (c.job).cost, (c.job).attempts, (c.job).max_attempts, (c.job).throttle_retries,
       (c.job).enqueued_at, (c.job).lease_token::text AS lease_token, (c.job).model,
       (c.job).est_input_tokens, c.blocked_seconds,
       (c.job).priority = 'batch' AND (c.job).kind = 'anthropic.messages'
       AND pgqueue.batch_lane_takes((c.job).id, (c.job).tenant_id, (c.job).priority,
                                    (c.job).kind) AS to_batch,
       -- read after the claim ran (its rows are materialized first): whether its commit
       -- waits for the WAL flush (a claim that took from a model's buckets does not)
       current_setting('synchronous_commit') <> 'off' AS durable
FROM pgqueue.claim_lanes(%(limit)s, %(worker_id)s, %(lease_seconds)s, true, %(skip_kinds)s) AS c

-- name: job_claim_durable :execrows
-- Makes the claims this worker received durable before their handlers start, when the claim
-- committed without waiting for its WAL flush (a claim that took from a model's buckets,
-- pgqueue.claim_lanes: its row locks, the bucket's among them, are released sooner): a crash
-- of Postgres could lose a claim already handed out, and its jobs ran again with their
-- attempt not counted (found by a fault run: 4 jobs ran twice, attempts 1). This statement rewrites one claimed row as it is (fenced by
-- its lease) and commits with synchronous_commit on: a commit that wrote WAL waits for the
-- flush past its own commit record, so past the claim's too (WAL is one sequence). (A commit
-- that wrote nothing, such as txid_current()'s, does not wait.) The wait holds none of the
-- claim's locks, and concurrent flushes are grouped.
UPDATE pgqueue.jobs
SET lease_expires_at = lease_expires_at
WHERE id = %(id)s AND tenant_id = %(tenant_id)s
  AND state = 'running' AND lease_token = %(lease_token)s::uuid
  AND (SELECT pg_catalog.set_config('synchronous_commit', 'on', true)) IS NOT NULL

-- name: job_complete :execrows
-- Fenced: only the lease holder of a running job can record its success.
UPDATE pgqueue.jobs
SET state = 'succeeded',
    finished_at = now(),
    result = %(result)s,
    input_tokens = %(input_tokens)s,
    output_tokens = %(output_tokens)s,
    last_error = NULL,
    lease_expires_at = NULL
WHERE id = %(id)s AND tenant_id = %(tenant_id)s
  AND state = 'running' AND lease_token = %(lease_token)s::uuid

-- name: job_complete_many :many
-- Fenced, batched: the successes of many jobs in one statement; returns the leases recorded
-- (id, lease token).
-- The batch is ONE jsonb object,
-- {"<id>": [tenant_id, lease_token, result, input_tokens, output_tokens], ...}
-- (pgqueue.worker.completer.success_batch): building six typed arrays instead cost the worker
-- ~6 us per job, this ~1. Each row reads its own entry by key (a binary search in the
-- object), and the rows are found by `id = ANY (ids)`, a scan of jobs_pkey. Joined to the
-- batch instead, a young or small table got a hash join over every job whose
-- jobs_running_lease_idx entry says running, dead entries included (nothing vacuums between
-- claims): after a few thousand jobs each completion read thousands of them. `state::text`
-- keeps the planner off that partial index. A row another transaction holds is skipped, not
-- waited for: the worker writes it on its own (job_complete), so one row held by a user's
-- open transaction (a cancel not yet committed) does not stop the whole batch, and the
-- worker's other completions with it (found by a tester: a cancel held open for 10 s stopped
-- a worker for every tenant). A missing id either lost its lease or was held: the completer
-- tells them apart by writing it alone. A row changed after this statement's snapshot is
-- locked at its newest version and checked again: a heartbeat of the same lease still
-- records the success, a rescue and a new claim (another lease token) does not.
WITH held AS (  -- locked by this statement: their TIDs cannot change before the update
    SELECT j.ctid AS row_id
    FROM pgqueue.jobs j
    WHERE j.id = ANY (ARRAY(SELECT k::bigint FROM jsonb_object_keys(%(batch)s::jsonb) AS k))
      AND j.state::text = 'running'
      AND j.tenant_id = %(batch)s::jsonb -> j.id::text ->> 0
      AND j.lease_token = (%(batch)s::jsonb -> j.id::text ->> 1)::uuid
    FOR UPDATE SKIP LOCKED
)
UPDATE pgqueue.jobs j
SET state = 'succeeded',
    finished_at = now(),
    result = nullif(%(batch)s::jsonb -> j.id::text -> 2, 'null'::jsonb),
    input_tokens = (%(batch)s::jsonb -> j.id::text ->> 3)::integer,
    output_tokens = (%(batch)s::jsonb -> j.id::text ->> 4)::integer,
    last_error = NULL,
    lease_expires_at = NULL
WHERE j.ctid = ANY (ARRAY(SELECT held.row_id FROM held))
RETURNING j.id, j.lease_token::text AS lease_token

-- name: job_retry :one
-- Fenced. Back to the queue after a delay, or failed once attempts are spent or the error is
-- permanent. Returns the new state (no row: the lease was lost).
UPDATE pgqueue.jobs
SET state = CASE WHEN %(permanent)s OR attempts >= max_attempts
                 THEN 'failed'::pgqueue.job_state ELSE 'queued'::pgqueue.job_state END,
    finished_at = CASE WHEN %(permanent)s OR attempts >= max_attempts THEN now() END,
    run_at = CASE WHEN %(permanent)s OR attempts >= max_attempts THEN run_at
                  ELSE now() + make_interval(secs => %(delay_seconds)s) END,
    last_error = %(error)s,
    worker_id = NULL,
    lease_token = NULL,
    lease_expires_at = NULL
WHERE id = %(id)s AND tenant_id = %(tenant_id)s
  AND state = 'running' AND lease_token = %(lease_token)s::uuid
RETURNING state::text AS state

-- name: job_throttle :one
-- Fenced. The provider said 429/529: reschedule at now() + wait (database clock) without
-- consuming a failure attempt, count the throttle retry, record a throttle event for the
-- tenant; when the wait would end more than max_throttle_wait_seconds after the job's enqueue
-- (NULL: never), the job fails with the reason kept.
WITH moved AS (
    UPDATE pgqueue.jobs
    SET state = CASE WHEN now() + make_interval(secs => %(wait_seconds)s)
                          > enqueued_at + make_interval(secs => %(max_throttle_wait_seconds)s)
                     THEN 'failed'::pgqueue.job_state ELSE 'queued'::pgqueue.job_state END,
        finished_at = CASE WHEN now() + make_interval(secs => %(wait_seconds)s)
                               > enqueued_at
                                 + make_interval(secs => %(max_throttle_wait_seconds)s)
                           THEN now() END,
        run_at = now() + make_interval(secs => %(wait_seconds)s),
        attempts = greatest(attempts - 1, 0),
        throttle_retries = throttle_retries + 1,
        last_error = %(error)s,
        worker_id = NULL,
        lease_token = NULL,
        lease_expires_at = NULL
    WHERE id = %(id)s AND tenant_id = %(tenant_id)s
      AND state = 'running' AND lease_token = %(lease_token)s::uuid
    RETURNING id, tenant_id, model, state
), recorded AS (
    INSERT INTO pgqueue.throttle_events (tenant_id, job_id, model, status_code,
                                         retry_after_seconds)
    SELECT moved.tenant_id, moved.id, moved.model, %(status_code)s, %(retry_after_seconds)s
    FROM moved
)
SELECT state::text AS state FROM moved

-- name: job_interrupt :execrows
-- Fenced. The worker stopped before the job finished (shutdown), or cannot run it (no API
-- key, no handler for its kind): back to the queue after delay_seconds, the attempt not
-- counted.
UPDATE pgqueue.jobs
SET state = 'queued',
    attempts = greatest(attempts - 1, 0),
    run_at = now() + make_interval(secs => %(delay_seconds)s),
    last_error = %(error)s,
    worker_id = NULL,
    lease_token = NULL,
    lease_expires_at = NULL
WHERE id = %(id)s AND tenant_id = %(tenant_id)s
  AND state = 'running' AND lease_token = %(lease_token)s::uuid

-- name: job_heartbeat :many
-- Extends the leases this worker still holds; returns the id and lease token of each lease it
-- still holds (the worker keys its jobs by both: a job rescued and claimed again by the same
-- worker runs there twice, under two leases).
-- The leases are ONE jsonb object {"<id>": [tenant_id, lease_token], ...}
-- (pgqueue.worker.leases.held_leases), the rows found by `id = ANY (ids)` on jobs_pkey,
-- as in job_complete_many: joined to arrays of leases, the update was planned as a scan of
-- every entry of jobs_running_lease_idx, dead ones included. A row another transaction has
-- locked is skipped, not waited for (it is being completed or retried, or the next heartbeat
-- extends it): waiting, a heartbeat and a batched completion could lock the same rows in
-- opposite orders and deadlock.
WITH held AS (  -- locked by this statement: their TIDs cannot change before the update
    SELECT j.ctid AS row_id
    FROM pgqueue.jobs j
    WHERE j.id = ANY (ARRAY(SELECT k::bigint FROM jsonb_object_keys(%(held)s::jsonb) AS k))
      AND j.state::text = 'running'
      AND j.tenant_id = %(held)s::jsonb -> j.id::text ->> 0
      AND j.lease_token = (%(held)s::jsonb -> j.id::text ->> 1)::uuid
    FOR UPDATE SKIP LOCKED
)
UPDATE pgqueue.jobs j
SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
WHERE j.ctid = ANY (ARRAY(SELECT held.row_id FROM held))
RETURNING j.id, j.lease_token::text AS lease_token

-- name: job_rescue :many
-- Jobs whose lease expired (their worker died) go back to the queue, or fail once their
-- attempts are spent, so a poison job cannot loop forever. One rescuer at a time: the row
-- 'rescue' of pgqueue.leader_locks, locked to the end of the transaction, lets the other
-- workers' rescuers skip this round (not an advisory lock, which any role may hold).
WITH leader AS (
    SELECT l.name FROM pgqueue.leader_locks l WHERE l.name = 'rescue' FOR UPDATE SKIP LOCKED
), expired AS (
    SELECT j.id, j.tenant_id
    FROM pgqueue.jobs j, leader
    WHERE j.state = 'running' AND j.lease_expires_at < now()
      AND NOT EXISTS (  -- a job in an open batch belongs to the batch's poller
          SELECT 1 FROM pgqueue.batch_jobs bj JOIN pgqueue.batches b ON b.id = bj.batch_id
          WHERE bj.job_id = j.id AND bj.tenant_id = j.tenant_id AND b.state <> 'ended')
    ORDER BY j.lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE pgqueue.jobs j
SET state = CASE WHEN j.attempts >= j.max_attempts
                 THEN 'failed'::pgqueue.job_state ELSE 'queued'::pgqueue.job_state END,
    finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
    run_at = now(),
    last_error = 'lease expired (worker lost)',
    worker_id = NULL,
    lease_token = NULL,
    lease_expires_at = NULL
FROM expired
WHERE j.id = expired.id AND j.tenant_id = expired.tenant_id
RETURNING j.id, j.state::text AS state

-- name: job_next_due :one
-- Seconds (database clock) until the earliest queued job is due; NULL when nothing is queued.
-- Jobs of the kinds in `skip_kinds` (text[]) do not count: a burst worker leaves the kinds it
-- cannot run (no handler, no API key) to other workers instead of waiting for them forever.
-- The unstamped jobs by jobs_queued_run_at_idx; a stamped job is due already (0 or less), and
-- those count by each lane and tier's head (pgqueue.lane_tiers_stamped, a skip scan of
-- jobs_claim_idx; the claim skips kinds by the head too): no index holds every queued job by
-- run_at, as the stamp would write an entry in it (revision 0060).
SELECT extract(epoch FROM least(
           (SELECT min(j.run_at) FROM pgqueue.jobs j
            WHERE j.state = 'queued' AND j.key_round IS NULL
              AND j.kind <> ALL (%(skip_kinds)s::text[])),
           (SELECT min(j.run_at) FROM pgqueue.lane_tiers_stamped() h
            JOIN pgqueue.jobs j ON j.id = h.id
            WHERE h.kind <> ALL (%(skip_kinds)s::text[]))) - now())::double precision AS seconds

-- name: job_leases_elsewhere :one
-- The running jobs under leases other than `worker_id`'s (text), of kinds not in `skip_kinds`
-- (text[]), and the seconds (database clock) until the earliest of those leases ends (NULL:
-- none): a dead worker's jobs come back to the queue when their leases end, and an idle burst
-- worker waits for that as for a job due then (found by a tester: it exited with them still
-- running). A scan of jobs_running_lease_idx (the running jobs), only when a burst worker has
-- nothing else to run.
SELECT count(*) AS jobs,
       extract(epoch FROM min(j.lease_expires_at) - now())::double precision AS seconds
FROM pgqueue.jobs j
WHERE j.state = 'running' AND j.worker_id IS DISTINCT FROM %(worker_id)s
  AND j.kind <> ALL (%(skip_kinds)s::text[])

-- name: job_queued_kinds :many
-- Which of these kinds (text[]) still have queued jobs, and how many: what a burst worker that
-- cannot run them leaves behind, said once at its exit. A scan of the queued jobs' index, at
-- exit only.
SELECT j.kind, count(*) AS jobs
FROM pgqueue.jobs j
WHERE j.state = 'queued' AND j.kind = ANY (%(kinds)s::text[])
GROUP BY j.kind
ORDER BY j.kind

-- name: job_due_kinds_besides :many
-- The kinds of the queued jobs due within `horizon_seconds` that are not in `kinds` (text[]):
-- those an idle burst worker has no handler for, learned before it would wait for them (found
-- by a tester: it waited 60 s for a job put back for want of a handler, then put it back
-- again). A range scan of jobs_queued_run_at_idx (the unstamped jobs), and the kinds of the
-- lanes' heads for the stamped ones (pgqueue.lane_tiers_stamped, as the claim skips kinds;
-- revision 0060), only when the worker has nothing to run.
SELECT k.kind
FROM (SELECT DISTINCT j.kind
      FROM pgqueue.jobs j
      WHERE j.state = 'queued' AND j.key_round IS NULL
        AND j.run_at <= now() + make_interval(secs => %(horizon_seconds)s)
        AND j.kind <> ALL (%(kinds)s::text[])) k
UNION
SELECT h.kind
FROM pgqueue.lane_tiers_stamped() h
WHERE h.kind <> ALL (%(kinds)s::text[])
ORDER BY 1

-- name: job_requeue_failed :many
-- `pgqueue retry`: failed jobs matching every given filter go back to the queue with fresh
-- counters (pgqueue.retry_failed_outcomes, revision 0070; `reason` is a literal substring of
-- last_error, any case); last_error is kept until the next attempt overwrites it. One row per
-- job matched, by id: requeued, or not when a live job holds its dedupe key (held_by).
SELECT r.id, r.requeued, r.dedupe_key, r.held_by
FROM pgqueue.retry_failed_outcomes(%(tenant_id)s, %(tier)s::pgqueue.tier, %(reason)s,
                                   %(since)s, %(until)s) AS r
ORDER BY r.id

-- name: job_prune :one
-- Retention: delete up to `limit` finished jobs (succeeded, failed, cancelled) that finished
-- before now() - older_than_seconds; one pruner at a time (the row 'prune' of
-- pgqueue.leader_locks, as job_rescue). Returns how many.
WITH leader AS (
    SELECT l.name FROM pgqueue.leader_locks l WHERE l.name = 'prune' FOR UPDATE SKIP LOCKED
), doomed AS (
    SELECT j.id, j.tenant_id
    FROM pgqueue.jobs j, leader
    WHERE j.state IN ('succeeded', 'failed', 'cancelled')
      AND j.finished_at < now() - make_interval(secs => %(older_than_seconds)s)
    ORDER BY j.finished_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
), gone AS (
    DELETE FROM pgqueue.jobs j USING doomed
    WHERE j.id = doomed.id AND j.tenant_id = doomed.tenant_id
    RETURNING 1
)
SELECT count(*) AS deleted FROM gone

-- name: job_cancel :one
-- Cancel one queued or running job (pgqueue.cancel, revision 0024): its state after the call,
-- 'cancelled', or the state it had already finished in. PQ011 when there is no such job.
SELECT pgqueue.cancel(%(job_id)s, %(tenant_id)s, %(reason)s) AS state

-- name: job_cancel_queued :one
-- Cancel every queued job of a tenant (of one tier, when given): how many (pgqueue.cancel_queued,
-- revision 0024). Running jobs are left alone.
SELECT pgqueue.cancel_queued(%(tenant_id)s, %(tier)s::pgqueue.tier, %(reason)s) AS cancelled

-- name: job_lease_states :many
-- The committed state and lease token of these jobs (no lock, no wait): for the worker's
-- heartbeat, which could not extend their leases (cancelled? merely locked by another
-- transaction? or really lost), and for an outcome write that found no row (cancelled, or a
-- lost lease). One probe of jobs_pkey per id.
SELECT j.id, j.tenant_id, j.state::text AS state, j.lease_token::text AS lease_token
FROM pgqueue.jobs j
WHERE j.id = ANY (%(ids)s::bigint[])

-- name: session_lock_timeout :exec
-- For the rest of this transaction: give up waiting for a lock after `ms` milliseconds
-- (SQLSTATE 55P03). An outcome write of its own runs under it, so that a row another
-- transaction holds does not keep the worker's connection (pgqueue.worker.completer).
SELECT set_config('lock_timeout', %(ms)s::text, true)

-- name: settings_check :many
-- Every pgqueue.* setting this session sees, checked (PQ012 for a malformed one).
SELECT pgqueue.settings_check() AS checked
