-- The claim's scheduler: pgqueue.drr_dispatch picks a tier per job (weighted, probabilistic
-- or strict policy over the tier weights of tier_state) and, within the tier, a tenant by
-- Deficit Round Robin over pgqueue.deficits; it folds new work from drr_inbox into the rounds,
-- locks the jobs it takes (SKIP LOCKED), leases them and writes the DRR state back.
-- docs/drr.md walks through it step by step (the first load, turns, round skips, buffers).

-- Decide and take up to max_jobs jobs, one dispatch at a time exactly as max_jobs single-job
-- claims would: tier pick (pgqueue.tier_policy), then DRR within the tier
-- (pgqueue.scheduling.drr.DrrScheduler.next); the deficits and the tier state are written in
-- this transaction. A transaction-scoped advisory lock serialises the decisions of concurrent
-- claimers (held for the milliseconds of one batch). Must run in READ COMMITTED, so that each
-- claim sees what the previous one committed.
--
-- Cost per dispatch (docs/drr.md): the state of the round head of each tier (tenant, deficit,
-- quantum) and a buffer of its next due jobs live in variables, so a dispatch that continues a
-- tenant's turn runs no statement at all. Statements run per turn and per batch (lock, inbox,
-- one UPDATE of all the taken jobs, deficits and tier state). Jobs taken earlier in the batch
-- are still 'queued' to this transaction's later statements, so every lookup of a tenant's
-- queue excludes them (`picked`). Generic plans, no sequential scans, no JIT (its SET
-- options): the statements' plans must not change with the data.
CREATE OR REPLACE FUNCTION pgqueue.drr_dispatch(
    max_jobs integer,
    worker_id text,
    lease_seconds double precision
)
RETURNS TABLE(claim_tier pgqueue.tier, claim_round bigint, claimed pgqueue.jobs)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
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
    filled boolean[] := '{t,t,t}';       -- the round has members (as loaded)
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
    -- turns of this dispatch that ended without serving; at `idle_limit` of them (64, doubled
    -- after each skip within the dispatch) the rounds in which no pair of the tier can pay
    -- are skipped (revision 0022)
    idle integer := 0;
    idle_limit integer := 64;
    skip_k double precision;
    all_due boolean;
    i integer;
    b integer;
    k integer;
    n integer;
    off integer;
    lim integer;
    best integer;
    total double precision;
    t text;
    ld record;                           -- a row of the claim's first load (revision 0020)
    ri integer;
    got_head boolean;
    inbox_folded boolean;                -- this pass folded the inbox in (revision 0020)
    share integer[] := '{0,0,0}';        -- per tier, its likely part of the claim (0020)
    -- the pair after the round head, loaded with it by the claim's first load (revision 0020):
    -- tenant, deficit, quantum, pos, and its next due jobs, locked, in buffer slots laid out
    -- like the head's (nn[i] of them; ndone[i]: nothing due after them). It becomes the head
    -- when the head's turn ends or the head leaves the round.
    nt text[] := '{NULL,NULL,NULL}';
    ndef double precision[] := '{0,0,0}';
    nq double precision[] := '{0,0,0}';
    nxpos bigint[] := '{0,0,0}';
    nn integer[] := '{0,0,0}';
    ndone boolean[] := '{f,f,f}';
    n_id bigint[] := array_fill(NULL::bigint, ARRAY[3 * stride]);
    n_cost double precision[] := array_fill(NULL::double precision, ARRAY[3 * stride]);
    n_run timestamptz[] := array_fill(NULL::timestamptz, ARRAY[3 * stride]);
    -- turns that ended, their pairs not yet moved to the tail of the round in pgqueue.deficits
    -- (the next load of that round's head does it, else the batch write): tenant, tier, the
    -- deficit carried over, the new pos; rt/rdef/rpos: those of the tier at hand
    rot_ts text[] := '{}';
    rot_tiers pgqueue.tier[] := '{}';
    rot_defs double precision[] := '{}';
    rot_poss bigint[] := '{}';
    rt text[];
    rtr pgqueue.tier[];
    rdef double precision[];
    rpos bigint[];
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
    -- the pairs of the first load after the pair after the head (revision 0025), in (tier,
    -- pos) order: tier, tenant, deficit, quantum, pos, loaded jobs (qp_n of them, from
    -- qp_off + 1 in qj_*), nothing due after them; qnext: per tier, its next queued pair
    qp_ord integer[];
    qp_t text[];
    qp_def double precision[];
    qp_q double precision[];
    qp_pos bigint[];
    qp_n integer[];
    qp_done boolean[];
    qp_off integer[];
    qj_id bigint[];
    qj_cost double precision[];
    qj_run timestamptz[];
    qnext integer[] := '{0,0,0}';
    depth integer[] := '{2,2,2}';
    qi integer;
    qn integer;
    -- the round's next pairs, read at once to take in memory the turns that end without
    -- serving (revision 0028): tenant, deficit, quantum, pos, next due job (locked; NULL: none);
    -- w_rot: the pair's entry in rot_* once its turn ended here (0: none yet)
    w_t text[];
    w_def double precision[];
    w_q double precision[];
    w_pos bigint[];
    w_id bigint[];
    w_cost double precision[];
    w_run timestamptz[];
    w_rot integer[];
    -- a pair that can pay: its jobs as a head load reads them (w_pn of them, from w_poff + 1
    -- in wj_*; w_plim: the head load's limit)
    w_pn integer[];
    w_plim integer[];
    w_poff integer[];
    wj_id bigint[];
    wj_cost double precision[];
    wj_run timestamptz[];
    wr record;
    w_lim integer;
    w_size integer;                      -- pairs to read next: doubles at each read
    w_turns integer;                     -- turns taken in memory since the first read
    -- per tier, the pairs the first read takes: the turns the tier's last run in memory took,
    -- plus one, or half the last size if more (1: no run yet, or runs of no turns)
    w_first integer[] := '{1,1,1}';
    wn integer;
    wi integer;
    w_all boolean;                       -- the read holds the whole round
    w_out boolean;                       -- the loop takes the next turn
    w_def2 double precision;
    -- per tier, the position of the last pair whose turn ended: every pair still in the round
    -- lies after it (revision 0028)
    lo_pos bigint[] := '{-9223372036854775808,-9223372036854775808,-9223372036854775808}';
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
        -- With the inbox empty and no move to write (a claim's usual case while no new work
        -- comes in), the first load below finds out both instead (revision 0020).
        inbox_folded := cardinality(rot_ts) > 0 OR EXISTS (SELECT 1 FROM pgqueue.drr_inbox);
        IF inbox_folded AND cardinality(rot_ts) = 0 AND NOT repaired THEN
            -- Fold the inbox in; the first load below finds out per tier whether due pairs
            -- wait and whether the round has members (revision 0026).
            WITH drained AS (
                DELETE FROM pgqueue.drr_inbox RETURNING tier, tenant_id
            )
            INSERT INTO pgqueue.deficits AS d (tenant_id, tier, refill_offset)
            SELECT DISTINCT x.tenant_id, x.tier, pgqueue.refill_offset(x.tenant_id)
            FROM drained x
            ON CONFLICT (tenant_id, tier) DO UPDATE SET due_at = '-infinity'
            WHERE d.pos IS NULL;
        ELSIF inbox_folded THEN
            -- One statement (revision 0014): fold the inbox in, then per tier whether due pairs wait
            -- (they join the round at the tier's next dispatch) and whether the round has members.
            -- The EXISTS read the snapshot from before the upsert: the pairs it folded in (new, or
            -- waiting and now due) come from its RETURNING.
            WITH drained AS (
                DELETE FROM pgqueue.drr_inbox RETURNING tier, tenant_id
            ), folded AS (
                INSERT INTO pgqueue.deficits AS d (tenant_id, tier, refill_offset)
                SELECT DISTINCT x.tenant_id, x.tier, pgqueue.refill_offset(x.tenant_id) FROM drained x
                ON CONFLICT (tenant_id, tier) DO UPDATE SET due_at = '-infinity'
                WHERE d.pos IS NULL
                RETURNING d.tier
            )
            SELECT array_agg(EXISTS (SELECT 1 FROM pgqueue.deficits d
                                     WHERE d.tier = t.tier AND d.pos IS NULL AND d.due_at <= now())
                             OR EXISTS (SELECT 1 FROM folded f WHERE f.tier = t.tier)
                             ORDER BY t.ord),
                   array_agg(EXISTS (SELECT 1 FROM pgqueue.deficits d
                                     WHERE d.tier = t.tier AND d.pos IS NOT NULL)
                             ORDER BY t.ord)
            INTO absorb, filled
            FROM unnest(tiers) WITH ORDINALITY AS t(tier, ord);
        END IF;
        recheck := '{t,t,t}';
        -- The round head of every tier that has one, and the pair after it when the head's
        -- credit cannot fill the claim, each with its next due jobs, locked, in one statement
        -- (revision 0020): the per-tier loads below run only once these are used up. It also
        -- says, per tier, whether the round has members and whether due pairs wait. It runs on
        -- the claim's first pass, after a fold too (revision 0026).
        -- (and after a fold, on the claim's first pass: revision 0026)
        IF NOT inbox_folded OR (cardinality(rot_ts) = 0 AND NOT repaired) THEN
            -- A tier's likely part of the claim: under the weighted policy its share of the
            -- weights, else all of it; the pair after the head is loaded when the head's credit
            -- cannot cover that part (loading it costs about what a later load of it would).
            -- (revision 0025) among the tiers with a turn in progress, and itself: a tier
            -- alone in use takes the whole claim (a guess for how much to read; it decides
            -- nothing else)
            FOR ri IN 1 .. 3 LOOP
                total := CASE WHEN ri = 1 OR turn[1] IS NOT NULL THEN weight[1] ELSE 0 END
                         + CASE WHEN ri = 2 OR turn[2] IS NOT NULL THEN weight[2] ELSE 0 END
                         + CASE WHEN ri = 3 OR turn[3] IS NOT NULL THEN weight[3] ELSE 0 END;
                share[ri] := CASE WHEN policy IN ('strict', 'probabilistic') OR total <= 0
                                  THEN max_jobs
                                  ELSE ceil(max_jobs * weight[ri] / total)::integer END;
                -- pairs to read: enough for its share at the base quantum (capped before the
                -- cast: a base quantum set far below the tenants' floor must not overflow it)
                depth[ri] := greatest(2, least(max_jobs + 1,
                                               ceil(share[ri] / nullif(base, 0)) + 1)::integer);
            END LOOP;
            qp_ord := '{}';
            qp_t := '{}';
            qp_def := '{}';
            qp_q := '{}';
            qp_pos := '{}';
            qp_n := '{}';
            qp_done := '{}';
            qp_off := '{}';
            qj_id := '{}';
            qj_cost := '{}';
            qj_run := '{}';
            qnext := '{0,0,0}';
            FOR ld IN
                SELECT p.ord, p.rank, p.absorb, p.tenant_id, p.deficit, p.pos, p.quantum,
                       p.lim, f.ids, f.costs, f.runs
                FROM (SELECT rr.ord, rr.tier, rr.absorb, rr.rank, rr.tenant_id, rr.deficit,
                             rr.pos, rr.quantum,
                             -- at most floor(credit) jobs (cost >= 1) fit in its turn, and the
                             -- head's credit comes first
                             least((max_jobs - taken)::double precision - rr.ahead,
                                   rr.cap)::integer + 1 AS lim,
                             rr.ahead
                      FROM (SELECT tt.ord, tt.tier, tt.absorb, c.tenant_id, c.deficit, c.pos,
                                   c.quantum, c.cap, row_number() OVER w AS rank,
                                   sum(c.cap) OVER w - c.cap AS ahead
                            FROM (SELECT u.tier, u.ord,
                                         EXISTS (SELECT 1 FROM pgqueue.deficits d
                                                 WHERE d.tier = u.tier AND d.pos IS NULL
                                                   AND d.due_at <= now()) AS absorb
                                  FROM unnest(tiers) WITH ORDINALITY AS u(tier, ord)
                                  WHERE ht[u.ord] IS NULL AND nt[u.ord] IS NULL
                                  OFFSET 0) tt  -- one probe per tier (revision 0025)
                            LEFT JOIN LATERAL (
                                SELECT h.tenant_id, h.deficit, h.pos, q.quantum,
                                       floor(h.deficit
                                             + CASE WHEN h.tenant_id = turn[tt.ord] THEN 0
                                                    ELSE q.quantum END) AS cap
                                FROM (SELECT d.tenant_id, d.deficit, d.pos
                                      FROM pgqueue.deficits d
                                      WHERE d.tier = tt.tier AND d.pos IS NOT NULL
                                      ORDER BY d.pos
                                      LIMIT depth[tt.ord]) h
                                -- one probe per pair, not a merge join over every tenant
                                -- (revision 0027)
                                LEFT JOIN LATERAL (
                                    SELECT tq.plan, tq.quantum FROM pgqueue.tenants tq
                                    WHERE tq.tenant_id = h.tenant_id
                                    OFFSET 0) tn ON true
                                CROSS JOIN LATERAL (
                                    SELECT pgqueue.plan_quantum(tn.plan, tn.quantum, base)
                                           AS quantum) q) c ON true
                            WINDOW w AS (PARTITION BY tt.ord ORDER BY c.pos)) rr
                      WHERE rr.rank = 1 OR rr.ahead < least(max_jobs - taken, share[rr.ord])) p
                CROSS JOIN LATERAL (
                    SELECT array_agg(y.id) AS ids,
                           array_agg(y.cost) AS costs,
                           array_agg(y.run_at) AS runs
                    FROM (SELECT j.id, j.cost, j.run_at FROM pgqueue.jobs j
                          WHERE j.tenant_id = p.tenant_id AND j.priority = p.tier
                            AND j.state = 'queued' AND j.run_at <= now()
                            AND (j.tenant_id, j.priority, j.run_at, j.id)
                                > (p.tenant_id, p.tier, '-infinity'::timestamptz,
                                   -9223372036854775808)
                            AND j.id <> ALL (picked)
                          ORDER BY j.tenant_id, j.priority, j.run_at, j.id
                          LIMIT p.lim
                          FOR UPDATE SKIP LOCKED) y) f
                ORDER BY p.ord, p.rank
            LOOP
                i := ld.ord;
                absorb[i] := ld.absorb;
                filled[i] := ld.tenant_id IS NOT NULL;
                CONTINUE WHEN ld.tenant_id IS NULL;
                off := (i - 1) * stride;
                n := coalesce(array_length(ld.ids, 1), 0);
                IF ld.rank = 1 THEN
                    ht[i] := ld.tenant_id;
                    hdef[i] := ld.deficit;
                    hq[i] := ld.quantum;
                    hpos[i] := ld.pos;
                    hdirty[i] := false;
                    IF n > 0 THEN
                        b_id[off + 1 : off + n] := ld.ids;
                        b_cost[off + 1 : off + n] := ld.costs;
                        b_run[off + 1 : off + n] := ld.runs;
                    END IF;
                    bt[i] := ld.tenant_id;
                    bn[i] := n;
                    bat[i] := 1;
                    bdone[i] := n < ld.lim;
                ELSIF ld.rank = 2 THEN
                    nt[i] := ld.tenant_id;
                    ndef[i] := ld.deficit;
                    nq[i] := ld.quantum;
                    nxpos[i] := ld.pos;
                    IF n > 0 THEN
                        n_id[off + 1 : off + n] := ld.ids;
                        n_cost[off + 1 : off + n] := ld.costs;
                        n_run[off + 1 : off + n] := ld.runs;
                    END IF;
                    nn[i] := n;
                    ndone[i] := n < ld.lim;
                ELSE  -- a later pair: queued behind the pair after the head (revision 0025)
                    qp_ord := qp_ord || i;
                    qp_t := qp_t || ld.tenant_id;
                    qp_def := qp_def || ld.deficit;
                    qp_q := qp_q || ld.quantum;
                    qp_pos := qp_pos || ld.pos;
                    qp_n := qp_n || n;
                    qp_done := qp_done || (n < ld.lim);
                    qp_off := qp_off || cardinality(qj_id);
                    IF n > 0 THEN
                        qj_id := qj_id || ld.ids;
                        qj_cost := qj_cost || ld.costs;
                        qj_run := qj_run || ld.runs;
                    END IF;
                    IF qnext[i] = 0 THEN
                        qnext[i] := cardinality(qp_t);
                    END IF;
                END IF;
            END LOOP;
        END IF;

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
                -- An empty round and no due pair waiting (as loaded): not eligible.
                CONTINUE WHEN NOT filled[i] AND NOT absorb[i] AND ht[i] IS NULL;
                LOOP
                    -- (an empty round as folded has no head to load: revision 0018)
                    IF ht[i] IS NULL AND nt[i] IS NOT NULL THEN
                        -- the pair after the head, loaded with it (revision 0020), is the head now
                        ht[i] := nt[i];
                        hdef[i] := ndef[i];
                        hq[i] := nq[i];
                        hpos[i] := nxpos[i];
                        hdirty[i] := false;
                        n := nn[i];
                        IF n > 0 THEN
                            b_id[off + 1 : off + n] := n_id[off + 1 : off + n];
                            b_cost[off + 1 : off + n] := n_cost[off + 1 : off + n];
                            b_run[off + 1 : off + n] := n_run[off + 1 : off + n];
                        END IF;
                        bt[i] := nt[i];
                        bn[i] := n;
                        bat[i] := 1;
                        bdone[i] := ndone[i];
                        nt[i] := NULL;
                        IF qnext[i] > 0 THEN  -- the next queued pair of the tier takes its place (revision 0025)
                            qi := qnext[i];
                            nt[i] := qp_t[qi];
                            ndef[i] := qp_def[qi];
                            nq[i] := qp_q[qi];
                            nxpos[i] := qp_pos[qi];
                            qn := qp_n[qi];
                            IF qn > 0 THEN
                                n_id[off + 1 : off + qn] := qj_id[qp_off[qi] + 1 : qp_off[qi] + qn];
                                n_cost[off + 1 : off + qn] := qj_cost[qp_off[qi] + 1 : qp_off[qi] + qn];
                                n_run[off + 1 : off + qn] := qj_run[qp_off[qi] + 1 : qp_off[qi] + qn];
                            END IF;
                            nn[i] := qn;
                            ndone[i] := qp_done[qi];
                            qnext[i] := CASE WHEN qi < cardinality(qp_t) AND qp_ord[qi + 1] = i
                                               THEN qi + 1 ELSE 0 END;
                        END IF;
                    ELSIF ht[i] IS NULL AND filled[i] THEN
                        -- the tier's turns that ended, to write first
                        rt := '{}';
                        rdef := '{}';
                        rpos := '{}';
                        FOR ri IN 1 .. cardinality(rot_ts) LOOP
                            IF rot_tiers[ri] = tr THEN
                                rt := rt || rot_ts[ri];
                                rdef := rdef || rot_defs[ri];
                                rpos := rpos || rot_poss[ri];
                            END IF;
                        END LOOP;
                        -- Load the round head (after moving a pair to the tail, if one is pending) and
                        -- fetch its next due jobs into the buffer, in one statement.
                        WITH rotated AS (
                            UPDATE pgqueue.deficits d SET deficit = u.deficit, pos = u.pos
                            FROM unnest(rt, rdef, rpos) AS u(tenant_id, deficit, pos)
                            WHERE d.tenant_id = u.tenant_id AND d.tier = tr
                            RETURNING d.tenant_id, d.deficit, d.pos
                        ), head AS (
                            SELECT h.tenant_id, h.deficit, h.pos
                            FROM ((SELECT d.tenant_id, d.deficit, d.pos FROM pgqueue.deficits d
                                   WHERE d.tier = tr AND d.pos IS NOT NULL
                                     AND d.tenant_id <> ALL (rt)
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
                            SELECT array_agg(y.id) AS ids,
                                   array_agg(y.cost) AS costs,
                                   array_agg(y.run_at) AS runs
                            FROM (SELECT j.id, j.cost, j.run_at FROM pgqueue.jobs j
                                  WHERE j.tenant_id = head.tenant_id AND j.priority = tr
                                    AND j.state = 'queued' AND j.run_at <= now()
                                    AND (j.tenant_id, j.priority, j.run_at, j.id)
                                        > (head.tenant_id, tr, '-infinity'::timestamptz, -9223372036854775808)
                                    AND j.id <> ALL (picked)
                                  ORDER BY j.tenant_id, j.priority, j.run_at, j.id
                                  LIMIT l.lim
                                  FOR UPDATE SKIP LOCKED) y) f;
                        got_head := FOUND;
                        IF cardinality(rt) > 0 THEN  -- written: keep the other tiers' moves only
                            rt := '{}';
                            rtr := '{}';
                            rdef := '{}';
                            rpos := '{}';
                            FOR ri IN 1 .. cardinality(rot_ts) LOOP
                                IF rot_tiers[ri] <> tr THEN
                                    rt := rt || rot_ts[ri];
                                    rtr := rtr || rot_tiers[ri];
                                    rdef := rdef || rot_defs[ri];
                                    rpos := rpos || rot_poss[ri];
                                END IF;
                            END LOOP;
                            rot_ts := rt;
                            rot_tiers := rtr;
                            rot_defs := rdef;
                            rot_poss := rpos;
                        END IF;
                        IF got_head THEN
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
                        -- the order due waiting pairs join the round in (revision 0023)
                        ORDER BY d.due_at, d.refill_offset, d.tenant_id COLLATE "C"
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
                        SELECT array_agg(x.id),
                               array_agg(x.cost),
                               array_agg(x.run_at)
                        INTO f_id, f_cost, f_run
                        FROM (SELECT j.id, j.cost, j.run_at FROM pgqueue.jobs j
                              WHERE j.tenant_id = t AND j.priority = tr
                                AND j.state = 'queued' AND j.run_at <= now()
                                AND (j.tenant_id, j.priority, j.run_at, j.id) > (t, tr, a_run, a_id)
                                AND j.id <> ALL (picked)
                              ORDER BY j.tenant_id, j.priority, j.run_at, j.id
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
                    ORDER BY j.tenant_id, j.priority, j.run_at, j.id
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
            filled := '{t,t,t}';  -- later rechecks see a round that may have changed
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
            idle := 0;
            idle_limit := 64;
            LOOP
                -- From the fourth turn of this dispatch that ended without serving, after a
                -- round skip, and at once where the tier's last run in memory took turns, the
                -- turns that end so are taken in memory (revision 0028), with the loop's
                -- arithmetic, over the round's next pairs read at once; the loop takes the turn
                -- of the first pair that can pay, has nothing due, or whose turn would reach
                -- the skip.
                IF idle < 3 AND idle_limit = 64 AND w_first[b] = 1 THEN
                    NULL;  -- (the usual case, decided with one expression)
                ELSIF ht[b] IS NULL AND nt[b] IS NULL AND turn[b] IS NULL
                      AND idle + 1 < idle_limit THEN
                    w_out := false;
                    w_size := greatest(w_first[b], 2);
                    w_turns := 0;
                    LOOP
                        -- the tier's turns that ended, to write first
                        rt := '{}';
                        rdef := '{}';
                        rpos := '{}';
                        FOR ri IN 1 .. cardinality(rot_ts) LOOP
                            IF rot_tiers[ri] = tr THEN
                                rt := rt || rot_ts[ri];
                                rdef := rdef || rot_defs[ri];
                                rpos := rpos || rot_poss[ri];
                            END IF;
                        END LOOP;
                        -- the turns left before the skip, and the pair after them
                        w_lim := least(w_size, idle_limit - idle);  -- (w_size <= 256)
                        w_size := least(w_size * 2, 256);
                        w_t := '{}';
                        w_def := '{}';
                        w_q := '{}';
                        w_pos := '{}';
                        w_id := '{}';
                        w_cost := '{}';
                        w_run := '{}';
                        w_pn := '{}';
                        w_plim := '{}';
                        w_poff := '{}';
                        wj_id := '{}';
                        wj_cost := '{}';
                        wj_run := '{}';
                        FOR wr IN
                        WITH rotated AS (
                            UPDATE pgqueue.deficits d SET deficit = u.deficit, pos = u.pos
                            FROM unnest(rt, rdef, rpos) AS u(tenant_id, deficit, pos)
                            WHERE d.tenant_id = u.tenant_id AND d.tier = tr
                            RETURNING d.tenant_id, d.deficit, d.pos
                        ), win AS (
                            SELECT h.tenant_id, h.deficit, h.pos
                            FROM ((SELECT d.tenant_id, d.deficit, d.pos FROM pgqueue.deficits d
                                   WHERE d.tier = tr AND d.pos > lo_pos[b]
                                     AND d.tenant_id <> ALL (rt)
                                   ORDER BY d.pos
                                   LIMIT w_lim)
                                  UNION ALL
                                  SELECT r.tenant_id, r.deficit, r.pos FROM rotated r) h
                            ORDER BY h.pos
                            LIMIT w_lim
                        )
                            SELECT w.tenant_id, w.deficit, q.quantum, w.pos, f.id, f.cost,
                                   f.run_at, pl.lim, pj.ids, pj.costs, pj.runs
                            FROM win w
                            LEFT JOIN LATERAL (
                                SELECT tq.plan, tq.quantum FROM pgqueue.tenants tq
                                WHERE tq.tenant_id = w.tenant_id
                                OFFSET 0) tn ON true
                            CROSS JOIN LATERAL (
                                SELECT pgqueue.plan_quantum(tn.plan, tn.quantum, base) AS quantum) q
                            LEFT JOIN LATERAL (
                                SELECT j.id, j.cost, j.run_at FROM pgqueue.jobs j
                                WHERE j.tenant_id = w.tenant_id AND j.priority = tr
                                  AND j.state = 'queued' AND j.run_at <= now()
                                  AND (j.tenant_id, j.priority, j.run_at, j.id)
                                      > (w.tenant_id, tr, '-infinity'::timestamptz,
                                         -9223372036854775808)
                                  AND j.id <> ALL (picked)
                                ORDER BY j.tenant_id, j.priority, j.run_at, j.id
                                LIMIT 1
                                FOR UPDATE SKIP LOCKED) f ON true
                            CROSS JOIN LATERAL (  -- as a head load: at most floor(credit) jobs
                                SELECT least((max_jobs - taken)::double precision,
                                             floor(w.deficit + q.quantum))::integer + 1 AS lim) pl
                            -- a pair that can pay gets the jobs a head load would give it
                            CROSS JOIN LATERAL (
                                SELECT array_agg(y.id) AS ids,
                                       array_agg(y.cost) AS costs,
                                       array_agg(y.run_at) AS runs
                                FROM (SELECT j.id, j.cost, j.run_at FROM pgqueue.jobs j
                                      WHERE f.cost <= w.deficit + q.quantum
                                        AND j.tenant_id = w.tenant_id AND j.priority = tr
                                        AND j.state = 'queued' AND j.run_at <= now()
                                        AND (j.tenant_id, j.priority, j.run_at, j.id)
                                            > (w.tenant_id, tr, '-infinity'::timestamptz,
                                               -9223372036854775808)
                                        AND j.id <> ALL (picked)
                                      ORDER BY j.tenant_id, j.priority, j.run_at, j.id
                                      LIMIT pl.lim
                                      FOR UPDATE SKIP LOCKED) y) pj
                            ORDER BY w.pos
                        LOOP
                            w_t := w_t || wr.tenant_id;
                            w_def := w_def || wr.deficit;
                            w_q := w_q || wr.quantum;
                            w_pos := w_pos || wr.pos;
                            w_id := w_id || wr.id;
                            w_cost := w_cost || wr.cost;
                            w_run := w_run || wr.run_at;
                            w_plim := w_plim || wr.lim;
                            w_poff := w_poff || cardinality(wj_id);
                            w_pn := w_pn || coalesce(cardinality(wr.ids), 0);
                            IF wr.ids IS NOT NULL THEN
                                wj_id := wj_id || wr.ids;
                                wj_cost := wj_cost || wr.costs;
                                wj_run := wj_run || wr.runs;
                            END IF;
                        END LOOP;
                        IF cardinality(rt) > 0 THEN  -- written: keep the other tiers' moves only
                            rt := '{}';
                            rtr := '{}';
                            rdef := '{}';
                            rpos := '{}';
                            FOR ri IN 1 .. cardinality(rot_ts) LOOP
                                IF rot_tiers[ri] <> tr THEN
                                    rt := rt || rot_ts[ri];
                                    rtr := rtr || rot_tiers[ri];
                                    rdef := rdef || rot_defs[ri];
                                    rpos := rpos || rot_poss[ri];
                                END IF;
                            END LOOP;
                            rot_ts := rt;
                            rot_tiers := rtr;
                            rot_defs := rdef;
                            rot_poss := rpos;
                        END IF;
                        wn := coalesce(cardinality(w_t), 0);
                        EXIT WHEN wn = 0;  -- an empty round: the loop finds no head either
                        w_all := wn < w_lim;
                        w_rot := array_fill(0, ARRAY[wn]);
                        wi := 1;
                        WHILE wi <= cardinality(w_t) LOOP
                            IF w_cost[wi] IS NULL OR w_cost[wi] <= w_def[wi] + w_q[wi]
                               OR idle + 1 >= idle_limit THEN
                                -- the loop takes this turn: the pair is the round head (a pair
                                -- whose move is still to write, the loop loads again, after it)
                                IF w_rot[wi] = 0 THEN
                                    ht[b] := w_t[wi];
                                    hdef[b] := w_def[wi];
                                    hq[b] := w_q[wi];
                                    hpos[b] := w_pos[wi];
                                    hdirty[b] := false;
                                    bt[b] := w_t[wi];
                                    bat[b] := 1;
                                    IF w_cost[wi] IS NULL THEN
                                        bn[b] := 0;
                                        bdone[b] := true;
                                    ELSIF w_pn[wi] > 0 THEN  -- it can pay: a head load's jobs
                                        n := w_pn[wi];
                                        b_id[off + 1 : off + n] :=
                                            wj_id[w_poff[wi] + 1 : w_poff[wi] + n];
                                        b_cost[off + 1 : off + n] :=
                                            wj_cost[w_poff[wi] + 1 : w_poff[wi] + n];
                                        b_run[off + 1 : off + n] :=
                                            wj_run[w_poff[wi] + 1 : w_poff[wi] + n];
                                        bn[b] := n;
                                        bdone[b] := n < w_plim[wi];
                                    ELSE
                                        b_id[off + 1] := w_id[wi];
                                        b_cost[off + 1] := w_cost[wi];
                                        b_run[off + 1] := w_run[wi];
                                        bn[b] := 1;
                                        bdone[b] := false;
                                    END IF;
                                END IF;
                                w_out := true;
                                EXIT;
                            END IF;
                            -- its turn begins (one quantum) and ends without serving: the
                            -- deficit carries over and the pair moves to the tail of the round
                            IF w_pos[wi] > rend[b] THEN
                                rnd[b] := rnd[b] + 1;
                                rend[b] := npos[b] - 1;
                            END IF;
                            w_def2 := w_def[wi] + w_q[wi];
                            IF w_rot[wi] = 0 THEN
                                rot_ts := rot_ts || w_t[wi];
                                rot_tiers := rot_tiers || tr;
                                rot_defs := rot_defs || w_def2;
                                rot_poss := rot_poss || npos[b];
                                k := cardinality(rot_ts);
                            ELSE
                                k := w_rot[wi];
                                rot_defs[k] := w_def2;
                                rot_poss[k] := npos[b];
                            END IF;
                            lo_pos[b] := w_pos[wi];
                            IF w_all THEN  -- the whole round is here: the pair comes round again
                                w_t := w_t || w_t[wi];
                                w_def := w_def || w_def2;
                                w_q := w_q || w_q[wi];
                                w_pos := w_pos || npos[b];
                                w_id := w_id || w_id[wi];
                                w_cost := w_cost || w_cost[wi];
                                w_run := w_run || w_run[wi];
                                w_rot := w_rot || k;
                            END IF;
                            npos[b] := npos[b] + 1;
                            idle := idle + 1;
                            w_turns := w_turns + 1;
                            wi := wi + 1;
                        END LOOP;
                        EXIT WHEN w_out;  -- else the pairs read are used up: read the next ones
                    END LOOP;
                    -- (halved per run at most: runs of few turns between long ones)
                    w_first[b] := least(greatest(w_turns + 1, w_first[b] / 2), 256);
                END IF;
                IF ht[b] IS NULL AND nt[b] IS NOT NULL THEN
                    -- the pair after the head, loaded with it (revision 0020), is the head now
                    ht[b] := nt[b];
                    hdef[b] := ndef[b];
                    hq[b] := nq[b];
                    hpos[b] := nxpos[b];
                    hdirty[b] := false;
                    n := nn[b];
                    IF n > 0 THEN
                        b_id[off + 1 : off + n] := n_id[off + 1 : off + n];
                        b_cost[off + 1 : off + n] := n_cost[off + 1 : off + n];
                        b_run[off + 1 : off + n] := n_run[off + 1 : off + n];
                    END IF;
                    bt[b] := nt[b];
                    bn[b] := n;
                    bat[b] := 1;
                    bdone[b] := ndone[b];
                    nt[b] := NULL;
                    IF qnext[b] > 0 THEN  -- the next queued pair of the tier takes its place (revision 0025)
                        qi := qnext[b];
                        nt[b] := qp_t[qi];
                        ndef[b] := qp_def[qi];
                        nq[b] := qp_q[qi];
                        nxpos[b] := qp_pos[qi];
                        qn := qp_n[qi];
                        IF qn > 0 THEN
                            n_id[off + 1 : off + qn] := qj_id[qp_off[qi] + 1 : qp_off[qi] + qn];
                            n_cost[off + 1 : off + qn] := qj_cost[qp_off[qi] + 1 : qp_off[qi] + qn];
                            n_run[off + 1 : off + qn] := qj_run[qp_off[qi] + 1 : qp_off[qi] + qn];
                        END IF;
                        nn[b] := qn;
                        ndone[b] := qp_done[qi];
                        qnext[b] := CASE WHEN qi < cardinality(qp_t) AND qp_ord[qi + 1] = b
                                           THEN qi + 1 ELSE 0 END;
                    END IF;
                ELSIF ht[b] IS NULL THEN
                    -- the tier's turns that ended, to write first
                    rt := '{}';
                    rdef := '{}';
                    rpos := '{}';
                    FOR ri IN 1 .. cardinality(rot_ts) LOOP
                        IF rot_tiers[ri] = tr THEN
                            rt := rt || rot_ts[ri];
                            rdef := rdef || rot_defs[ri];
                            rpos := rpos || rot_poss[ri];
                        END IF;
                    END LOOP;
                    -- Load the round head (after moving a pair to the tail, if one is pending) and
                    -- fetch its next due jobs into the buffer, in one statement.
                    WITH rotated AS (
                        UPDATE pgqueue.deficits d SET deficit = u.deficit, pos = u.pos
                        FROM unnest(rt, rdef, rpos) AS u(tenant_id, deficit, pos)
                        WHERE d.tenant_id = u.tenant_id AND d.tier = tr
                        RETURNING d.tenant_id, d.deficit, d.pos
                    ), head AS (
                        SELECT h.tenant_id, h.deficit, h.pos
                        FROM ((SELECT d.tenant_id, d.deficit, d.pos FROM pgqueue.deficits d
                               -- after the last pair whose turn ended (revision 0028)
                               WHERE d.tier = tr AND d.pos > lo_pos[b]
                                 AND d.tenant_id <> ALL (rt)
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
                        SELECT array_agg(y.id) AS ids,
                               array_agg(y.cost) AS costs,
                               array_agg(y.run_at) AS runs
                        FROM (SELECT j.id, j.cost, j.run_at FROM pgqueue.jobs j
                              WHERE j.tenant_id = head.tenant_id AND j.priority = tr
                                AND j.state = 'queued' AND j.run_at <= now()
                                AND (j.tenant_id, j.priority, j.run_at, j.id)
                                    > (head.tenant_id, tr, '-infinity'::timestamptz, -9223372036854775808)
                                AND j.id <> ALL (picked)
                              ORDER BY j.tenant_id, j.priority, j.run_at, j.id
                              LIMIT l.lim
                              FOR UPDATE SKIP LOCKED) y) f;
                    got_head := FOUND;
                    IF cardinality(rt) > 0 THEN  -- written: keep the other tiers' moves only
                        rt := '{}';
                        rtr := '{}';
                        rdef := '{}';
                        rpos := '{}';
                        FOR ri IN 1 .. cardinality(rot_ts) LOOP
                            IF rot_tiers[ri] <> tr THEN
                                rt := rt || rot_ts[ri];
                                rtr := rtr || rot_tiers[ri];
                                rdef := rdef || rot_defs[ri];
                                rpos := rpos || rot_poss[ri];
                            END IF;
                        END LOOP;
                        rot_ts := rt;
                        rot_tiers := rtr;
                        rot_defs := rdef;
                        rot_poss := rpos;
                    END IF;
                    EXIT WHEN NOT got_head;
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
                    SELECT array_agg(x.id),
                           array_agg(x.cost),
                           array_agg(x.run_at)
                    INTO f_id, f_cost, f_run
                    FROM (SELECT j.id, j.cost, j.run_at FROM pgqueue.jobs j
                          WHERE j.tenant_id = t AND j.priority = tr
                            AND j.state = 'queued' AND j.run_at <= now()
                            AND (j.tenant_id, j.priority, j.run_at, j.id) > (t, tr, a_run, a_id)
                            AND j.id <> ALL (picked)
                          ORDER BY j.tenant_id, j.priority, j.run_at, j.id
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
                    ORDER BY j.tenant_id, j.priority, j.run_at, j.id
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
                -- (noted: written by the next load of this round's head, else by the
                -- batch write; the pair after it, if loaded, is the head now)
                rot_ts := rot_ts || t;
                rot_tiers := rot_tiers || tr;
                rot_defs := rot_defs || hdef[b];
                rot_poss := rot_poss || npos[b];
                lo_pos[b] := hpos[b];
                npos[b] := npos[b] + 1;
                turn[b] := NULL;
                ht[b] := NULL;
                hdirty[b] := false;
                -- Skip the rounds in which no pair of the tier can pay for its next due job
                -- (revision 0022): k = one less than the fewest turns any pair still needs;
                -- k quanta for every pair and k more rounds, the pairs' order unchanged. Not
                -- when a pair has no due job: it leaves the round at its turn.
                idle := idle + 1;
                IF idle >= idle_limit THEN
                    -- the tier's turns that ended, to write first
                    rt := '{}';
                    rdef := '{}';
                    rpos := '{}';
                    FOR ri IN 1 .. cardinality(rot_ts) LOOP
                        IF rot_tiers[ri] = tr THEN
                            rt := rt || rot_ts[ri];
                            rdef := rdef || rot_defs[ri];
                            rpos := rpos || rot_poss[ri];
                        END IF;
                    END LOOP;
                    WITH rotated AS (
                        UPDATE pgqueue.deficits d SET deficit = u.deficit, pos = u.pos
                        FROM unnest(rt, rdef, rpos) AS u(tenant_id, deficit, pos)
                        WHERE d.tenant_id = u.tenant_id AND d.tier = tr
                        RETURNING d.tenant_id, d.deficit
                    ), pairs AS (
                        SELECT coalesce(r.deficit, d.deficit) AS deficit, q.quantum, h.cost
                        FROM pgqueue.deficits d
                        LEFT JOIN rotated r ON r.tenant_id = d.tenant_id
                        LEFT JOIN pgqueue.tenants tn ON tn.tenant_id = d.tenant_id
                        CROSS JOIN LATERAL (
                            SELECT pgqueue.plan_quantum(tn.plan, tn.quantum, base) AS quantum) q
                        LEFT JOIN LATERAL (
                            SELECT j.cost FROM pgqueue.jobs j
                            WHERE j.tenant_id = d.tenant_id AND j.priority = tr
                              AND j.state = 'queued' AND j.run_at <= now()
                              AND (j.tenant_id, j.priority, j.run_at, j.id)
                                  > (d.tenant_id, tr, '-infinity'::timestamptz,
                                     -9223372036854775808)
                              AND j.id <> ALL (picked)
                            ORDER BY j.tenant_id, j.priority, j.run_at, j.id
                            LIMIT 1
                            FOR UPDATE SKIP LOCKED) h ON true
                        WHERE d.tier = tr AND d.pos IS NOT NULL
                    )
                    SELECT min(ceil((p.cost - p.deficit) / p.quantum)) - 1,
                           bool_and(p.cost IS NOT NULL)
                    INTO skip_k, all_due
                    FROM pairs p;
                    IF cardinality(rt) > 0 THEN  -- written: keep the other tiers' moves only
                        rt := '{}';
                        rtr := '{}';
                        rdef := '{}';
                        rpos := '{}';
                        FOR ri IN 1 .. cardinality(rot_ts) LOOP
                            IF rot_tiers[ri] <> tr THEN
                                rt := rt || rot_ts[ri];
                                rtr := rtr || rot_tiers[ri];
                                rdef := rdef || rot_defs[ri];
                                rpos := rpos || rot_poss[ri];
                            END IF;
                        END LOOP;
                        rot_ts := rt;
                        rot_tiers := rtr;
                        rot_defs := rdef;
                        rot_poss := rpos;
                    END IF;
                    -- (below 1e15 rounds: a cost or quantum outside the constraints, in a row
                    -- older than them, is left to the turns one by one)
                    IF all_due AND skip_k >= 1 AND skip_k < 1e15 THEN
                        UPDATE pgqueue.deficits d
                        SET deficit = d.deficit + skip_k * q.quantum
                        FROM (SELECT p.tenant_id,
                                     pgqueue.plan_quantum(tn.plan, tn.quantum, base) AS quantum
                              FROM pgqueue.deficits p
                              LEFT JOIN pgqueue.tenants tn ON tn.tenant_id = p.tenant_id
                              WHERE p.tier = tr AND p.pos IS NOT NULL) q
                        WHERE d.tier = tr AND d.tenant_id = q.tenant_id;
                        rnd[b] := rnd[b] + skip_k::bigint;
                    END IF;
                    nt[b] := NULL;  -- its deficit may have changed: the round is loaded again
                    qnext[b] := 0;  -- and the pairs queued after it (revision 0025)
                    idle := 0;
                    idle_limit := idle_limit * 2;
                END IF;
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
    -- The batch write below counts its own rows (revision 0017): the update trigger skips
    -- them while this names this transaction (a value set any other way never matches).
    PERFORM set_config('pgqueue.claim_counted', pg_current_xact_id()::text, true);
    RETURN QUERY
    WITH flushed AS (
        -- and the pairs whose turns ended, to the tail of their rounds (revision 0020)
        UPDATE pgqueue.deficits d SET deficit = u.deficit, pos = coalesce(u.pos, d.pos)
        FROM unnest(ht || rot_ts, tiers || rot_tiers, hdef || rot_defs,
                    hdirty || array_fill(true, ARRAY[cardinality(rot_ts)]),
                    '{NULL,NULL,NULL}'::bigint[] || rot_poss)
             AS u(tenant_id, tier, deficit, dirty, pos)
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
    ), counted AS (
        -- The queued counters of the jobs taken, per (tier, tenant) and per tier, into the
        -- keys' claim rows (revision 0017): only claims write them, one at a time under the
        -- scheduler lock, so this never waits.
        INSERT INTO pgqueue.queue_counts AS c (tier, tenant_id, queued, claim_stripe)
        SELECT k.tier, k.tenant_id, -count(*), true
        FROM (SELECT t.tier, (t.j).tenant_id AS tenant_id FROM took t) k
        GROUP BY GROUPING SETS ((k.tier, k.tenant_id), (k.tier))
        ON CONFLICT (tier, (coalesce(tenant_id, ''))) WHERE claim_stripe
        DO UPDATE SET queued = c.queued + EXCLUDED.queued
    )
    SELECT took.tier, took.round, took.j FROM took ORDER BY took.ord;
    PERFORM set_config('pgqueue.claim_counted', '', true);
END
$$;
