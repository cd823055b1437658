-- The claim: tier policy, the DRR inbox triggers, and the entry points workers call.
-- claim_admitted claims a batch (claim -> drr_dispatch, 071_claim_dispatch.sql) and takes each
-- job's share of its model's buckets, so that only jobs that can be sent now are claimed.
-- claim_preview (the claim_order view) shows what the next claims would take.
-- docs/drr.md explains the design.

-- The tier-pick policy: GUC pgqueue.tier_policy (weighted | probabilistic | strict).
CREATE OR REPLACE FUNCTION pgqueue.tier_policy()
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    name text := lower(btrim(coalesce(
        nullif(current_setting('pgqueue.tier_policy', true), ''), 'weighted')));
BEGIN
    IF name NOT IN ('weighted', 'probabilistic', 'strict') THEN
        RAISE EXCEPTION 'unknown tier policy %; expected weighted, probabilistic or strict',
            quote_literal(name) USING ERRCODE = 'PQ009';
    END IF;
    RETURN name;
END
$$;

-- stable_offset() of pgqueue.scheduling.drr: first 4 bytes of SHA-256, big-endian. STABLE,
-- as convert_to is (not IMMUTABLE), so Postgres inlines it into the claim's fold.
CREATE OR REPLACE FUNCTION pgqueue.refill_offset(tenant_id text)
RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT ('x' || left(encode(sha256(convert_to(tenant_id, 'UTF8')), 'hex'), 8))::bit(32)::bigint
$$;

-- The DRR inbox: a (tier, tenant) pair that got queued work is appended for the next claim
-- to fold into its round. New jobs are noted by jobs_after_insert (040_enqueue.sql), so
-- drr_note_inserted is attached to no trigger: a leftover of the old chain, kept so that
-- this schema is the one databases already have. Jobs queued again (retry, throttle,
-- rescue, a run_at moved earlier) are noted by the row trigger below.
CREATE OR REPLACE FUNCTION pgqueue.drr_note_inserted()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO pgqueue.drr_inbox (tier, tenant_id)
    SELECT DISTINCT n.priority, n.tenant_id FROM new_rows n WHERE n.state = 'queued';
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.drr_note_requeued()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO pgqueue.drr_inbox (tier, tenant_id) VALUES (NEW.priority, NEW.tenant_id);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_drr_requeue
    AFTER UPDATE ON pgqueue.jobs
    FOR EACH ROW
    WHEN (((new.state = 'queued'::pgqueue.job_state) AND ((old.state <> 'queued'::pgqueue.job_state) OR (old.priority <> new.priority) OR (new.run_at < old.run_at) OR (old.tenant_id <> new.tenant_id))))
    EXECUTE FUNCTION pgqueue.drr_note_requeued();

-- Claim up to max_jobs jobs in DRR order (drr_dispatch), leased to worker_id.
CREATE OR REPLACE FUNCTION pgqueue.claim(max_jobs integer, worker_id text,
                                         lease_seconds double precision)
RETURNS SETOF pgqueue.jobs
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN QUERY SELECT (d.claimed).* FROM pgqueue.drr_dispatch(max_jobs, worker_id,
                                                                 lease_seconds) d;
END
$$;

-- Whether a claimed job goes to the batches lane (docs/batches.md) instead of the Messages
-- API: a batch-tier anthropic.messages job of a tenant whose lane is on (its own batch_lane
-- row, else the '' row, else off), unless one of its requests already expired in a batch
-- (then it goes to the Messages API). Such a job takes nothing from the provider limiter.
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

-- The claim behind admission control by the provider's limits: "claim only when the job can
-- be sent now". Claims a batch with pgqueue.claim (tiers + DRR) inside a subtransaction, then
-- takes each rate-limited job's request and tokens from its model's buckets in dispatch
-- order. If one does not fit, the whole batch is rolled back (scheduler state, leases, takes)
-- and claimed again up to the job before it: the dispatch is deterministic, so the same jobs
-- come back and their takes now all succeed. The scheduler's order is kept (no job jumps the
-- blocked one: no priority inversion). Rows: the claimed jobs with blocked_seconds NULL, then,
-- when the limiter stopped the batch, one row with a NULL job and the seconds until the
-- blocked job would fit. A job larger than a whole bucket is let through (its provider answer
-- will say why). Jobs of other kinds than anthropic.messages are not rate limited, nor are
-- those of the batches lane (batch_lane_takes).
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

-- What the next `max_jobs` single-job claims would take, without changing anything: runs the
-- claim itself in a subtransaction and rolls it back. Exact for the weighted and strict
-- policies; under `probabilistic` the tiers are one random draw.
CREATE OR REPLACE FUNCTION pgqueue.claim_preview(max_jobs integer)
RETURNS TABLE (seq integer, tier pgqueue.tier, round bigint, tenant_id text,
               job_id bigint, cost double precision)
LANGUAGE plpgsql
AS $$
DECLARE
    r record;
    tiers pgqueue.tier[] := '{}';
    rounds bigint[] := '{}';
    tenants text[] := '{}';
    ids bigint[] := '{}';
    costs double precision[] := '{}';
    first_round bigint;
BEGIN
    BEGIN
        FOR r IN SELECT d.claim_tier, d.claim_round, (d.claimed).tenant_id AS tid,
                        (d.claimed).id AS jid, (d.claimed).cost AS c
                 FROM pgqueue.drr_dispatch(max_jobs, 'pgqueue.claim_order', 0) d
        LOOP
            tiers := tiers || r.claim_tier;
            rounds := rounds || r.claim_round;
            tenants := tenants || r.tid;
            ids := ids || r.jid;
            costs := costs || r.c;
        END LOOP;
        RAISE EXCEPTION 'claim preview rollback' USING ERRCODE = 'PQ900';
    EXCEPTION WHEN SQLSTATE 'PQ900' THEN
        NULL;
    END;
    RETURN QUERY
    SELECT u.ord::integer, u.tier, u.round - s.round, u.tenant_id, u.job_id, u.cost
    FROM unnest(tiers, rounds, tenants, ids, costs)
         WITH ORDINALITY AS u(tier, round, tenant_id, job_id, cost, ord)
    JOIN pgqueue.tier_state s ON s.tier = u.tier
    ORDER BY u.ord;
END
$$;
