"""The batches lane: Anthropic's Message Batches API for batch-tier anthropic.messages jobs.

Adds ``pgqueue.batch_lane`` (on/off, per tenant and for all), ``pgqueue.batches`` (one
Message Batch: state, provider id, counts, times) and ``pgqueue.batch_jobs`` (which jobs a
batch holds, custom_id = job id), the function ``pgqueue.batch_lane_takes`` (does a claimed
job go to the lane), and ``pgqueue.claim_admitted`` no longer takes such jobs from the
Messages API limiter (issue 30; docs/batches.md).

Revision ID: 0036
Revises: 0034
"""

from __future__ import annotations

from alembic import op

revision = "0036"
down_revision = "0034"
branch_labels = None
depends_on = None

TABLES = """\
CREATE TABLE IF NOT EXISTS pgqueue.batch_lane (
    tenant_id text NOT NULL,
    enabled boolean NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT batch_lane_pkey PRIMARY KEY (tenant_id)
);

CREATE TABLE IF NOT EXISTS pgqueue.batches (
    id bigint GENERATED ALWAYS AS IDENTITY,
    state text DEFAULT 'collecting'::text NOT NULL,
    provider_batch_id text,
    requests integer DEFAULT 0 NOT NULL,
    succeeded integer DEFAULT 0 NOT NULL,
    errored integer DEFAULT 0 NOT NULL,
    expired integer DEFAULT 0 NOT NULL,
    canceled integer DEFAULT 0 NOT NULL,
    input_tokens bigint DEFAULT 0 NOT NULL,
    output_tokens bigint DEFAULT 0 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    submit_started_at timestamp with time zone,
    submitted_at timestamp with time zone,
    ended_at timestamp with time zone,
    due_at timestamp with time zone DEFAULT now() NOT NULL,
    worker_id text,
    last_error text,
    CONSTRAINT batches_state_check CHECK ((state = ANY (ARRAY['collecting'::text, 'submitting'::text, 'submitted'::text, 'ended'::text]))),
    CONSTRAINT batches_pkey PRIMARY KEY (id),
    CONSTRAINT batches_provider_batch_id_key UNIQUE (provider_batch_id)
);

CREATE INDEX IF NOT EXISTS batches_open_idx ON pgqueue.batches USING btree (due_at) WHERE (state <> 'ended'::text);

CREATE TABLE IF NOT EXISTS pgqueue.batch_jobs (
    batch_id bigint NOT NULL,
    job_id bigint NOT NULL,
    tenant_id text NOT NULL,
    outcome text,
    CONSTRAINT batch_jobs_outcome_check CHECK (((outcome IS NULL) OR (outcome = ANY (ARRAY['succeeded'::text, 'errored'::text, 'expired'::text, 'canceled'::text])))),
    CONSTRAINT batch_jobs_pkey PRIMARY KEY (batch_id, job_id, tenant_id)
);

CREATE INDEX IF NOT EXISTS batch_jobs_job_idx ON pgqueue.batch_jobs USING btree (job_id, tenant_id);
"""

BATCH_LANE_TAKES = """\
CREATE OR REPLACE FUNCTION pgqueue.batch_lane_takes(job_id bigint, tenant_id text,
                                                    priority pgqueue.tier, kind text)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT batch_lane_takes.priority = 'batch' AND batch_lane_takes.kind = 'anthropic.messages'
       AND coalesce((SELECT l.enabled FROM pgqueue.batch_lane l
                     WHERE l.tenant_id = batch_lane_takes.tenant_id),
                    (SELECT l.enabled FROM pgqueue.batch_lane l WHERE l.tenant_id = ''),
                    false)
       AND NOT EXISTS (SELECT 1 FROM pgqueue.batch_jobs b
                       WHERE b.job_id = batch_lane_takes.job_id
                         AND b.tenant_id = batch_lane_takes.tenant_id
                         AND b.outcome = 'expired')
$$;
"""

CLAIM_ADMITTED = """\
CREATE OR REPLACE FUNCTION pgqueue.claim_admitted(
    max_jobs integer,
    worker_id text,
    lease_seconds double precision
)
RETURNS TABLE(job pgqueue.jobs, blocked_seconds double precision)
    LANGUAGE plpgsql
    AS $$
DECLARE
    want integer := max_jobs;
    got pgqueue.jobs[];
    j pgqueue.jobs;
    wait double precision;
    blocked_at integer;
    blocked_wait double precision;
    tries integer := 0;
BEGIN
    -- The scheduler's lock, held to commit, so that the redo sees the same state. The claim's
    -- commit does not wait for its WAL flush: the lock is released sooner, and a claim lost in
    -- a crash only leaves its jobs queued, to be claimed again (at-least-once execution;
    -- every completion is fenced by the lease token).
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(7310575183440224370);
    LOOP
        tries := tries + 1;
        blocked_at := NULL;
        BEGIN
            got := ARRAY(SELECT d.claimed
                          FROM pgqueue.drr_dispatch(want, worker_id, lease_seconds) d);
            FOR i IN 1 .. coalesce(cardinality(got), 0) LOOP
                j := got[i];
                CONTINUE WHEN j.kind <> 'anthropic.messages' OR j.model IS NULL
                    OR pgqueue.batch_lane_takes(j.id, j.tenant_id, j.priority, j.kind);
                wait := pgqueue.ratelimit_try_take(j.model, j.est_input_tokens,
                                                   j.max_output_tokens);
                IF wait > 0 AND wait < 'Infinity'::double precision THEN
                    blocked_at := i;
                    blocked_wait := wait;
                    RAISE EXCEPTION 'rate limited' USING ERRCODE = 'PQ901';
                END IF;
            END LOOP;
        EXCEPTION WHEN SQLSTATE 'PQ901' THEN
            NULL;  -- everything of this attempt is undone; `got` and blocked_at survive
        END;
        IF blocked_at IS NULL THEN
            RETURN QUERY SELECT g, NULL::double precision FROM unnest(got) AS g;
            IF want < max_jobs THEN
                RETURN QUERY SELECT NULL::pgqueue.jobs, blocked_wait;
            END IF;
            RETURN;
        END IF;
        want := blocked_at - 1;
        IF want = 0 OR tries >= 3 THEN
            RETURN QUERY SELECT NULL::pgqueue.jobs, blocked_wait;
            RETURN;
        END IF;
    END LOOP;
END
$$;
"""

CLAIM_ADMITTED_BEFORE = """\
CREATE OR REPLACE FUNCTION pgqueue.claim_admitted(
    max_jobs integer,
    worker_id text,
    lease_seconds double precision
)
RETURNS TABLE(job pgqueue.jobs, blocked_seconds double precision)
    LANGUAGE plpgsql
    AS $$
DECLARE
    want integer := max_jobs;
    got pgqueue.jobs[];
    j pgqueue.jobs;
    wait double precision;
    blocked_at integer;
    blocked_wait double precision;
    tries integer := 0;
BEGIN
    -- The scheduler's lock, held to commit, so that the redo sees the same state. The claim's
    -- commit does not wait for its WAL flush: the lock is released sooner, and a claim lost in
    -- a crash only leaves its jobs queued, to be claimed again (at-least-once execution;
    -- every completion is fenced by the lease token).
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(7310575183440224370);
    LOOP
        tries := tries + 1;
        blocked_at := NULL;
        BEGIN
            got := ARRAY(SELECT d.claimed
                          FROM pgqueue.drr_dispatch(want, worker_id, lease_seconds) d);
            FOR i IN 1 .. coalesce(cardinality(got), 0) LOOP
                j := got[i];
                CONTINUE WHEN j.kind <> 'anthropic.messages' OR j.model IS NULL;
                wait := pgqueue.ratelimit_try_take(j.model, j.est_input_tokens,
                                                   j.max_output_tokens);
                IF wait > 0 AND wait < 'Infinity'::double precision THEN
                    blocked_at := i;
                    blocked_wait := wait;
                    RAISE EXCEPTION 'rate limited' USING ERRCODE = 'PQ901';
                END IF;
            END LOOP;
        EXCEPTION WHEN SQLSTATE 'PQ901' THEN
            NULL;  -- everything of this attempt is undone; `got` and blocked_at survive
        END;
        IF blocked_at IS NULL THEN
            RETURN QUERY SELECT g, NULL::double precision FROM unnest(got) AS g;
            IF want < max_jobs THEN
                RETURN QUERY SELECT NULL::pgqueue.jobs, blocked_wait;
            END IF;
            RETURN;
        END IF;
        want := blocked_at - 1;
        IF want = 0 OR tries >= 3 THEN
            RETURN QUERY SELECT NULL::pgqueue.jobs, blocked_wait;
            RETURN;
        END IF;
    END LOOP;
END
$$;
"""


def upgrade() -> None:
    op.execute(TABLES)
    op.execute(BATCH_LANE_TAKES)
    op.execute(CLAIM_ADMITTED)


def downgrade() -> None:
    op.execute(CLAIM_ADMITTED_BEFORE)
    op.execute("DROP FUNCTION IF EXISTS pgqueue.batch_lane_takes(bigint, text, pgqueue.tier, text)")
    op.execute("DROP TABLE IF EXISTS pgqueue.batch_jobs, pgqueue.batches, pgqueue.batch_lane")
