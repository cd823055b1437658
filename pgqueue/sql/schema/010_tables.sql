-- pgqueue schema: types, tables, their constraints and indexes, and the rows the schema starts
-- with; and pgqueue.is_invisible and pgqueue.has_control, which CHECKs of pgqueue.tenants
-- call. Applied first (files of pgqueue/sql/schema run in file-name order, in one
-- transaction, by the baseline revision; docs/schema.md). Column order is the order a database migrated by the old revision chain
-- has, so that both are the same schema.
--
-- The queue's tables carry low autovacuum thresholds (reloptions below): claims and
-- completions update them all the time, and an unvacuumed jobs table made claims 2.3x slower
-- (bench/bloat.py). Five CHECKs are NOT VALID: they were added to tables that already held
-- rows, and are kept as such so that an upgraded and a fresh database are the same schema;
-- Postgres enforces them on every row written either way.

-- What the caller says about a job; the tier is derived from it (pgqueue.classify).
CREATE TYPE pgqueue.origin AS ENUM (
    'user_action',
    'scheduled',
    'batch_job'
);

-- Scheduling tiers, highest first.
CREATE TYPE pgqueue.tier AS ENUM (
    'critical',
    'standard',
    'batch'
);

-- One job of a batch enqueue, with its admission verdict (041_enqueue_many.sql).
CREATE TYPE pgqueue.enqueue_batch_item AS (
	ord bigint,
	tenant_id text,
	o pgqueue.origin,
	payload jsonb,
	sla double precision,
	kind text,
	tier pgqueue.tier,
	admitted boolean,
	policy text,
	scope text,
	depth bigint,
	cap bigint
);

-- A job's life: queued -> running -> succeeded | failed | cancelled (or queued again).
CREATE TYPE pgqueue.job_state AS ENUM (
    'queued',
    'running',
    'succeeded',
    'failed',
    'cancelled'
);

-- Tenants: plan and quantum (their DRR weight), daily token budget, own cap of queued jobs.
CREATE TABLE pgqueue.tenants (
    tenant_id text NOT NULL,
    plan text DEFAULT 'free'::text NOT NULL,
    quantum double precision,
    daily_token_budget bigint,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    max_queued bigint,
    CONSTRAINT tenants_daily_token_budget_check CHECK (((daily_token_budget IS NULL) OR (daily_token_budget >= 0))),
    CONSTRAINT tenants_max_queued_check CHECK (((max_queued IS NULL) OR (max_queued >= 0))),
    CONSTRAINT tenants_plan_name CHECK ((plan ~ '^[A-Za-z0-9_.-]{1,32}$'::text)),
    CONSTRAINT tenants_quantum_check CHECK (((quantum IS NULL) OR (quantum > (0)::double precision))),
    CONSTRAINT tenants_quantum_finite CHECK ((quantum < 'Infinity'::double precision)),
    CONSTRAINT tenants_tenant_id_check CHECK (((tenant_id <> ''::text) AND (char_length(tenant_id) <= 128))),
    CONSTRAINT tenants_pkey PRIMARY KEY (tenant_id)
);

ALTER TABLE pgqueue.tenants
    ADD CONSTRAINT tenants_quantum_floor CHECK (((quantum IS NULL) OR (quantum >= (0.001)::double precision))) NOT VALID;

-- Whether t is one or more characters that show nothing, and only those: white space,
-- controls, format characters (U+200B ZERO WIDTH SPACE, the bidi marks), separators,
-- default-ignorable code points (the Hangul fillers such as U+3164, variation selectors,
-- tags) and U+2800 BRAILLE PATTERN BLANK (an empty cell: it was taken as a tenant id). The one
-- SQL copy of the class pgqueue/validation.py's INVISIBLE_CLASS holds, text for text
-- (tests/unit/test_invisible_tenant.py; tests/db/test_validation.py compares every code
-- point). The CHECK below, pgqueue.validate_job and pgqueue.job_is_valid call it (defined
-- in this file because the CHECK needs it first). One expression, LANGUAGE sql, not
-- STRICT: Postgres inlines it into each caller (the batch enqueue's one query, the CHECK),
-- so it costs what the regular expression costs.
CREATE OR REPLACE FUNCTION pgqueue.is_invisible(t text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT t ~ ('^[\u0001-\u0020\u007f-\u00a0\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f'
                || '\u0890-\u0891\u08e2\u115f-\u1160\u1680\u17b4-\u17b5\u180b-\u180f'
                || '\u2000-\u200f\u2028-\u202f\u205f-\u206f\u2800\u3000\u3164\ufe00-\ufe0f'
                || '\ufeff\uffa0\ufff0-\ufffb\U000110bd\U000110cd\U00013430-\U00013438'
                || '\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]+$')
$$;

-- A tenant id that shows nothing (pgqueue.is_invisible) is refused by every writer of the
-- table, pgqueue.tenant_set and pgqueue.ensure_tenant among them (revision 0067; a tester
-- stored U+200B and '  ' by them). NOT VALID: rows stored before stay.
ALTER TABLE pgqueue.tenants
    ADD CONSTRAINT tenants_tenant_id_visible CHECK (NOT pgqueue.is_invisible(tenant_id))
    NOT VALID;

-- Whether t holds a control character (category Cc: C0, DEL, C1; U+0000 cannot be in a text),
-- U+2028 LINE SEPARATOR, U+2029 PARAGRAPH SEPARATOR or a bidi control (U+061C, U+200E, U+200F,
-- U+202A-U+202E, U+2066-U+2069) anywhere: pgqueue/validation.py's CONTROL_CLASS, text for
-- text. A tenant id holding one is refused (found by a tester: ESC and OSC sequences in tenant
-- ids reached the terminal through `pgqueue status`, 'a' || chr(10) || 'b' showed as two rows;
-- U+2028 broke a row and U+202E reversed one, revision 0073). The CHECK below,
-- pgqueue.validate_job and pgqueue.job_is_valid call it; inlined as is_invisible is.
CREATE OR REPLACE FUNCTION pgqueue.has_control(t text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT t ~ '[\u0001-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]'
$$;

-- A tenant id with a control character (pgqueue.has_control) is refused by every writer of
-- the table, as one that shows nothing is. NOT VALID: rows stored before stay. Its name sorts
-- after tenants_tenant_id_visible (Postgres checks in name order): a tab alone is refused as
-- an id that shows nothing.
ALTER TABLE pgqueue.tenants
    ADD CONSTRAINT tenants_tenant_id_without_control CHECK (NOT pgqueue.has_control(tenant_id))
    NOT VALID;

-- The jobs. tenant_id is part of every key so that the table can be distributed by tenant
-- (Citus); so there is no foreign key to tenants (020_settings_and_tenants.sql's triggers
-- keep the reference instead, once per statement). `tier` is `priority` under the name the
-- README and the views use (revision 0040): generated, so writers set priority only.
CREATE TABLE pgqueue.jobs (
    id bigint GENERATED ALWAYS AS IDENTITY,
    tenant_id text NOT NULL,
    kind text DEFAULT 'anthropic.messages'::text NOT NULL,
    origin pgqueue.origin NOT NULL,
    sla_seconds double precision,
    priority pgqueue.tier NOT NULL,
    state pgqueue.job_state DEFAULT 'queued'::pgqueue.job_state NOT NULL,
    payload jsonb NOT NULL,
    model text,
    est_input_tokens integer DEFAULT 0 NOT NULL,
    max_output_tokens integer DEFAULT 0 NOT NULL,
    cost double precision DEFAULT 1 NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 5 NOT NULL,
    throttle_retries integer DEFAULT 0 NOT NULL,
    run_at timestamp with time zone DEFAULT now() NOT NULL,
    enqueued_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    lease_expires_at timestamp with time zone,
    lease_token uuid,
    worker_id text,
    result jsonb,
    last_error text,
    input_tokens integer,
    output_tokens integer,
    dedupe_key text,
    tier pgqueue.tier GENERATED ALWAYS AS (priority) STORED,
    lane text GENERATED ALWAYS AS (
CASE
    WHEN ((kind = 'anthropic.messages'::text) AND (model IS NOT NULL)) THEN model
    ELSE kind
END) STORED,
    key_round bigint,
    key_place numeric,
    key_seq bigint,
    CONSTRAINT jobs_dedupe_key_check CHECK (((dedupe_key IS NULL) OR ((dedupe_key <> ''::text) AND (char_length(dedupe_key) <= 256)))),
    CONSTRAINT jobs_max_attempts_check CHECK ((max_attempts >= 1)),
    CONSTRAINT jobs_pkey PRIMARY KEY (id, tenant_id) WITH (deduplicate_items='off')
)
WITH (autovacuum_vacuum_scale_factor='0.02', autovacuum_vacuum_threshold='1000', autovacuum_vacuum_insert_scale_factor='0.05', autovacuum_analyze_scale_factor='0.02');

ALTER TABLE pgqueue.jobs
    ADD CONSTRAINT jobs_cost_check CHECK (((cost >= (1)::double precision) AND (cost <= '1000000000'::double precision))) NOT VALID;

ALTER TABLE pgqueue.jobs
    ADD CONSTRAINT jobs_run_at_range CHECK (((run_at >= '0001-01-02 00:00:00+00'::timestamp with time zone) AND (run_at < '9999-12-30 00:00:00+00'::timestamp with time zone))) NOT VALID;

COMMENT ON COLUMN pgqueue.jobs.tier IS 'The job''s scheduling tier (critical, standard, batch), always equal to priority: priority is the name the design brief keeps stable and the one to write; tier is the name the README, views and status use (revision 0040)';

CREATE UNIQUE INDEX jobs_dedupe_live_idx ON pgqueue.jobs USING btree (tenant_id, dedupe_key) WITH (deduplicate_items='off') WHERE ((dedupe_key IS NOT NULL) AND (state = ANY (ARRAY['queued'::pgqueue.job_state, 'running'::pgqueue.job_state])));

-- None of the jobs indexes deduplicates equal keys (deduplicate_items off, revision 0061): a
-- posting list's entry can be marked dead only once all its row versions are, so a probe
-- went on visiting versions that a stamp or claim had replaced (80-150 heap fetches a probe
-- of the fold's check), and every insertion into one rewrote the list (-2 % instructions
-- per claimed and completed job, after revision 0060; -5 % before it). One enqueue shares run_at and enqueued_at, and a batched
-- claim or completion lease_expires_at and finished_at, so most keys had duplicates.
--
-- Every UPDATE of a job changes an indexed column (state, a key column), so none is HOT: each
-- row version gets an entry in every index whose predicate it matches. The stamp (queued ->
-- queued with a key), the claim (-> running) and a success (-> succeeded) are the hot path, so
-- the partial indexes below leave them out where their readers allow it (revision 0060:
-- 11 index entries per job to 7, -9 % instructions per claimed and completed job,
-- bench/claim_instructions_peer.py). A job's life, and the entries it gets: enqueue (the
-- queued and unstamped ones), stamp (jobs_queued_enqueued_idx, jobs_claim_idx), claim
-- (jobs_running_lease_idx), success (jobs_finished_at_idx), each with one of jobs_pkey.

-- Finished jobs in the order they finished: retention (job_prune), the metrics cursor
-- (metrics_finished_since), latency_slo_in, retry_failed's since/until; and the succeeded jobs
-- served in a window (pgqueue.jobs_started_since: a success is written after its claim
-- committed, so it finished at or after it started).
CREATE INDEX jobs_finished_at_idx ON pgqueue.jobs USING btree (finished_at) WITH (deduplicate_items='off') WHERE (state = ANY (ARRAY['succeeded'::pgqueue.job_state, 'failed'::pgqueue.job_state, 'cancelled'::pgqueue.job_state]));

-- The oldest queued job of a tier, by one probe (pgqueue.queue_depth; revision 0049): at 1M
-- queued jobs its age read them all, ~0.2 s a read. The one index of every queued job, stamped
-- or not (the oldest may be either), so the stamp writes an entry in it.
CREATE INDEX jobs_queued_enqueued_idx ON pgqueue.jobs USING btree (priority, enqueued_at) WITH (deduplicate_items='off') WHERE (state = 'queued'::pgqueue.job_state);

-- The unstamped queued jobs by the moment they are due (revision 0060; before, every queued
-- job): queue_depth's `due` (a job not due yet is never stamped: a stamp takes due jobs, and a
-- change of run_at takes the key off), job_next_due and job_due_kinds_besides (the stamped
-- jobs are due already: those read the lanes' heads, pgqueue.lane_tiers_stamped).
CREATE INDEX jobs_queued_run_at_idx ON pgqueue.jobs USING btree (run_at) WITH (deduplicate_items='off') WHERE ((state = 'queued'::pgqueue.job_state) AND (key_round IS NULL));

-- The unstamped queued jobs of a tenant (revision 0060; before, jobs_queued_tenant_head_idx of
-- every queued job): with jobs_claim_idx for its stamped ones (a few DRR rounds' worth), what
-- pgqueue.cancel_queued and pgqueue.demotion_check's demote_queued_jobs change. tenant_list
-- counts a tenant's queued jobs from the counters (queue_counts).
CREATE INDEX jobs_unstamped_tenant_idx ON pgqueue.jobs USING btree (tenant_id, priority) WITH (deduplicate_items='off') WHERE ((state = 'queued'::pgqueue.job_state) AND (key_round IS NULL));

-- The running jobs: rescue by expired lease (job_rescue), queue_depth's running, and the
-- running jobs served in a window (pgqueue.jobs_started_since).
CREATE INDEX jobs_running_lease_idx ON pgqueue.jobs USING btree (lease_expires_at) WITH (deduplicate_items='off') WHERE (state = 'running'::pgqueue.job_state);

-- The jobs that were started and then queued again, failed or were cancelled, by when they
-- last started (revision 0060; before, every started job: the claim and the completion each
-- wrote an entry): with jobs_running_lease_idx and jobs_finished_at_idx, the jobs served in a
-- window (pgqueue.jobs_started_since: tenant_service, fairness).
CREATE INDEX jobs_started_at_idx ON pgqueue.jobs USING btree (started_at) WITH (deduplicate_items='off') WHERE ((started_at IS NOT NULL) AND (state = ANY (ARRAY['queued'::pgqueue.job_state, 'failed'::pgqueue.job_state, 'cancelled'::pgqueue.job_state])));

-- The scheduler (070_scheduler.sql, docs/drr.md). A queued job's key (key_round, key_place,
-- key_seq) is its place in its lane and tier's DRR order, NULL until a fold stamps it; a
-- claim keeps it on the job. The claim reads one index range per lane and tier in key order;
-- the stamper finds the unstamped jobs per tenant (FIFO) and by the moment they became due.
CREATE INDEX jobs_claim_idx ON pgqueue.jobs USING btree (lane, priority, key_round, key_place, key_seq) WITH (deduplicate_items='off') WHERE ((state = 'queued'::pgqueue.job_state) AND (key_round IS NOT NULL));

CREATE INDEX jobs_unstamped_idx ON pgqueue.jobs USING btree (lane, priority, tenant_id, run_at, id) WITH (deduplicate_items='off') WHERE ((state = 'queued'::pgqueue.job_state) AND (key_round IS NULL));

CREATE INDEX jobs_unstamped_due_idx ON pgqueue.jobs USING btree (lane, priority, run_at, tenant_id) WITH (deduplicate_items='off') WHERE ((state = 'queued'::pgqueue.job_state) AND (key_round IS NULL));

-- One row per lane and tier, written only by the holder of its stamping lock: the last
-- key_seq handed out, the frontier (claims stay at or below it: the smallest key after which
-- a flow cut by the horizon has unstamped jobs; NULL: none), when jobs were last folded and
-- when a fold last looked at every tenant.
CREATE TABLE pgqueue.lane_tiers (
    lane text NOT NULL,
    tier pgqueue.tier NOT NULL,
    seq bigint DEFAULT 0 NOT NULL,
    frontier_round bigint,
    frontier_place numeric,
    frontier_seq bigint,
    folded_at timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    full_at timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    CONSTRAINT lane_tiers_pkey PRIMARY KEY (lane, tier)
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='500');

-- The DRR flow state: one row per tenant that was backlogged in a lane and tier, its place in
-- the cycle and where its last stamped job left it (round, seq, credit in integer cost
-- units). cut: the horizon left some of its due jobs unstamped; next_round: the round of the
-- first of them.
CREATE TABLE pgqueue.flows (
    lane text NOT NULL,
    tier pgqueue.tier NOT NULL,
    tenant_id text NOT NULL,
    place numeric NOT NULL,
    last_round bigint NOT NULL,
    last_seq bigint NOT NULL,
    credit bigint NOT NULL,
    cut boolean NOT NULL,
    next_round bigint,
    CONSTRAINT flows_pkey PRIMARY KEY (lane, tier, tenant_id)
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='500');

CREATE INDEX flows_place_idx ON pgqueue.flows USING btree (lane, tier, place);

CREATE INDEX flows_cut_idx ON pgqueue.flows USING btree (lane, tier, last_round, place, last_seq) WHERE cut;

-- The cut flows in the order of their next job's round: a fold goes on with the first few
-- (pgqueue.stamp's slice) by one index range, however many flows are cut (revision 0045).
CREATE INDEX flows_cut_next_idx ON pgqueue.flows USING btree (lane, tier, next_round, place) WHERE cut;

-- The cursor of a lane and tier (the key of the last claimed job): each claimer keeps the
-- greatest key it claimed in a row of its own, so that no claimer waits on another; the
-- stamper reads the greatest. Rows of claimers quiet for a minute and behind the cursor are pruned by the stamper.
CREATE TABLE pgqueue.cursors (
    lane text NOT NULL,
    tier pgqueue.tier NOT NULL,
    worker_id text NOT NULL,
    key_round bigint NOT NULL,
    key_place numeric NOT NULL,
    key_seq bigint NOT NULL,
    moved_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT cursors_pkey PRIMARY KEY (lane, tier, worker_id)
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='500');

CREATE INDEX cursors_key_idx ON pgqueue.cursors USING btree (lane, tier, key_round, key_place, key_seq);

-- 429/529 answers per tenant; five in a minute demote the tenant (090_backpressure.sql).
CREATE TABLE pgqueue.throttle_events (
    id bigint GENERATED ALWAYS AS IDENTITY,
    tenant_id text NOT NULL,
    job_id bigint,
    model text,
    status_code integer NOT NULL,
    retry_after_seconds double precision,
    occurred_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT throttle_events_pkey PRIMARY KEY (id, tenant_id)
);

CREATE INDEX throttle_events_tenant_time_idx ON pgqueue.throttle_events USING btree (tenant_id, occurred_at);

CREATE INDEX throttle_events_time_idx ON pgqueue.throttle_events USING btree (occurred_at);

-- A tenant demoted to batch until expires_at (throttle events or budget overrun).
CREATE TABLE pgqueue.demotions (
    id bigint GENERATED ALWAYS AS IDENTITY,
    tenant_id text NOT NULL,
    reason text NOT NULL,
    demoted_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    CONSTRAINT demotions_check CHECK ((expires_at > demoted_at)),
    CONSTRAINT demotions_pkey PRIMARY KEY (id, tenant_id),
    CONSTRAINT demotions_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES pgqueue.tenants(tenant_id)
);

CREATE INDEX demotions_expiry_idx ON pgqueue.demotions USING btree (expires_at);

CREATE INDEX demotions_tenant_expiry_idx ON pgqueue.demotions USING btree (tenant_id, expires_at);

-- Tokens charged per tenant and budget day (pgqueue.budget_day), for the daily budget.
CREATE TABLE pgqueue.usage_daily (
    tenant_id text NOT NULL,
    day date NOT NULL,
    requests bigint DEFAULT 0 NOT NULL,
    input_tokens bigint DEFAULT 0 NOT NULL,
    output_tokens bigint DEFAULT 0 NOT NULL,
    CONSTRAINT usage_daily_pkey PRIMARY KEY (tenant_id, day),
    CONSTRAINT usage_daily_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES pgqueue.tenants(tenant_id)
);

-- Exact queued counters for admission control: a delta log per (tier, tenant) (tenant NULL:
-- the tier's total), folded by queue_counts_compact; docs/admission.md.
CREATE TABLE pgqueue.queue_counts (
    tier pgqueue.tier NOT NULL,
    tenant_id text,
    queued bigint DEFAULT 0 NOT NULL,
    dropped bigint DEFAULT 0 NOT NULL,
    claim_stripe boolean DEFAULT false NOT NULL
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='500');

COMMENT ON COLUMN pgqueue.queue_counts.claim_stripe IS 'The key''s claim row (revision 0017): written only by the v1 claim, one at a time under its lock; scheduler v2 (revision 0042) writes none, and queue_counts_release_claims turns those left by v1 into ordinary rows';

CREATE UNIQUE INDEX queue_counts_claim_key_idx ON pgqueue.queue_counts USING btree (tier, COALESCE(tenant_id, ''::text)) WHERE claim_stripe;

CREATE INDEX queue_counts_key_idx ON pgqueue.queue_counts USING btree (tier, tenant_id);

-- One row per tier: caps of queued jobs (tier, per tenant; NULL = none) and the policy of a
-- full tier (reject | block | drop; critical is never dropped).
CREATE TABLE pgqueue.admission (
    tier pgqueue.tier NOT NULL,
    max_queued bigint,
    tenant_max_queued bigint,
    policy text DEFAULT 'reject'::text NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT admission_critical_never_dropped CHECK (((tier <> 'critical'::pgqueue.tier) OR (policy <> 'drop'::text))),
    CONSTRAINT admission_max_queued_check CHECK (((max_queued IS NULL) OR (max_queued >= 0))),
    CONSTRAINT admission_policy_check CHECK ((policy = ANY (ARRAY['reject'::text, 'block'::text, 'drop'::text]))),
    CONSTRAINT admission_tenant_max_queued_check CHECK (((tenant_max_queued IS NULL) OR (tenant_max_queued >= 0))),
    CONSTRAINT admission_pkey PRIMARY KEY (tier)
);

-- Every tier has its row (no caps, policy reject); a trigger keeps them (050_admission.sql).
INSERT INTO pgqueue.admission (tier) VALUES ('critical'), ('standard'), ('batch');

-- The shared provider limiter: per model, limits per minute, token-bucket levels refilled
-- to refreshed_at, cooldown after a 429, the observed input-estimate ratio; the input tokens
-- each tier's guarantee holds in the bucket, grown up to guarantees_at, and the tiers that
-- were backlogged then (ratelimit_pick_tier, 060_rate_limiter.sql).
CREATE TABLE pgqueue.rate_limits (
    model text NOT NULL,
    requests_per_minute double precision NOT NULL,
    input_tokens_per_minute double precision NOT NULL,
    output_tokens_per_minute double precision NOT NULL,
    requests_available double precision NOT NULL,
    input_tokens_available double precision NOT NULL,
    output_tokens_available double precision NOT NULL,
    refreshed_at timestamp with time zone DEFAULT now() NOT NULL,
    cooldown_until timestamp with time zone,
    input_estimate_ratio double precision DEFAULT 1.0 NOT NULL,
    limits_from_headers boolean DEFAULT false NOT NULL,
    guarantee_critical double precision DEFAULT 0 NOT NULL,
    guarantee_standard double precision DEFAULT 0 NOT NULL,
    guarantee_batch double precision DEFAULT 0 NOT NULL,
    guarantees_at timestamp with time zone DEFAULT now() NOT NULL,
    tiers_backlogged pgqueue.tier[] DEFAULT '{}'::pgqueue.tier[] NOT NULL,
    mean_input_tokens double precision DEFAULT 0 NOT NULL,
    output_guarantee_critical double precision DEFAULT 0 NOT NULL,
    output_guarantee_standard double precision DEFAULT 0 NOT NULL,
    output_guarantee_batch double precision DEFAULT 0 NOT NULL,
    mean_output_tokens double precision DEFAULT 0 NOT NULL,
    CONSTRAINT rate_limits_input_estimate_ratio_check CHECK ((input_estimate_ratio > (0)::double precision)),
    CONSTRAINT rate_limits_input_tokens_per_minute_check CHECK ((input_tokens_per_minute > (0)::double precision)),
    CONSTRAINT rate_limits_model_check CHECK ((model <> ''::text)),
    CONSTRAINT rate_limits_output_tokens_per_minute_check CHECK ((output_tokens_per_minute > (0)::double precision)),
    CONSTRAINT rate_limits_requests_per_minute_check CHECK ((requests_per_minute > (0)::double precision)),
    CONSTRAINT rate_limits_pkey PRIMARY KEY (model)
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='500');

-- What one worker at a time does (rescue, prune): a worker's round locks its row FOR UPDATE
-- SKIP LOCKED, the others skip theirs. Not advisory locks: every role may take any advisory
-- lock, and a tenant's role that held the rescuer's key stopped every rescue (found by a
-- hostile tester, issue 32); a producer may not lock these rows.
CREATE TABLE pgqueue.leader_locks (
    name text NOT NULL,
    CONSTRAINT leader_locks_pkey PRIMARY KEY (name)
);

INSERT INTO pgqueue.leader_locks (name) VALUES ('prune'), ('rescue');

-- Which tenant a database role acts for, kept by an admin (`pgqueue grant` lets only
-- pgqueue_admin write it). A session whose login role is listed, or is a member of a listed
-- role, is confined to that tenant by row-level security, enqueue and cancel
-- (pgqueue.session_tenant_scope), whatever it sets: found by a fault run, a producer that set
-- pgqueue.tenant_id to another tenant read and cancelled that tenant's jobs.
CREATE TABLE pgqueue.tenant_roles (
    role_name text NOT NULL,
    tenant_id text NOT NULL,
    CONSTRAINT tenant_roles_role_name_check CHECK ((role_name <> ''::text)),
    CONSTRAINT tenant_roles_tenant_id_check CHECK (((tenant_id <> ''::text) AND (char_length(tenant_id) <= 128))),
    CONSTRAINT tenant_roles_pkey PRIMARY KEY (role_name)
);

-- The batches lane (docs/batches.md): which tenants send their batch-tier anthropic.messages
-- jobs through Anthropic's Message Batches API. tenant_id '' is every tenant's default; a
-- tenant's own row overrides it; no row at all means off.
CREATE TABLE pgqueue.batch_lane (
    tenant_id text NOT NULL,
    enabled boolean NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT batch_lane_pkey PRIMARY KEY (tenant_id)
);

-- One Message Batch: collecting (jobs join it), submitting (recorded before the SDK call; its
-- jobs are fixed), submitted (provider_batch_id known, polled), ended. due_at is when a
-- worker may next take it (a take moves it a lease ahead, so a dead worker's batch is taken
-- again), submit_started_at when the first SDK call may have been made.
CREATE TABLE pgqueue.batches (
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

CREATE INDEX batches_open_idx ON pgqueue.batches USING btree (due_at) WHERE (state <> 'ended'::text);

-- Which jobs a batch holds (custom_id = job id) and, once it ended, each one's result type.
CREATE TABLE pgqueue.batch_jobs (
    batch_id bigint NOT NULL,
    job_id bigint NOT NULL,
    tenant_id text NOT NULL,
    outcome text,
    CONSTRAINT batch_jobs_outcome_check CHECK (((outcome IS NULL) OR (outcome = ANY (ARRAY['succeeded'::text, 'errored'::text, 'expired'::text, 'canceled'::text])))),
    CONSTRAINT batch_jobs_pkey PRIMARY KEY (batch_id, job_id, tenant_id)
);

CREATE INDEX batch_jobs_job_idx ON pgqueue.batch_jobs USING btree (job_id, tenant_id);
