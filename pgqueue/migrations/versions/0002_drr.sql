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

-- ---------------------------------------------------------------------------- DRR steps
-- These run only inside pgqueue.drr_dispatch, under its advisory lock. The tier's round state
-- (turn, tail, round) travels in INOUT parameters and is written once per claim.

-- The pair has no due job: it leaves the round with its deficit reset (idle tenants bank no
-- credit) and waits until its next job is due; with nothing queued the row goes. A due job
-- that someone else holds locked is looked at again a second later.
CREATE FUNCTION pgqueue.drr_leave(p_tier pgqueue.tier, p_tenant text)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    next_due timestamptz;
BEGIN
    SELECT j.run_at INTO next_due
    FROM pgqueue.jobs j
    WHERE j.tenant_id = p_tenant AND j.priority = p_tier AND j.state = 'queued'
    ORDER BY j.run_at, j.id
    LIMIT 1;
    IF next_due IS NULL THEN
        DELETE FROM pgqueue.deficits d WHERE d.tenant_id = p_tenant AND d.tier = p_tier;
    ELSE
        UPDATE pgqueue.deficits d
        SET pos = NULL, deficit = 0,
            due_at = CASE WHEN next_due > now() THEN next_due
                          ELSE now() + interval '1 second' END
        WHERE d.tenant_id = p_tenant AND d.tier = p_tier;
    END IF;
END
$$;

-- Does the tier have a due job now? Probes pairs in round order, then the waiting ones; pairs
-- without a due job leave the round (so each is probed once until its work is due again).
CREATE FUNCTION pgqueue.drr_tier_eligible(p_tier pgqueue.tier, INOUT turn_tenant text,
                                          OUT eligible boolean)
LANGUAGE plpgsql
AS $$
DECLARE
    p record;
BEGIN
    eligible := false;
    FOR p IN
        SELECT d.tenant_id FROM pgqueue.deficits d
        WHERE d.tier = p_tier AND d.due_at <= now()
        ORDER BY d.pos NULLS LAST
    LOOP
        PERFORM 1 FROM pgqueue.jobs j
        WHERE j.tenant_id = p.tenant_id AND j.priority = p_tier AND j.state = 'queued'
          AND j.run_at <= now()
        ORDER BY j.run_at, j.id
        LIMIT 1
        FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            eligible := true;
            RETURN;
        END IF;
        PERFORM pgqueue.drr_leave(p_tier, p.tenant_id);
        IF p.tenant_id = turn_tenant THEN
            turn_tenant := NULL;
        END IF;
    END LOOP;
END
$$;

-- One DrrScheduler.next() of the tier: the job to serve, and whether it was the tenant's last
-- due job (the caller then takes the job and calls drr_leave, which must see it gone). With
-- p_absorb, waiting pairs that are due first join the tail of the round sorted by
-- (refill offset, tenant id): the staggered refill order.
CREATE FUNCTION pgqueue.drr_next(p_tier pgqueue.tier, p_base double precision,
                                 p_absorb boolean,
                                 INOUT turn_tenant text, INOUT next_pos bigint,
                                 INOUT round bigint, INOUT round_end_pos bigint,
                                 OUT tenant_id text, OUT job_id bigint,
                                 OUT cost double precision, OUT emptied boolean)
LANGUAGE plpgsql
AS $$
DECLARE
    p record;
    h record;
    joined bigint;
BEGIN
    IF p_absorb THEN
        WITH waiting AS (
            SELECT d.tenant_id,
                   row_number() OVER (ORDER BY d.refill_offset, d.tenant_id COLLATE "C") AS rn
            FROM pgqueue.deficits d
            WHERE d.tier = p_tier AND d.pos IS NULL AND d.due_at <= now()
        )
        UPDATE pgqueue.deficits d
        SET pos = drr_next.next_pos + w.rn - 1
        FROM waiting w
        WHERE d.tier = p_tier AND d.tenant_id = w.tenant_id;
        GET DIAGNOSTICS joined = ROW_COUNT;
        next_pos := next_pos + joined;
    END IF;
    LOOP
        SELECT d.tenant_id, d.deficit, d.pos,
               pgqueue.plan_quantum(t.plan, t.quantum, p_base) AS quantum
        INTO p
        FROM pgqueue.deficits d
        LEFT JOIN pgqueue.tenants t ON t.tenant_id = d.tenant_id
        WHERE d.tier = p_tier AND d.pos IS NOT NULL
        ORDER BY d.pos
        LIMIT 1;
        EXIT WHEN NOT FOUND;
        IF turn_tenant IS DISTINCT FROM p.tenant_id THEN  -- its turn begins: one quantum
            IF p.pos > round_end_pos THEN
                round := round + 1;
                round_end_pos := next_pos - 1;
            END IF;
            turn_tenant := p.tenant_id;
            p.deficit := p.deficit + p.quantum;
        END IF;
        SELECT j.id, j.cost, j.run_at INTO h
        FROM pgqueue.jobs j
        WHERE j.tenant_id = p.tenant_id AND j.priority = p_tier AND j.state = 'queued'
          AND j.run_at <= now()
        ORDER BY j.run_at, j.id
        LIMIT 1
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            PERFORM pgqueue.drr_leave(p_tier, p.tenant_id);
            turn_tenant := NULL;
            CONTINUE;
        END IF;
        IF h.cost <= p.deficit THEN
            tenant_id := p.tenant_id;
            job_id := h.id;
            cost := h.cost;
            UPDATE pgqueue.deficits d SET deficit = p.deficit - h.cost
            WHERE d.tenant_id = p.tenant_id AND d.tier = p_tier;
            PERFORM 1 FROM pgqueue.jobs j
            WHERE j.tenant_id = p.tenant_id AND j.priority = p_tier AND j.state = 'queued'
              AND j.run_at <= now() AND (j.run_at, j.id) > (h.run_at, h.id)
            ORDER BY j.run_at, j.id
            LIMIT 1;
            emptied := NOT FOUND;
            IF emptied THEN
                turn_tenant := NULL;
            END IF;
            RETURN;
        END IF;
        -- The head costs more than the credit left: the turn ends, the deficit carries over.
        UPDATE pgqueue.deficits d SET deficit = p.deficit, pos = drr_next.next_pos
        WHERE d.tenant_id = p.tenant_id AND d.tier = p_tier;
        next_pos := next_pos + 1;
        turn_tenant := NULL;
    END LOOP;
END
$$;

-- ------------------------------------------------------------------------------- claim

-- Decide and take up to max_jobs jobs, one dispatch at a time exactly as max_jobs single-job
-- claims would: tier pick (pgqueue.tier_policy), then DRR within the tier; the deficits and
-- the tier state are written in this transaction. A transaction-scoped advisory lock
-- serialises the decisions of concurrent claimers (held for the milliseconds of one batch).
-- Must run in READ COMMITTED, so that each statement sees what the previous claim committed.
CREATE FUNCTION pgqueue.drr_dispatch(max_jobs integer, worker_id text,
                                     lease_seconds double precision)
RETURNS TABLE (claim_tier pgqueue.tier, claim_round bigint, claimed pgqueue.jobs)
LANGUAGE plpgsql
AS $$
DECLARE
    tiers constant pgqueue.tier[] := '{critical,standard,batch}';
    policy constant text := pgqueue.tier_policy();
    base constant double precision := pgqueue.base_quantum();
    weight double precision[] := '{0,0,0}';
    cur double precision[] := '{0,0,0}';
    turn text[] := '{NULL,NULL,NULL}';
    npos bigint[] := '{1,1,1}';
    rnd bigint[] := '{0,0,0}';
    rend bigint[] := '{0,0,0}';
    elig boolean[] := '{f,f,f}';
    absorb boolean[];
    taken integer := 0;
    repaired boolean := false;
    i integer;
    best integer;
    total double precision;
    s record;
    e record;
    nx record;
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

        absorb := '{f,f,f}';
        FOR s IN
            SELECT DISTINCT d.tier FROM pgqueue.deficits d
            WHERE d.pos IS NULL AND d.due_at <= now()
        LOOP
            absorb[array_position(tiers, s.tier)] := true;
        END LOOP;
        FOR i IN 1 .. 3 LOOP
            SELECT * INTO e FROM pgqueue.drr_tier_eligible(tiers[i], turn[i]);
            elig[i] := e.eligible;
            turn[i] := e.turn_tenant;
        END LOOP;

        WHILE taken < max_jobs LOOP
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

            SELECT * INTO nx
            FROM pgqueue.drr_next(tiers[best], base, absorb[best], turn[best], npos[best],
                                  rnd[best], rend[best]);
            absorb[best] := false;
            turn[best] := nx.turn_tenant;
            npos[best] := nx.next_pos;
            rnd[best] := nx.round;
            rend[best] := nx.round_end_pos;
            IF nx.job_id IS NULL THEN
                elig[best] := false;
                CONTINUE;
            END IF;
            UPDATE pgqueue.jobs j
            SET state = 'running',
                attempts = j.attempts + 1,
                started_at = clock_timestamp(),
                worker_id = drr_dispatch.worker_id,
                lease_token = gen_random_uuid(),
                lease_expires_at = now() + make_interval(secs => lease_seconds)
            WHERE j.id = nx.job_id AND j.tenant_id = nx.tenant_id
            RETURNING j.* INTO claimed;
            IF nx.emptied THEN
                PERFORM pgqueue.drr_leave(tiers[best], nx.tenant_id);
                SELECT * INTO e FROM pgqueue.drr_tier_eligible(tiers[best], turn[best]);
                elig[best] := e.eligible;
                turn[best] := e.turn_tenant;
            END IF;
            claim_tier := tiers[best];
            claim_round := rnd[best];
            taken := taken + 1;
            RETURN NEXT;
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
    UPDATE pgqueue.tier_state ts
    SET swrr_current = cur[array_position(tiers, ts.tier)],
        turn_tenant = turn[array_position(tiers, ts.tier)],
        next_pos = npos[array_position(tiers, ts.tier)],
        round = rnd[array_position(tiers, ts.tier)],
        round_end_pos = rend[array_position(tiers, ts.tier)];
END
$$;

-- The claim: up to max_jobs jobs, leased to worker_id for lease_seconds, in dispatch order.
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
