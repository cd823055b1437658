"""``pgqueue.retry_failed_outcomes`` re-queues the jobs with and without a dedupe key in one
statement: revision 0070 updated those without a key first, in a statement of their own that
repeated the re-queue's SET list and could not be held back by anything. The same rows come
out (one per job matched); a unique violation from a concurrent holder runs the one statement
again, and the one-job-at-a-time path after three tries takes every matched job
(``pgqueue.requeue_job`` re-queues a job without a key as before).

Revision ID: 0074
Revises: 0073
"""

from __future__ import annotations

from alembic import op

revision = "0074"
down_revision = "0073"
branch_labels = None
depends_on = None

FUNCTION = r"""CREATE OR REPLACE FUNCTION pgqueue.retry_failed_outcomes(tenant_id text DEFAULT NULL,
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
    -- One statement: a job whose dedupe key a live job holds, or a newer failed job of the
    -- same key, is left failed (a job without a key: nothing holds it). A live job that takes
    -- one of these keys after the statement's snapshot (an enqueue or a retry, concurrent)
    -- makes it fail with a unique violation: it runs again, with a new snapshot that sees
    -- that job (READ COMMITTED).
    FOR attempt IN 1 .. 3 LOOP
        BEGIN
            WITH judged AS (
                SELECT j.id, j.tenant_id, j.dedupe_key,
                       CASE WHEN j.dedupe_key IS NOT NULL THEN coalesce(
                           pgqueue.dedupe_holder(j.tenant_id, j.dedupe_key),
                           nullif(max(j.id) OVER (PARTITION BY j.tenant_id, j.dedupe_key), j.id))
                       END AS holder
                FROM pgqueue.jobs j
                WHERE j.id = ANY (picked)
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
        WHERE j.id = ANY (picked)
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
"""

FUNCTION_BEFORE = r"""CREATE OR REPLACE FUNCTION pgqueue.retry_failed_outcomes(tenant_id text DEFAULT NULL,
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
"""


def upgrade() -> None:
    op.execute(FUNCTION)


def downgrade() -> None:
    op.execute(FUNCTION_BEFORE)
