-- pgqueue schema, revision 0002: tier pick + per-tenant Deficit Round Robin in the claim path,
-- the claim_order preview, fairness views. The rules mirror pgqueue/scheduling/tiers.py and
-- pgqueue/scheduling/drr.py (tests compare them); docs/drr.md explains the design.

-- ------------------------------------------------------------------------------- state

-- One row per tier: the weighted policy's SWRR `current`, and the tier's DRR round state.
CREATE TABLE pgqueue.tier_state (
    tier           pgqueue.tier PRIMARY KEY,
    weight         double precision NOT NULL
                   CHECK (weight > 0 AND weight < 'Infinity'::double precision),
    swrr_current   double precision NOT NULL DEFAULT 0,
    turn_tenant    text,                        -- whose DRR turn is in progress, if any
    next_pos       bigint NOT NULL DEFAULT 1,   -- the next free place at the round's tail
    round          bigint NOT NULL DEFAULT 0,   -- DRR rounds begun so far
    round_end_pos  bigint NOT NULL DEFAULT 0    -- the last place of the round in progress
);
INSERT INTO pgqueue.tier_state (tier, weight)
VALUES ('critical', 70), ('standard', 25), ('batch', 5);

-- One row per backlogged (tenant, tier): its DRR deficit and place in the tier's round.
-- pos NULL: waiting to join the round (new work since the tier's last dispatch, or work that
-- is not due before due_at). Rows exist only for tenants with queued work, so the claim's
-- cost grows with active tenants, never with queued jobs.
CREATE TABLE pgqueue.deficits (
    tenant_id      text NOT NULL,
    tier           pgqueue.tier NOT NULL,
    deficit        double precision NOT NULL DEFAULT 0 CHECK (deficit >= 0),
    pos            bigint,
    due_at         timestamptz NOT NULL DEFAULT '-infinity',
    refill_offset  bigint NOT NULL,
    PRIMARY KEY (tenant_id, tier)
);
CREATE INDEX deficits_round_idx ON pgqueue.deficits (tier, pos);
CREATE INDEX deficits_waiting_idx ON pgqueue.deficits (tier, due_at) WHERE pos IS NULL;

-- (tier, tenant) pairs that received queued work, appended by triggers on jobs in the
-- writer's transaction and folded into pgqueue.deficits by the next claim. An append-only
-- inbox (no upsert) so that an uncommitted enqueue can never race a claim that drops the pair.
CREATE TABLE pgqueue.drr_inbox (
    tier       pgqueue.tier NOT NULL,
    tenant_id  text NOT NULL
);

-- The DRR head lookup: a tenant's due queued jobs of one tier, in the order they became due.
CREATE INDEX jobs_queued_tenant_head_idx ON pgqueue.jobs (tenant_id, priority, run_at, id)
    WHERE state = 'queued';
-- Service in a time window (tenant_service, fairness).
CREATE INDEX jobs_started_at_idx ON pgqueue.jobs (started_at) WHERE started_at IS NOT NULL;

-- Pairs already queued when this revision is applied.
INSERT INTO pgqueue.drr_inbox (tier, tenant_id)
SELECT DISTINCT priority, tenant_id FROM pgqueue.jobs WHERE state = 'queued';

-- ------------------------------------------------------------------------------ triggers

CREATE FUNCTION pgqueue.drr_note_inserted()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO pgqueue.drr_inbox (tier, tenant_id)
    SELECT DISTINCT n.priority, n.tenant_id FROM new_rows n WHERE n.state = 'queued';
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_drr_insert
    AFTER INSERT ON pgqueue.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.drr_note_inserted();

CREATE FUNCTION pgqueue.drr_note_requeued()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO pgqueue.drr_inbox (tier, tenant_id) VALUES (NEW.priority, NEW.tenant_id);
    RETURN NULL;
END
$$;

-- Retries, throttles, interrupts and rescues put a job back to queued; moving a queued job
-- to another tier or to an earlier run_at may make its tenant eligible sooner.
CREATE TRIGGER jobs_drr_requeue
    AFTER UPDATE ON pgqueue.jobs
    FOR EACH ROW
    WHEN (NEW.state = 'queued'
          AND (OLD.state <> 'queued' OR OLD.priority <> NEW.priority
               OR NEW.run_at < OLD.run_at))
    EXECUTE FUNCTION pgqueue.drr_note_requeued();

-- --------------------------------------------------------------------------- parameters

-- stable_offset() of pgqueue.scheduling.drr: first 4 bytes of SHA-256, big-endian.
CREATE FUNCTION pgqueue.refill_offset(tenant_id text)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ('x' || left(encode(sha256(convert_to(tenant_id, 'UTF8')), 'hex'), 8))::bit(32)::bigint
$$;

-- Base quantum in cost units: GUC pgqueue.default_quantum, else 5.
CREATE FUNCTION pgqueue.base_quantum()
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT coalesce(nullif(current_setting('pgqueue.default_quantum', true), '')::float8, 5.0)
$$;

-- quantum_for_plan() of pgqueue.scheduling.drr: the per-tenant override, else base × the
-- plan's multiplier (pro ×3, any other plan ×1).
CREATE FUNCTION pgqueue.plan_quantum(plan text, override double precision,
                                     base double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT coalesce(override,
                    base * CASE lower(btrim(coalesce(plan, ''), E' \t\n\r\f\v'))
                               WHEN 'pro' THEN 3.0 ELSE 1.0 END)
$$;

-- A tenant's quantum in cost units per DRR turn (the default for an unknown tenant).
CREATE FUNCTION pgqueue.tenant_quantum(tenant_id text)
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT pgqueue.plan_quantum(t.plan, t.quantum, pgqueue.base_quantum())
    FROM (SELECT 1) AS one
    LEFT JOIN pgqueue.tenants t ON t.tenant_id = tenant_quantum.tenant_id
$$;

-- The tier-pick policy: GUC pgqueue.tier_policy (weighted | probabilistic | strict).
CREATE FUNCTION pgqueue.tier_policy()
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

-- ------------------------------------------------------------------------------- claim

-- Decide and take up to max_jobs jobs, one dispatch at a time exactly as max_jobs single-job
-- claims would: tier pick (pgqueue.tier_policy), then DRR within the tier
-- (pgqueue.scheduling.drr.DrrScheduler.next); the deficits and the tier state are written in
-- this transaction. A transaction-scoped advisory lock serialises the decisions of concurrent
-- claimers (held for the milliseconds of one batch). Must run in READ COMMITTED, so that each
-- claim sees what the previous one committed.
--
-- Cost per dispatch (docs/drr.md): the state of the round head of each tier (tenant, deficit,
-- quantum) and a buffer of its next due jobs live in variables, so a dispatch that continues a
-- tenant's turn runs no statement at all. Statements run per turn (load the round head, fetch
-- its due heads with one LIMIT, write its deficit and new place when it moves to the tail) and
-- per batch (lock, inbox, one UPDATE of all the taken jobs, deficits and tier state). Jobs
-- taken earlier in the batch are still 'queued' to this transaction's later statements, so
-- every lookup of a tenant's queue excludes them (`picked`).
CREATE FUNCTION pgqueue.drr_dispatch(max_jobs integer, worker_id text,
                                     lease_seconds double precision)
RETURNS TABLE (claim_tier pgqueue.tier, claim_round bigint, claimed pgqueue.jobs)
LANGUAGE plpgsql
AS $$
DECLARE
    tiers constant pgqueue.tier[] := '{critical,standard,batch}';
    policy constant text := pgqueue.tier_policy();
    base constant double precision := pgqueue.base_quantum();
    stride constant integer := greatest(coalesce(max_jobs, 0), 0) + 2;  -- buffer slots/tier
    -- tier_state, one element per tier
    weight double precision[] := '{0,0,0}';
    cur double precision[] := '{0,0,0}';
    turn text[] := '{NULL,NULL,NULL}';
    npos bigint[] := '{1,1,1}';
    rnd bigint[] := '{0,0,0}';
    rend bigint[] := '{0,0,0}';
    elig boolean[] := '{f,f,f}';
    absorb boolean[] := '{f,f,f}';
    recheck boolean[] := '{f,f,f}';     -- eligibility to be decided before the next pick
    -- the tier's round head (its pair with the lowest pos), once loaded: tenant, deficit
    -- (`hdirty`: not yet written to pgqueue.deficits), quantum, pos
    ht text[] := '{NULL,NULL,NULL}';
    hdef double precision[] := '{0,0,0}';
    hq double precision[] := '{0,0,0}';
    hpos bigint[] := '{0,0,0}';
    hdirty boolean[] := '{f,f,f}';
    -- per tier, a buffer of tenant bt's next due jobs, locked, in (run_at, id) order: slots
    -- (i-1)*stride+1 .. (i-1)*stride+bn[i], next unused bat[i]; bdone: nothing due after them
    bt text[] := '{NULL,NULL,NULL}';
    bn integer[] := '{0,0,0}';
    bat integer[] := '{1,1,1}';
    bdone boolean[] := '{f,f,f}';
    b_id bigint[] := array_fill(NULL::bigint, ARRAY[3 * stride]);
    b_cost double precision[] := array_fill(NULL::double precision, ARRAY[3 * stride]);
    b_run timestamptz[] := array_fill(NULL::timestamptz, ARRAY[3 * stride]);
    f_id bigint[];
    f_cost double precision[];
    f_run timestamptz[];
    -- the dispatches of this batch, in order
    picked bigint[] := '{}';
    pk_tenant text[] := '{}';
    pk_tier pgqueue.tier[] := '{}';
    pk_round bigint[] := '{}';
    pk_at timestamptz[] := '{}';
    last_at timestamptz := '-infinity';
    taken integer := 0;
    repaired boolean := false;
    served boolean;
    i integer;
    b integer;
    k integer;
    n integer;
    off integer;
    lim integer;
    best integer;
    total double precision;
    t text;
    rot_t text;                          -- a pair to move to the tail: tenant, deficit, pos
    rot_def double precision;
    rot_pos bigint;
    tr pgqueue.tier;                     -- the tier at hand (a plain parameter for the planner)
    t_def double precision;
    t_q double precision;
    t_pos bigint;
    joined bigint;
    next_due timestamptz;
    a_run timestamptz;
    a_id bigint;
    s record;
    orphan record;
BEGIN
    IF max_jobs IS NULL OR max_jobs < 0 THEN
        RAISE EXCEPTION 'limit must be >= 0, got %', max_jobs USING ERRCODE = 'PQ009';
    END IF;
    PERFORM pg_advisory_xact_lock(7310575183440224370);  -- 'pgq_drr!'
    FOR s IN SELECT * FROM pgqueue.tier_state LOOP
        i := array_position(tiers, s.tier);
        weight[i] := s.weight;
        cur[i] := s.swrr_current;
        turn[i] := s.turn_tenant;
        npos[i] := s.next_pos;
        rnd[i] := s.round;
        rend[i] := s.round_end_pos;
    END LOOP;
    LOOP
        WITH drained AS (
            DELETE FROM pgqueue.drr_inbox RETURNING tier, tenant_id
        )
        INSERT INTO pgqueue.deficits AS d (tenant_id, tier, refill_offset)
        SELECT DISTINCT x.tenant_id, x.tier, pgqueue.refill_offset(x.tenant_id) FROM drained x
        ON CONFLICT (tenant_id, tier) DO UPDATE SET due_at = '-infinity'
        WHERE d.pos IS NULL;

        -- Tiers with waiting pairs that are due: they join the round at the tier's next dispatch.
        SELECT ARRAY[EXISTS (SELECT 1 FROM pgqueue.deficits d WHERE d.tier = 'critical'
                               AND d.pos IS NULL AND d.due_at <= now()),
                     EXISTS (SELECT 1 FROM pgqueue.deficits d WHERE d.tier = 'standard'
                               AND d.pos IS NULL AND d.due_at <= now()),
                     EXISTS (SELECT 1 FROM pgqueue.deficits d WHERE d.tier = 'batch'
                               AND d.pos IS NULL AND d.due_at <= now())]
        INTO absorb;
        recheck := '{t,t,t}';

        LOOP
            -- Eligibility (does the tier have a due job now?), where it may have changed: probe
            -- the round head, then the due waiting pairs; a pair without a due job leaves the
            -- round (so each is probed once until its work is due again). The probe fills the
            -- tier's buffer, which the next dispatch of the tier then uses.
            FOR i IN 1 .. 3 LOOP
                CONTINUE WHEN NOT recheck[i];
                recheck[i] := false;
                tr := tiers[i];
                elig[i] := false;
                off := (i - 1) * stride;
                LOOP
                    IF ht[i] IS NULL THEN
                        -- Load the round head (after moving a pair to the tail, if one is pending) and
                        -- fetch its next due jobs into the buffer, in one statement.
                        WITH rotated AS (
                            UPDATE pgqueue.deficits d SET deficit = rot_def, pos = rot_pos
                            WHERE d.tenant_id = rot_t AND d.tier = tr
                            RETURNING d.tenant_id, d.deficit, d.pos
                        ), head AS (
                            SELECT h.tenant_id, h.deficit, h.pos
                            FROM ((SELECT d.tenant_id, d.deficit, d.pos FROM pgqueue.deficits d
                                   WHERE d.tier = tr AND d.pos IS NOT NULL
                                     AND d.tenant_id IS DISTINCT FROM rot_t
                                   ORDER BY d.pos
                                   LIMIT 1)
                                  UNION ALL
                                  SELECT r.tenant_id, r.deficit, r.pos FROM rotated r) h
                            ORDER BY h.pos
                            LIMIT 1
                        )
                        SELECT head.tenant_id, head.deficit, head.pos, q.quantum, l.lim, f.ids, f.costs, f.runs
                        INTO t, t_def, t_pos, t_q, lim, f_id, f_cost, f_run
                        FROM head
                        LEFT JOIN pgqueue.tenants tn ON tn.tenant_id = head.tenant_id
                        CROSS JOIN LATERAL (
                            SELECT pgqueue.plan_quantum(tn.plan, tn.quantum, base) AS quantum) q
                        CROSS JOIN LATERAL (  -- at most floor(credit) jobs (cost >= 1) fit in its turn
                            SELECT least((max_jobs - taken)::double precision,
                                         floor(head.deficit + CASE WHEN head.tenant_id = turn[i] THEN 0
                                                                   ELSE q.quantum END))::integer + 1 AS lim) l
                        CROSS JOIN LATERAL (
                            SELECT array_agg(y.id ORDER BY y.run_at, y.id) AS ids,
                                   array_agg(y.cost ORDER BY y.run_at, y.id) AS costs,
                                   array_agg(y.run_at ORDER BY y.run_at, y.id) AS runs
                            FROM (SELECT j.id, j.cost, j.run_at FROM pgqueue.jobs j
                                  WHERE j.tenant_id = head.tenant_id AND j.priority = tr
                                    AND j.state = 'queued' AND j.run_at <= now()
                                    AND (j.tenant_id, j.priority, j.run_at, j.id)
                                        > (head.tenant_id, tr, '-infinity'::timestamptz, -9223372036854775808)
                                    AND j.id <> ALL (picked)
                                  ORDER BY j.run_at, j.id
                                  LIMIT l.lim
                                  FOR UPDATE SKIP LOCKED) y) f;
                        rot_t := NULL;
                        IF FOUND THEN
                            ht[i] := t;
                            hdef[i] := t_def;
                            hq[i] := t_q;
                            hpos[i] := t_pos;
                            hdirty[i] := false;
                            n := coalesce(array_length(f_id, 1), 0);
                            IF n > 0 THEN
                                b_id[off + 1 : off + n] := f_id;
                                b_cost[off + 1 : off + n] := f_cost;
                                b_run[off + 1 : off + n] := f_run;
                            END IF;
                            bt[i] := t;
                            bn[i] := n;
                            bat[i] := 1;
                            bdone[i] := n < lim;
                        END IF;
                    END IF;
                    IF ht[i] IS NOT NULL THEN
                        t := ht[i];
                        -- at most floor(credit) jobs (cost >= 1) fit in its turn
                        lim := least((max_jobs - taken)::double precision,
                                     floor(hdef[i] + CASE WHEN turn[i] = t THEN 0
                                                          ELSE hq[i] END))::integer + 1;
                    ELSE
                        SELECT d.tenant_id, pgqueue.plan_quantum(tn.plan, tn.quantum, base)
                        INTO t, t_q
                        FROM pgqueue.deficits d
                        LEFT JOIN pgqueue.tenants tn ON tn.tenant_id = d.tenant_id
                        WHERE d.tier = tr AND d.pos IS NULL AND d.due_at <= now()
                        LIMIT 1;
                        EXIT WHEN NOT FOUND;
                        lim := least((max_jobs - taken)::double precision, floor(t_q))::integer + 1;
                    END IF;
                    -- the tenant's next due, unlocked job (from its buffer, else one LIMIT)
                    IF bt[i] IS DISTINCT FROM t THEN
                        bt[i] := t;
                        bn[i] := 0;
                        bat[i] := 1;
                        bdone[i] := false;
                    END IF;
                    IF bat[i] > bn[i] AND NOT bdone[i] THEN
                        IF bn[i] = 0 THEN
                            a_run := '-infinity';
                            a_id := -9223372036854775808;
                        ELSE
                            a_run := b_run[off + bn[i]];
                            a_id := b_id[off + bn[i]];
                        END IF;
                        SELECT array_agg(x.id ORDER BY x.run_at, x.id),
                               array_agg(x.cost ORDER BY x.run_at, x.id),
                               array_agg(x.run_at ORDER BY x.run_at, x.id)
                        INTO f_id, f_cost, f_run
                        FROM (SELECT j.id, j.cost, j.run_at FROM pgqueue.jobs j
                              WHERE j.tenant_id = t AND j.priority = tr
                                AND j.state = 'queued' AND j.run_at <= now()
                                AND (j.tenant_id, j.priority, j.run_at, j.id) > (t, tr, a_run, a_id)
                                AND j.id <> ALL (picked)
                              ORDER BY j.run_at, j.id
                              LIMIT lim
                              FOR UPDATE SKIP LOCKED) x;
                        n := coalesce(array_length(f_id, 1), 0);
                        IF n > 0 THEN
                            b_id[off + 1 : off + n] := f_id;
                            b_cost[off + 1 : off + n] := f_cost;
                            b_run[off + 1 : off + n] := f_run;
                        END IF;
                        bn[i] := n;
                        bat[i] := 1;
                        bdone[i] := n < lim;
                    END IF;
                    IF bat[i] <= bn[i] THEN
                        elig[i] := true;
                        EXIT;
                    END IF;
                    -- No due job: the pair leaves the round with its deficit reset (idle tenants
                    -- bank no credit) and waits until its next job is due; with nothing queued
                    -- the row goes. A due job that someone else holds locked is looked at again
                    -- a second later.
                    SELECT j.run_at INTO next_due
                    FROM pgqueue.jobs j
                    WHERE j.tenant_id = t AND j.priority = tr AND j.state = 'queued'
                      AND j.id <> ALL (picked)
                    ORDER BY j.run_at, j.id
                    LIMIT 1;
                    IF next_due IS NULL THEN
                        DELETE FROM pgqueue.deficits d WHERE d.tenant_id = t AND d.tier = tr;
                    ELSE
                        UPDATE pgqueue.deficits d
                        SET pos = NULL, deficit = 0,
                            due_at = CASE WHEN next_due > now() THEN next_due
                                          ELSE now() + interval '1 second' END
                        WHERE d.tenant_id = t AND d.tier = tr;
                    END IF;
                    IF turn[i] = t THEN
                        turn[i] := NULL;
                    END IF;
                    IF ht[i] = t THEN
                        ht[i] := NULL;
                        hdirty[i] := false;
                    END IF;
                END LOOP;
            END LOOP;
            EXIT WHEN taken >= max_jobs;

            -- Tier pick (pgqueue/scheduling/tiers.py), over the eligible tiers only.
            best := NULL;
            IF policy = 'strict' THEN
                best := array_position(elig, true);
            ELSIF policy = 'probabilistic' THEN
                IF elig[1] AND random() < 0.9 THEN
                    best := 1;
                ELSIF elig[2] AND elig[3] THEN
                    best := CASE WHEN random() * 30.0 < 25.0 THEN 2 ELSE 3 END;
                ELSE
                    best := coalesce(array_position(elig[2:3], true) + 1,
                                     array_position(elig, true));
                END IF;
            ELSE  -- weighted: smooth weighted round robin, ties to the higher priority
                total := 0;
                FOR i IN 1 .. 3 LOOP
                    IF elig[i] THEN
                        cur[i] := cur[i] + weight[i];
                        total := total + weight[i];
                        IF best IS NULL OR cur[i] > cur[best] THEN
                            best := i;
                        END IF;
                    END IF;
                END LOOP;
                IF best IS NOT NULL THEN
                    cur[best] := cur[best] - total;
                END IF;
            END IF;
            EXIT WHEN best IS NULL;

            -- One DrrScheduler.next() of tier b. Due waiting pairs first join the tail of the
            -- round sorted by (refill offset, tenant id): the staggered refill order.
            b := best;
            tr := tiers[b];
            off := (b - 1) * stride;
            IF absorb[b] THEN
                WITH waiting AS (
                    SELECT d.tenant_id,
                           row_number() OVER (ORDER BY d.refill_offset,
                                                       d.tenant_id COLLATE "C") AS rn
                    FROM pgqueue.deficits d
                    WHERE d.tier = tr AND d.pos IS NULL AND d.due_at <= now()
                )
                UPDATE pgqueue.deficits d
                SET pos = npos[b] + w.rn - 1
                FROM waiting w
                WHERE d.tier = tr AND d.tenant_id = w.tenant_id;
                GET DIAGNOSTICS joined = ROW_COUNT;
                npos[b] := npos[b] + joined;
                absorb[b] := false;
            END IF;
            served := false;
            LOOP
                IF ht[b] IS NULL THEN
                    -- Load the round head (after moving a pair to the tail, if one is pending) and
                    -- fetch its next due jobs into the buffer, in one statement.
                    WITH rotated AS (
                        UPDATE pgqueue.deficits d SET deficit = rot_def, pos = rot_pos
                        WHERE d.tenant_id = rot_t AND d.tier = tr
                        RETURNING d.tenant_id, d.deficit, d.pos
                    ), head AS (
                        SELECT h.tenant_id, h.deficit, h.pos
                        FROM ((SELECT d.tenant_id, d.deficit, d.pos FROM pgqueue.deficits d
                               WHERE d.tier = tr AND d.pos IS NOT NULL
                                 AND d.tenant_id IS DISTINCT FROM rot_t
                               ORDER BY d.pos
                               LIMIT 1)
                              UNION ALL
                              SELECT r.tenant_id, r.deficit, r.pos FROM rotated r) h
                        ORDER BY h.pos
                        LIMIT 1
                    )
                    SELECT head.tenant_id, head.deficit, head.pos, q.quantum, l.lim, f.ids, f.costs, f.runs
                    INTO t, t_def, t_pos, t_q, lim, f_id, f_cost, f_run
                    FROM head
                    LEFT JOIN pgqueue.tenants tn ON tn.tenant_id = head.tenant_id
                    CROSS JOIN LATERAL (
                        SELECT pgqueue.plan_quantum(tn.plan, tn.quantum, base) AS quantum) q
                    CROSS JOIN LATERAL (  -- at most floor(credit) jobs (cost >= 1) fit in its turn
                        SELECT least((max_jobs - taken)::double precision,
                                     floor(head.deficit + CASE WHEN head.tenant_id = turn[b] THEN 0
                                                               ELSE q.quantum END))::integer + 1 AS lim) l
                    CROSS JOIN LATERAL (
                        SELECT array_agg(y.id ORDER BY y.run_at, y.id) AS ids,
                               array_agg(y.cost ORDER BY y.run_at, y.id) AS costs,
                               array_agg(y.run_at ORDER BY y.run_at, y.id) AS runs
                        FROM (SELECT j.id, j.cost, j.run_at FROM pgqueue.jobs j
                              WHERE j.tenant_id = head.tenant_id AND j.priority = tr
                                AND j.state = 'queued' AND j.run_at <= now()
                                AND (j.tenant_id, j.priority, j.run_at, j.id)
                                    > (head.tenant_id, tr, '-infinity'::timestamptz, -9223372036854775808)
                                AND j.id <> ALL (picked)
                              ORDER BY j.run_at, j.id
                              LIMIT l.lim
                              FOR UPDATE SKIP LOCKED) y) f;
                    rot_t := NULL;
                    EXIT WHEN NOT FOUND;
                    ht[b] := t;
                    hdef[b] := t_def;
                    hq[b] := t_q;
                    hpos[b] := t_pos;
                    hdirty[b] := false;
                    n := coalesce(array_length(f_id, 1), 0);
                    IF n > 0 THEN
                        b_id[off + 1 : off + n] := f_id;
                        b_cost[off + 1 : off + n] := f_cost;
                        b_run[off + 1 : off + n] := f_run;
                    END IF;
                    bt[b] := t;
                    bn[b] := n;
                    bat[b] := 1;
                    bdone[b] := n < lim;
                END IF;
                t := ht[b];
                IF turn[b] IS DISTINCT FROM t THEN  -- its turn begins: one quantum
                    IF hpos[b] > rend[b] THEN
                        rnd[b] := rnd[b] + 1;
                        rend[b] := npos[b] - 1;
                    END IF;
                    turn[b] := t;
                    hdef[b] := hdef[b] + hq[b];
                    hdirty[b] := true;
                END IF;
                -- the tenant's next due, unlocked job (from its buffer, else one LIMIT)
                IF bt[b] IS DISTINCT FROM t THEN
                    bt[b] := t;
                    bn[b] := 0;
                    bat[b] := 1;
                    bdone[b] := false;
                END IF;
                IF bat[b] > bn[b] AND NOT bdone[b] THEN
                    IF bn[b] = 0 THEN
                        a_run := '-infinity';
                        a_id := -9223372036854775808;
                    ELSE
                        a_run := b_run[off + bn[b]];
                        a_id := b_id[off + bn[b]];
                    END IF;
                    lim := least((max_jobs - taken)::double precision, floor(hdef[b]))::integer + 1;
                    SELECT array_agg(x.id ORDER BY x.run_at, x.id),
                           array_agg(x.cost ORDER BY x.run_at, x.id),
                           array_agg(x.run_at ORDER BY x.run_at, x.id)
                    INTO f_id, f_cost, f_run
                    FROM (SELECT j.id, j.cost, j.run_at FROM pgqueue.jobs j
                          WHERE j.tenant_id = t AND j.priority = tr
                            AND j.state = 'queued' AND j.run_at <= now()
                            AND (j.tenant_id, j.priority, j.run_at, j.id) > (t, tr, a_run, a_id)
                            AND j.id <> ALL (picked)
                          ORDER BY j.run_at, j.id
                          LIMIT lim
                          FOR UPDATE SKIP LOCKED) x;
                    n := coalesce(array_length(f_id, 1), 0);
                    IF n > 0 THEN
                        b_id[off + 1 : off + n] := f_id;
                        b_cost[off + 1 : off + n] := f_cost;
                        b_run[off + 1 : off + n] := f_run;
                    END IF;
                    bn[b] := n;
                    bat[b] := 1;
                    bdone[b] := n < lim;
                END IF;
                IF bat[b] > bn[b] THEN
                    -- nothing due (or all locked by others): the pair leaves the round
                    SELECT j.run_at INTO next_due
                    FROM pgqueue.jobs j
                    WHERE j.tenant_id = t AND j.priority = tr AND j.state = 'queued'
                      AND j.id <> ALL (picked)
                    ORDER BY j.run_at, j.id
                    LIMIT 1;
                    IF next_due IS NULL THEN
                        DELETE FROM pgqueue.deficits d WHERE d.tenant_id = t AND d.tier = tr;
                    ELSE
                        UPDATE pgqueue.deficits d
                        SET pos = NULL, deficit = 0,
                            due_at = CASE WHEN next_due > now() THEN next_due
                                          ELSE now() + interval '1 second' END
                        WHERE d.tenant_id = t AND d.tier = tr;
                    END IF;
                    turn[b] := NULL;
                    ht[b] := NULL;
                    hdirty[b] := false;
                    CONTINUE;
                END IF;
                k := off + bat[b];
                IF b_cost[k] <= hdef[b] THEN
                    hdef[b] := hdef[b] - b_cost[k];
                    hdirty[b] := true;
                    bat[b] := bat[b] + 1;
                    taken := taken + 1;
                    picked[taken] := b_id[k];
                    pk_tenant[taken] := t;
                    pk_tier[taken] := tr;
                    pk_round[taken] := rnd[b];
                    -- started_at orders dispatches globally (strictly increasing)
                    last_at := greatest(clock_timestamp(), last_at + interval '1 microsecond');
                    pk_at[taken] := last_at;
                    served := true;
                    EXIT;
                END IF;
                -- The head costs more than the credit left: the turn ends, the deficit carries
                -- over, and the pair moves to the tail of the round.
                -- (written by the next load of the round head, just below)
                rot_t := t;
                rot_def := hdef[b];
                rot_pos := npos[b];
                npos[b] := npos[b] + 1;
                turn[b] := NULL;
                ht[b] := NULL;
                hdirty[b] := false;
            END LOOP;
            IF NOT served THEN
                elig[b] := false;
            ELSIF bat[b] > bn[b] THEN
                -- its buffer is used up: did its queue empty? (it leaves, the tier may not be
                -- eligible any more)
                recheck[b] := true;
            END IF;
        END LOOP;
        -- Work-conserving safety net: nothing taken, yet a due job exists (its pair was lost,
        -- e.g. rows written with triggers disabled): note its pair and decide once more.
        EXIT WHEN taken > 0 OR max_jobs = 0 OR repaired;
        SELECT j.priority, j.tenant_id INTO orphan
        FROM pgqueue.jobs j
        WHERE j.state = 'queued' AND j.run_at <= now()
        ORDER BY j.run_at
        LIMIT 1
        FOR UPDATE SKIP LOCKED;
        EXIT WHEN NOT FOUND;
        INSERT INTO pgqueue.drr_inbox (tier, tenant_id) VALUES (orphan.priority, orphan.tenant_id);
        repaired := true;
    END LOOP;
    -- One statement: the deficits of the turns still in progress, the tier state, and the
    -- jobs taken (started_at = the moment of each dispatch), returned in dispatch order.
    RETURN QUERY
    WITH flushed AS (
        UPDATE pgqueue.deficits d SET deficit = u.deficit
        FROM unnest(ht, tiers, hdef, hdirty) AS u(tenant_id, tier, deficit, dirty)
        WHERE u.dirty AND d.tenant_id = u.tenant_id AND d.tier = u.tier
    ), saved AS (
        UPDATE pgqueue.tier_state ts
        SET swrr_current = cur[array_position(tiers, ts.tier)],
            turn_tenant = turn[array_position(tiers, ts.tier)],
            next_pos = npos[array_position(tiers, ts.tier)],
            round = rnd[array_position(tiers, ts.tier)],
            round_end_pos = rend[array_position(tiers, ts.tier)]
    ), taking AS (
        SELECT u.id, u.tenant_id, u.tier, u.round, u.at, u.ord
        FROM unnest(picked, pk_tenant, pk_tier, pk_round, pk_at)
             WITH ORDINALITY AS u(id, tenant_id, tier, round, at, ord)
    ), took AS (
        UPDATE pgqueue.jobs j
        SET state = 'running',
            attempts = j.attempts + 1,
            started_at = x.at,
            worker_id = drr_dispatch.worker_id,
            lease_token = gen_random_uuid(),
            lease_expires_at = now() + make_interval(secs => lease_seconds)
        FROM taking x
        WHERE j.id = x.id AND j.tenant_id = x.tenant_id
        RETURNING x.ord, x.tier, x.round, j
    )
    SELECT took.tier, took.round, took.j FROM took ORDER BY took.ord;
END
$$;
-- Its statements' plans do not depend on parameter values (index probes by key), and custom
-- plans would be re-planned at every call.
ALTER FUNCTION pgqueue.drr_dispatch(integer, text, double precision)
    SET plan_cache_mode = force_generic_plan;

CREATE FUNCTION pgqueue.claim(max_jobs integer, worker_id text,
                              lease_seconds double precision)
RETURNS SETOF pgqueue.jobs
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN QUERY SELECT (d.claimed).* FROM pgqueue.drr_dispatch(max_jobs, worker_id,
                                                                 lease_seconds) d;
END
$$;

-- What the next `max_jobs` single-job claims would take, without changing anything: runs the
-- claim itself in a subtransaction and rolls it back. Exact for the weighted and strict
-- policies; under `probabilistic` the tiers are one random draw.
CREATE FUNCTION pgqueue.claim_preview(max_jobs integer)
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

-- The DRR-weighted order: (tier, round, tenant, job, cost) the next claims would take on a
-- quiet system; round 0 is the round in progress in that tier. Shows the next
-- pgqueue.claim_order_rows (GUC, default 100) dispatches; pgqueue.claim_preview(n) for more.
CREATE VIEW pgqueue.claim_order AS
SELECT p.seq, p.tier, p.round, p.tenant_id, p.job_id, p.cost
FROM pgqueue.claim_preview(
    coalesce(nullif(current_setting('pgqueue.claim_order_rows', true), '')::integer, 100)) p
ORDER BY p.seq;

-- ---------------------------------------------------------------------------- fairness

-- Per tenant and tier, over the last `service_window`: jobs and cost units served (claimed),
-- queued now, the tenant's quantum (its DRR weight), and whether it was backlogged in the
-- window (had work waiting at some moment of it: served in it, or queued now).
CREATE FUNCTION pgqueue.tenant_service_in(service_window interval)
RETURNS TABLE (tenant_id text, tier pgqueue.tier, jobs_served bigint,
               cost_served double precision, jobs_queued bigint,
               cost_queued double precision, quantum double precision, backlogged boolean)
LANGUAGE sql STABLE
AS $$
    WITH served AS (
        SELECT j.tenant_id, j.priority AS tier, count(*) AS n, sum(j.cost) AS c
        FROM pgqueue.jobs j
        WHERE j.started_at >= now() - service_window
        GROUP BY j.tenant_id, j.priority
    ), queued AS (
        SELECT j.tenant_id, j.priority AS tier, count(*) AS n, sum(j.cost) AS c
        FROM pgqueue.jobs j
        WHERE j.state = 'queued' AND j.enqueued_at <= now()
        GROUP BY j.tenant_id, j.priority
    )
    SELECT coalesce(s.tenant_id, q.tenant_id), coalesce(s.tier, q.tier),
           coalesce(s.n, 0), coalesce(s.c, 0)::double precision,
           coalesce(q.n, 0), coalesce(q.c, 0)::double precision,
           pgqueue.tenant_quantum(coalesce(s.tenant_id, q.tenant_id)),
           true
    FROM served s
    FULL JOIN queued q ON q.tenant_id = s.tenant_id AND q.tier = s.tier
$$;

CREATE VIEW pgqueue.tenant_service AS
SELECT w.window_name, w.service_window, ts.*
FROM (VALUES ('1m', interval '1 minute'), ('5m', interval '5 minutes'),
             ('1h', interval '1 hour')) AS w(window_name, service_window)
CROSS JOIN LATERAL pgqueue.tenant_service_in(w.service_window) ts;

-- Jain's index (Σx)²/(n·Σx²) over the tenants backlogged in the window, per tier and over all
-- tiers (tier NULL): x = cost served / quantum (weight-normalised), and x = cost served.
-- 1.0 when nobody was backlogged.
CREATE FUNCTION pgqueue.fairness_in(service_window interval)
RETURNS TABLE (tier pgqueue.tier, tenants bigint, jain_weighted double precision,
               jain_unweighted double precision)
LANGUAGE sql STABLE
AS $$
    WITH per_tenant AS (
        SELECT s.tier, s.tenant_id, sum(s.cost_served) AS c, max(s.quantum) AS q
        FROM pgqueue.tenant_service_in(service_window) s
        WHERE s.backlogged
        GROUP BY GROUPING SETS ((s.tier, s.tenant_id), (s.tenant_id))
    )
    SELECT p.tier, count(*),
           CASE WHEN sum((p.c / p.q) ^ 2) > 0
                THEN least(1.0, sum(p.c / p.q) ^ 2 / (count(*) * sum((p.c / p.q) ^ 2)))
                ELSE 1.0 END,
           CASE WHEN sum(p.c ^ 2) > 0
                THEN least(1.0, sum(p.c) ^ 2 / (count(*) * sum(p.c ^ 2)))
                ELSE 1.0 END
    FROM per_tenant p
    GROUP BY p.tier
$$;

CREATE VIEW pgqueue.fairness AS
SELECT w.window_name, w.service_window, f.*
FROM (VALUES ('1m', interval '1 minute'), ('5m', interval '5 minutes'),
             ('1h', interval '1 hour')) AS w(window_name, service_window)
CROSS JOIN LATERAL pgqueue.fairness_in(w.service_window) f;
