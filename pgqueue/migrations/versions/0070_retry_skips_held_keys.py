"""A bulk retry skips the failed jobs whose dedupe key a live job holds; a single retry of such a
job raises PQ013 (found by a tester).

Before, ``pgqueue.retry_failed`` was one UPDATE: a failed job whose dedupe key a queued or
running job of its tenant held (``jobs_dedupe_live_idx`` lets one live job hold a key) failed
the whole statement with a unique violation, and nothing was re-queued, not even unrelated
jobs; two failed jobs sharing a key did the same. ``pgqueue.retry`` raised the same raw
unique violation. Now (080_completion_and_cancel.sql):

- ``pgqueue.dedupe_holder(tenant, key)``: the live job holding a key;
- ``pgqueue.requeue_job(id, tenant)``: re-queues one locked job unless a live job holds its
  key, catching (in a subtransaction) the unique violation of a holder enqueued or re-queued
  concurrently;
- ``pgqueue.retry`` raises PQ013 (``pgqueue.errors.DedupeKeyHeld``) naming the job, the key
  and the live job, with them as JSON in DETAIL;
- ``pgqueue.retry_failed_outcomes`` (new) re-queues in bulk and returns one row per matching
  job, ``(id, requeued, dedupe_key, held_by)``: a job whose key a live job holds is skipped,
  and of failed jobs sharing a key the newest is re-queued. The usual case is one statement
  for the jobs with a dedupe key (one for those without); when a concurrent enqueue or retry
  takes one of the keys meanwhile, that statement runs again (up to three times), then one
  job at a time;
- ``pgqueue.retry_failed`` keeps its arguments and its result (the ids re-queued): it calls
  ``retry_failed_outcomes``.

The texts are the schema file's; the downgrade puts the old texts back.

Revision ID: 0070
Revises: 0069
"""

from __future__ import annotations

from alembic import op

revision = "0070"
down_revision = "0069"
branch_labels = None
depends_on = None

FUNCTIONS = r"""-- The live (queued or running) job of a tenant that holds a dedupe key, as this statement
-- sees the jobs; NULL for none, or for a NULL key. jobs_dedupe_live_idx lets one live job hold
-- a key. pgqueue.requeue_job, pgqueue.retry_failed_outcomes.
CREATE OR REPLACE FUNCTION pgqueue.dedupe_holder(p_tenant text, p_key text)
RETURNS bigint
LANGUAGE sql STABLE
AS $$
    SELECT l.id FROM pgqueue.jobs l
    WHERE l.tenant_id = p_tenant AND l.dedupe_key = p_key AND l.state IN ('queued', 'running')
$$;

-- Put one failed or cancelled job, which the caller holds locked, back in the queue with fresh
-- attempt and throttle counters, due now; last_error is kept until the next attempt overwrites
-- it. Unless a live job of its tenant holds its dedupe key: then requeued is false and held_by
-- that job's id (NULL when this statement cannot see it: committed after the snapshot of a
-- REPEATABLE READ transaction). A holder enqueued or re-queued concurrently makes the UPDATE
-- wait for it and fail with a unique violation once it commits; that is caught here (a
-- subtransaction), never raised. The counters (queue_counts) and the DRR bookkeeping follow
-- through the jobs triggers. pgqueue.retry, pgqueue.retry_failed_outcomes (revision 0070).
CREATE OR REPLACE FUNCTION pgqueue.requeue_job(p_id bigint, p_tenant text,
                                               OUT requeued boolean, OUT held_by bigint)
LANGUAGE plpgsql
AS $$
DECLARE
    key text;
    violated text;
BEGIN
    SELECT j.dedupe_key INTO key FROM pgqueue.jobs j WHERE j.id = p_id AND j.tenant_id = p_tenant;
    held_by := pgqueue.dedupe_holder(p_tenant, key);
    requeued := held_by IS NULL;
    IF NOT requeued THEN
        RETURN;
    END IF;
    BEGIN
        UPDATE pgqueue.jobs j
        SET state = 'queued', attempts = 0, throttle_retries = 0, run_at = now(),
            finished_at = NULL
        WHERE j.id = p_id AND j.tenant_id = p_tenant;
    EXCEPTION WHEN unique_violation THEN
        GET STACKED DIAGNOSTICS violated = CONSTRAINT_NAME;
        IF violated IS DISTINCT FROM 'jobs_dedupe_live_idx' THEN
            RAISE;
        END IF;
        held_by := pgqueue.dedupe_holder(p_tenant, key);  -- a new snapshot: committed now
        requeued := false;
    END;
END
$$;

-- Retry one failed or cancelled job (the dashboard's "retry"; revision 0034).
CREATE OR REPLACE FUNCTION pgqueue.retry(job_id bigint, tenant_id text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
-- Put one failed or cancelled job back in the queue with fresh attempt and throttle counters,
-- due now (pgqueue.requeue_job); returns its state after the call: 'queued', or its state
-- unchanged when it was not failed or cancelled. last_error is kept until the next attempt
-- overwrites it (as pgqueue.retry_failed does). With `tenant_id`, only that tenant's job.
-- Raises PQ011 when there is no such job, PQ009 for a NULL job_id, and PQ013 when a live
-- (queued or running) job of its tenant holds its dedupe key (revision 0070: before, the raw
-- unique violation of jobs_dedupe_live_idx): the message names the job, the key and the live
-- job, DETAIL holds them as JSON (job_id, tenant_id, dedupe_key, held_by; held_by NULL when
-- that job committed after this transaction's snapshot).
DECLARE
    found_state pgqueue.job_state;
    found_tenant text;
    found_key text;
    outcome record;
BEGIN
    IF retry.job_id IS NULL THEN
        RAISE EXCEPTION 'job_id must not be NULL' USING ERRCODE = 'PQ009';
    END IF;
    SELECT j.state, j.tenant_id, j.dedupe_key INTO found_state, found_tenant, found_key
    FROM pgqueue.jobs j
    WHERE j.id = retry.job_id
      AND (retry.tenant_id IS NULL OR j.tenant_id = retry.tenant_id)
    FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PQ011', MESSAGE = format(
            'no job %s%s', retry.job_id,
            CASE WHEN retry.tenant_id IS NULL THEN ''
                 ELSE format(' of tenant %s', quote_literal(retry.tenant_id)) END);
    END IF;
    IF found_state NOT IN ('failed', 'cancelled') THEN
        RETURN found_state::text;
    END IF;
    SELECT * INTO outcome FROM pgqueue.requeue_job(retry.job_id, found_tenant);
    IF NOT outcome.requeued THEN
        RAISE EXCEPTION USING ERRCODE = 'PQ013', MESSAGE = format(
            'job %s not retried: its dedupe key %s (tenant %s) is held by %s', retry.job_id,
            quote_literal(found_key), quote_literal(found_tenant),
            coalesce('live job ' || outcome.held_by, 'a live job committed meanwhile')),
            DETAIL = json_build_object('job_id', retry.job_id, 'tenant_id', found_tenant,
                                       'dedupe_key', found_key,
                                       'held_by', outcome.held_by)::text,
            HINT = 'retry it once that job has finished, or cancel that job first';
    END IF;
    RETURN 'queued';
END
$$;

-- Re-queue failed jobs in bulk, job by job (`pgqueue retry`, the dashboard's "re-queue a
-- tenant's failed jobs"; revision 0070).
CREATE OR REPLACE FUNCTION pgqueue.retry_failed_outcomes(tenant_id text DEFAULT NULL,
                                                         tier pgqueue.tier DEFAULT NULL,
                                                         reason text DEFAULT NULL,
                                                         since timestamptz DEFAULT NULL,
                                                         until timestamptz DEFAULT NULL)
RETURNS TABLE(id bigint, requeued boolean, dedupe_key text, held_by bigint)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
-- Re-queue the failed jobs that match every filter given (NULL: any) with fresh attempt and
-- throttle counters, due now; returns one row per job that matched: requeued true, or false
-- when a live (queued or running) job of its tenant holds its dedupe key, held_by that job
-- (NULL when this transaction cannot see it). Of failed jobs sharing a key, the newest (the
-- highest id) is re-queued and holds it. `reason` is a substring of last_error, matched
-- literally and case-insensitively; since/until bound finished_at (until excluded).
-- last_error is kept until the next attempt overwrites it.
DECLARE
    picked bigint[];
    ids bigint[];
    ok boolean[];
    keys text[];
    holders bigint[];
    job record;
    outcome record;
    attempt integer;
BEGIN
    -- The matching jobs, locked in id order: a concurrent retry of the same jobs waits here,
    -- then finds the ones it re-queued no longer failed.
    picked := ARRAY(
        SELECT j.id FROM pgqueue.jobs j
        WHERE j.state = 'failed'
          AND (retry_failed_outcomes.tenant_id IS NULL
               OR j.tenant_id = retry_failed_outcomes.tenant_id)
          AND (retry_failed_outcomes.tier IS NULL OR j.priority = retry_failed_outcomes.tier)
          AND (retry_failed_outcomes.reason IS NULL
               OR strpos(lower(j.last_error), lower(retry_failed_outcomes.reason)) > 0)
          AND (retry_failed_outcomes.since IS NULL
               OR j.finished_at >= retry_failed_outcomes.since)
          AND (retry_failed_outcomes.until IS NULL
               OR j.finished_at < retry_failed_outcomes.until)
        ORDER BY j.id
        FOR UPDATE OF j);
    -- Jobs without a dedupe key: nothing can hold theirs.
    RETURN QUERY
    WITH updated AS (
        UPDATE pgqueue.jobs j
        SET state = 'queued', attempts = 0, throttle_retries = 0, run_at = now(),
            finished_at = NULL
        WHERE j.id = ANY (picked) AND j.dedupe_key IS NULL
        RETURNING j.id
    )
    SELECT u.id, true, NULL::text, NULL::bigint FROM updated u;
    -- Jobs with one, in one statement: those whose key a live job holds, or a newer failed
    -- job of the same key, are left failed. A live job that takes one of these keys after the
    -- statement's snapshot (an enqueue or a retry, concurrent) makes it fail with a unique
    -- violation: it runs again, with a new snapshot that sees that job (READ COMMITTED).
    FOR attempt IN 1 .. 3 LOOP
        BEGIN
            WITH judged AS (
                SELECT j.id, j.tenant_id, j.dedupe_key,
                       coalesce(pgqueue.dedupe_holder(j.tenant_id, j.dedupe_key),
                                nullif(max(j.id) OVER (PARTITION BY j.tenant_id, j.dedupe_key),
                                       j.id)) AS holder
                FROM pgqueue.jobs j
                WHERE j.id = ANY (picked) AND j.dedupe_key IS NOT NULL
            ), updated AS (
                UPDATE pgqueue.jobs j
                SET state = 'queued', attempts = 0, throttle_retries = 0, run_at = now(),
                    finished_at = NULL
                FROM judged g
                WHERE j.id = g.id AND j.tenant_id = g.tenant_id AND g.holder IS NULL
                RETURNING j.id
            )
            SELECT array_agg(g.id), array_agg(u.id IS NOT NULL), array_agg(g.dedupe_key),
                   array_agg(g.holder)
            INTO ids, ok, keys, holders
            FROM judged g LEFT JOIN updated u ON u.id = g.id;
            RETURN QUERY SELECT * FROM unnest(ids, ok, keys, holders);
            RETURN;
        EXCEPTION WHEN unique_violation THEN
            NULL;
        END;
    END LOOP;
    -- Still failing (a REPEATABLE READ snapshot never sees that job, or the races went on):
    -- one job at a time, newest first (pgqueue.requeue_job). Slower: each UPDATE runs the
    -- jobs triggers, which write the same counter rows again (about 3 ms a job at 10,000).
    FOR job IN
        SELECT j.id, j.tenant_id, j.dedupe_key FROM pgqueue.jobs j
        WHERE j.id = ANY (picked) AND j.dedupe_key IS NOT NULL
        ORDER BY j.id DESC
    LOOP
        SELECT * INTO outcome FROM pgqueue.requeue_job(job.id, job.tenant_id);
        id := job.id;
        requeued := outcome.requeued;
        dedupe_key := job.dedupe_key;
        held_by := outcome.held_by;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Re-queue failed jobs in bulk (revision 0034): pgqueue.retry_failed_outcomes, returning the
-- ids re-queued only.
CREATE OR REPLACE FUNCTION pgqueue.retry_failed(tenant_id text DEFAULT NULL,
                                                tier pgqueue.tier DEFAULT NULL,
                                                reason text DEFAULT NULL,
                                                since timestamptz DEFAULT NULL,
                                                until timestamptz DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE sql
AS $$
-- The ids of the failed jobs re-queued by pgqueue.retry_failed_outcomes (same filters), which
-- skips a job whose dedupe key a live job holds (revision 0070: before, such a job failed the
-- whole call with a unique violation of jobs_dedupe_live_idx, and nothing was re-queued).
    SELECT r.id
    FROM pgqueue.retry_failed_outcomes(retry_failed.tenant_id, retry_failed.tier,
                                       retry_failed.reason, retry_failed.since,
                                       retry_failed.until) AS r
    WHERE r.requeued
$$;
"""

FUNCTIONS_BEFORE = r"""-- Retry one failed or cancelled job (the dashboard's "retry"; revision 0034).
CREATE OR REPLACE FUNCTION pgqueue.retry(job_id bigint, tenant_id text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
-- Put one failed or cancelled job back in the queue with fresh attempt and throttle counters,
-- due now; returns its state after the call: 'queued', or its state unchanged when it was
-- not failed or cancelled. last_error is kept until the next attempt overwrites it (as
-- pgqueue.retry_failed does). With `tenant_id`, only that tenant's job. The counters
-- (queue_counts) and the DRR bookkeeping follow through the jobs triggers.
-- Raises PQ011 when there is no such job, PQ009 for a NULL job_id.
DECLARE
    found_state pgqueue.job_state;
    found_tenant text;
BEGIN
    IF retry.job_id IS NULL THEN
        RAISE EXCEPTION 'job_id must not be NULL' USING ERRCODE = 'PQ009';
    END IF;
    SELECT j.state, j.tenant_id INTO found_state, found_tenant
    FROM pgqueue.jobs j
    WHERE j.id = retry.job_id
      AND (retry.tenant_id IS NULL OR j.tenant_id = retry.tenant_id)
    FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PQ011', MESSAGE = format(
            'no job %s%s', retry.job_id,
            CASE WHEN retry.tenant_id IS NULL THEN ''
                 ELSE format(' of tenant %s', quote_literal(retry.tenant_id)) END);
    END IF;
    IF found_state NOT IN ('failed', 'cancelled') THEN
        RETURN found_state::text;
    END IF;
    UPDATE pgqueue.jobs j
    SET state = 'queued', attempts = 0, throttle_retries = 0, run_at = now(), finished_at = NULL
    WHERE j.id = retry.job_id AND j.tenant_id = found_tenant;
    RETURN 'queued';
END
$$;

-- Re-queue failed jobs in bulk (`pgqueue retry`, the dashboard's "re-queue a tenant's failed
-- jobs"; revision 0034).
CREATE OR REPLACE FUNCTION pgqueue.retry_failed(tenant_id text DEFAULT NULL,
                                                tier pgqueue.tier DEFAULT NULL,
                                                reason text DEFAULT NULL,
                                                since timestamptz DEFAULT NULL,
                                                until timestamptz DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE sql
AS $$
-- Re-queue the failed jobs that match every filter given (NULL: any) with fresh attempt and
-- throttle counters, due now; returns their ids. `reason` is a substring of last_error,
-- matched literally and case-insensitively; since/until bound finished_at (until excluded).
-- last_error is kept until the next attempt overwrites it. `pgqueue retry`, and the
-- dashboard's "re-queue a tenant's failed jobs".
    UPDATE pgqueue.jobs j
    SET state = 'queued', attempts = 0, throttle_retries = 0, run_at = now(), finished_at = NULL
    WHERE j.state = 'failed'
      AND (retry_failed.tenant_id IS NULL OR j.tenant_id = retry_failed.tenant_id)
      AND (retry_failed.tier IS NULL OR j.priority = retry_failed.tier)
      AND (retry_failed.reason IS NULL
           OR strpos(lower(j.last_error), lower(retry_failed.reason)) > 0)
      AND (retry_failed.since IS NULL OR j.finished_at >= retry_failed.since)
      AND (retry_failed.until IS NULL OR j.finished_at < retry_failed.until)
    RETURNING j.id
$$;
"""

DROP_ADDED = """
DROP FUNCTION IF EXISTS pgqueue.retry_failed_outcomes(text, pgqueue.tier, text, timestamptz,
                                                      timestamptz);
DROP FUNCTION IF EXISTS pgqueue.requeue_job(bigint, text);
DROP FUNCTION IF EXISTS pgqueue.dedupe_holder(text, text);
"""


def upgrade() -> None:
    op.execute(FUNCTIONS)


def downgrade() -> None:
    op.execute(FUNCTIONS_BEFORE)
    op.execute(DROP_ADDED)
