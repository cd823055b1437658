-- Scheduler v2 prototype: DRR's order as keys on the jobs (issue 28, phase 1).
--
-- A standalone schema `sched` for a scratch database: the shape pgqueue.jobs will take (lane,
-- key) and the scheduler's only state (one row per lane and tier, one per flow). Its oracle is
-- pgqueue.scheduling.keys.KeyedDrr; tests/db/test_scheduler_v2_proto.py compares the two and
-- bench/scheduler_v2/measure.py times it. Not loaded by pgqueue's migrations.
--
-- Key of a job: (key_round, key_place, key_seq). A flow (lane, tier, tenant) backlogged since it
-- joined in round R with credit 0 serves the job of cumulative cost S in round
-- R - 1 + ceil(S / quantum); within a round, flows go by place; a tenant that (re)joins takes a
-- place just before the cursor (the key of the last claimed job), in round cursor + 1.

CREATE SCHEMA sched;

-- A key, for the frontier: claims by a claimer that did not stamp stay at or below it.
CREATE TYPE sched.key AS (r bigint, place numeric, seq bigint);

CREATE TABLE sched.tenants (
    tenant_id text PRIMARY KEY,
    quantum   bigint NOT NULL DEFAULT 5000 CHECK (quantum > 0)  -- integer cost units
);

CREATE TABLE sched.jobs (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lane      text NOT NULL,                     -- model, or kind without a provider limit
    tier      smallint NOT NULL,                 -- 0 critical, 1 standard, 2 batch
    tenant_id text NOT NULL,
    cost      bigint NOT NULL CHECK (cost > 0),  -- integer cost units (input tokens, >= 1000)
    run_at    timestamptz NOT NULL DEFAULT now(),
    state     text NOT NULL DEFAULT 'queued',
    key_round bigint,                            -- NULL: not stamped yet
    key_place numeric,
    key_seq   bigint
);

-- The claim: one index range per lane and tier, in key order.
CREATE INDEX jobs_claim_idx ON sched.jobs (lane, tier, key_round, key_place, key_seq)
    WHERE state = 'queued' AND key_round IS NOT NULL;
-- The stamper: unstamped jobs per tenant in FIFO order (a skip scan finds the tenants).
CREATE INDEX jobs_unstamped_idx ON sched.jobs (lane, tier, tenant_id, run_at, id)
    WHERE state = 'queued' AND key_round IS NULL;
-- ... and by the moment they became due: what a fold has not seen yet.
CREATE INDEX jobs_unstamped_due_idx ON sched.jobs (lane, tier, run_at, tenant_id)
    WHERE state = 'queued' AND key_round IS NULL;

-- One row per lane and tier, written only by the holder of its advisory lock (the stamper).
CREATE TABLE sched.lane_tiers (
    lane     text NOT NULL,
    tier     smallint NOT NULL,
    seq      bigint NOT NULL DEFAULT 0,          -- last key_seq handed out
    frontier sched.key,                          -- claims stay <= it (NULL: no limit)
    folded_at timestamptz NOT NULL DEFAULT '-infinity',  -- jobs due since: new to a fold
    full_at timestamptz NOT NULL DEFAULT '-infinity',    -- the last fold that looked at all
    PRIMARY KEY (lane, tier)
);

-- The cursor: each claimer keeps the greatest key it claimed in a row of its own (no claimer
-- waits on another); the stamper takes the greatest. It survives retries of the jobs.
CREATE TABLE sched.cursors (
    lane      text NOT NULL,
    tier      smallint NOT NULL,
    worker_id text NOT NULL,
    k         sched.key NOT NULL,
    PRIMARY KEY (lane, tier, worker_id)
);

-- One row per tenant that was backlogged in a lane and tier: its place and where its last
-- stamped job left it. `cut`: due jobs were left unstamped by the horizon.
CREATE TABLE sched.flows (
    lane       text NOT NULL,
    tier       smallint NOT NULL,
    tenant_id  text NOT NULL,
    place      numeric NOT NULL,
    last_round bigint NOT NULL,
    last_seq   bigint NOT NULL,
    credit     bigint NOT NULL,
    cut        boolean NOT NULL,
    next_round bigint,                            -- if cut: the round of its next job
    PRIMARY KEY (lane, tier, tenant_id)
);
CREATE INDEX flows_place_idx ON sched.flows (lane, tier, place);
CREATE INDEX flows_cut_idx ON sched.flows (lane, tier, last_round, place, last_seq)
    WHERE cut;
CREATE INDEX flows_next_idx ON sched.flows (lane, tier, next_round) WHERE cut;

-- Stamp the unstamped due jobs of one lane and tier: joiners first (places in refill-offset
-- order between the last place before the cursor's and the cursor's), then every flow's jobs
-- up to `horizon` rounds past the cursor (at least one for a flow with none stamped). One
-- statement computes, two write (from arrays, so that the writes are key probes); the caller
-- holds the lane's advisory lock. Returns the number of jobs stamped. Never JIT-compiled: the
-- row estimates of the per-flow fetch are far too high.
CREATE OR REPLACE FUNCTION sched.stamp(p_lane text, p_tier smallint, p_horizon integer,
                                       p_full_seconds double precision DEFAULT 1)
RETURNS bigint LANGUAGE plpgsql SET jit = off SET enable_seqscan = off AS $$
DECLARE
    lt sched.lane_tiers;
    base bigint;
    cur sched.key;
    ids bigint[];
    rnds bigint[];
    places numeric[];
    seqs bigint[];
    flow_tenants text[];
    flow_places numeric[];
    flow_rounds bigint[];
    flow_seqs bigint[];
    flow_credits bigint[];
    flow_cuts boolean[];
    flow_nexts bigint[];
    look_at_all boolean;
BEGIN
    INSERT INTO sched.lane_tiers (lane, tier) VALUES (p_lane, p_tier) ON CONFLICT DO NOTHING;
    SELECT * INTO lt FROM sched.lane_tiers WHERE lane = p_lane AND tier = p_tier;
    cur := coalesce((SELECT c.k FROM sched.cursors c WHERE c.lane = p_lane AND c.tier = p_tier
                     ORDER BY c.k DESC LIMIT 1), ROW(0, 0, 0)::sched.key);
    -- the horizon counts from the next key to claim, or from the cursor if it is further on
    base := greatest(cur.r, (
        SELECT j.key_round FROM sched.jobs j
        WHERE j.lane = p_lane AND j.tier = p_tier AND j.state = 'queued'
          AND j.key_round IS NOT NULL
        ORDER BY j.key_round, j.key_place, j.key_seq LIMIT 1));
    look_at_all := lt.full_at < now() - make_interval(secs => p_full_seconds);
    -- The tenants to visit: those with jobs due since the last fold (a skip scan over the
    -- distinct (run_at, tenant) pairs), the flows the horizon cut that can go further, and,
    -- at most every p_full_seconds, every tenant with unstamped jobs (a job whose transaction
    -- began before the last fold and committed after it).
    WITH RECURSIVE arrived(run_at, tenant_id) AS (
        (SELECT j.run_at, j.tenant_id FROM sched.jobs j
         WHERE j.lane = p_lane AND j.tier = p_tier AND j.state = 'queued'
           AND j.key_round IS NULL AND j.run_at >= lt.folded_at AND j.run_at <= now()
         ORDER BY j.run_at, j.tenant_id LIMIT 1)
        UNION ALL
        SELECT n.run_at, n.tenant_id FROM arrived a, LATERAL (
            SELECT j.run_at, j.tenant_id FROM sched.jobs j
            WHERE j.lane = p_lane AND j.tier = p_tier AND j.state = 'queued'
              AND j.key_round IS NULL AND (j.run_at, j.tenant_id) > (a.run_at, a.tenant_id)
              AND j.run_at <= now()
            ORDER BY j.run_at, j.tenant_id LIMIT 1) n
    ), everyone(tenant_id) AS (
        (SELECT j.tenant_id FROM sched.jobs j
         WHERE look_at_all AND j.lane = p_lane AND j.tier = p_tier AND j.state = 'queued'
           AND j.key_round IS NULL
         ORDER BY j.tenant_id LIMIT 1)
        UNION ALL
        SELECT (SELECT j.tenant_id FROM sched.jobs j
                WHERE j.lane = p_lane AND j.tier = p_tier AND j.state = 'queued'
                  AND j.key_round IS NULL AND j.tenant_id > p.tenant_id
                ORDER BY j.tenant_id LIMIT 1)
        FROM everyone p WHERE p.tenant_id IS NOT NULL
    ), pending(tenant_id) AS (
        SELECT a.tenant_id FROM arrived a
        UNION
        SELECT f.tenant_id FROM sched.flows f
        WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut AND f.next_round <= base + p_horizon
        UNION       -- ... and those whose stamped jobs were all claimed (at least one more)
        SELECT f.tenant_id FROM sched.flows f
        WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut
          AND (f.last_round, f.place, f.last_seq) <= (cur.r, cur.place, cur.seq)
        UNION
        SELECT e.tenant_id FROM everyone e
    ), flows_in AS (
        SELECT p.tenant_id, f.place, f.last_round, f.last_seq, f.credit,
               coalesce(t.quantum, 5000) AS q,
               coalesce(f.cut OR h.holds_one, false) AS continuing,
               coalesce(h.holds_one, false) AS holds_one
        FROM pending p
        LEFT JOIN sched.flows f ON (f.lane, f.tier, f.tenant_id) = (p_lane, p_tier, p.tenant_id)
        LEFT JOIN sched.tenants t ON t.tenant_id = p.tenant_id
        -- still queued, the flow's last stamped job says that it holds stamped work
        LEFT JOIN LATERAL (SELECT EXISTS (
            SELECT FROM sched.jobs j
            WHERE j.lane = p_lane AND j.tier = p_tier AND j.state = 'queued'
              AND (j.key_round, j.key_place, j.key_seq) = (f.last_round, f.place, f.last_seq))
            AS holds_one) h ON true
        WHERE p.tenant_id IS NOT NULL
    ), joiners AS (
        SELECT tenant_id, count(*) OVER () AS m,
               row_number() OVER (ORDER BY ('x' || left(encode(sha256(convert_to(tenant_id,
                   'UTF8')), 'hex'), 8))::bit(32)::bigint, tenant_id COLLATE "C") AS i
        FROM flows_in WHERE NOT continuing
    ), pred AS (
        SELECT max(f.place) AS place FROM sched.flows f
        WHERE f.lane = p_lane AND f.tier = p_tier AND f.place < cur.place
    ), starts AS (
        SELECT fi.tenant_id, fi.q, fi.holds_one,
               CASE WHEN fi.continuing THEN fi.place
                    WHEN pred.place IS NULL THEN cur.place - (jn.m + 1 - jn.i)
                    ELSE pred.place + (cur.place - pred.place) * jn.i / (jn.m + 1)
               END AS place,
               CASE WHEN fi.continuing THEN fi.last_round ELSE cur.r END AS r0,
               CASE WHEN fi.continuing THEN fi.credit ELSE 0 END AS d0,
               CASE WHEN fi.continuing THEN fi.last_seq ELSE 0 END AS s0
        FROM flows_in fi LEFT JOIN joiners jn USING (tenant_id) CROSS JOIN pred
    ), fetched AS (   -- each flow's next due jobs: a cost is >= 1000 units, so one more than
                      -- can fall within the horizon (a row left over = the flow is cut)
        SELECT s.*, j.id, j.cost, count(*) OVER (PARTITION BY s.tenant_id) AS n_fetched,
               row_number() OVER w AS k, (sum(j.cost) OVER w)::bigint AS cum
        FROM starts s CROSS JOIN LATERAL (
            SELECT j.id, j.cost, j.run_at FROM sched.jobs j
            WHERE j.lane = p_lane AND j.tier = p_tier AND j.tenant_id = s.tenant_id
              AND j.state = 'queued' AND j.key_round IS NULL AND j.run_at <= now()
            ORDER BY j.run_at, j.id
            LIMIT greatest(2, (p_horizon + 1 + base - s.r0) * s.q / 1000 + 1)) j
        WINDOW w AS (PARTITION BY s.tenant_id ORDER BY j.run_at, j.id)
    ), kept AS (
        SELECT f.*, r.rnd, r.rnd <= base + p_horizon OR (f.k = 1 AND NOT f.holds_one)
                               AS keep
        FROM fetched f, LATERAL (SELECT f.r0 + greatest(0, (f.cum - f.d0 + f.q - 1) / f.q)) r(rnd)
    ), numbered AS (
        SELECT k.*, lt.seq + row_number() OVER (ORDER BY k.tenant_id, k.k) AS sq
        FROM kept k WHERE k.keep
    ), last AS (     -- where each flow's last stamped job leaves it (or where it was)
        SELECT DISTINCT ON (s.tenant_id) s.tenant_id, s.place,
               coalesce(n.rnd, s.r0) AS last_round, coalesce(n.sq, s.s0) AS last_seq,
               coalesce(n.d0 + (n.rnd - n.r0) * n.q - n.cum, s.d0) AS credit, c.cut,
               c.next_round
        FROM starts s
        JOIN (SELECT k.tenant_id, bool_or(NOT k.keep) AS cut,
                     min(k.rnd) FILTER (WHERE NOT k.keep) AS next_round
              FROM kept k GROUP BY k.tenant_id) c USING (tenant_id)
        LEFT JOIN numbered n USING (tenant_id)
        ORDER BY s.tenant_id, n.k DESC NULLS LAST
    )
    SELECT n.ids, n.rnds, n.places, n.seqs, l.tenants, l.places, l.rounds, l.seqs, l.credits,
           l.cuts, l.nexts
    INTO ids, rnds, places, seqs, flow_tenants, flow_places, flow_rounds, flow_seqs,
         flow_credits, flow_cuts, flow_nexts
    FROM (SELECT array_agg(id) AS ids, array_agg(rnd) AS rnds, array_agg(place) AS places,
                 array_agg(sq) AS seqs FROM numbered) n,
         (SELECT array_agg(tenant_id) AS tenants, array_agg(place) AS places,
                 array_agg(last_round) AS rounds, array_agg(last_seq) AS seqs,
                 array_agg(credit) AS credits, array_agg(cut) AS cuts,
                 array_agg(next_round) AS nexts FROM last) l;
    UPDATE sched.jobs j SET key_round = u.r, key_place = u.p, key_seq = u.s
    FROM unnest(ids, rnds, places, seqs) AS u(id, r, p, s) WHERE j.id = u.id;
    INSERT INTO sched.flows AS f
        (lane, tier, tenant_id, place, last_round, last_seq, credit, cut, next_round)
    SELECT p_lane, p_tier, u.*
    FROM unnest(flow_tenants, flow_places, flow_rounds, flow_seqs, flow_credits, flow_cuts,
                flow_nexts) u
    ON CONFLICT (lane, tier, tenant_id) DO UPDATE
    SET place = excluded.place, last_round = excluded.last_round, last_seq = excluded.last_seq,
        credit = excluded.credit, cut = excluded.cut, next_round = excluded.next_round;
    UPDATE sched.lane_tiers l
    SET seq = l.seq + coalesce(cardinality(ids), 0),
        folded_at = now(),
        full_at = CASE WHEN look_at_all THEN now() ELSE l.full_at END,
        frontier = (SELECT ROW(f.last_round, f.place, f.last_seq)::sched.key FROM sched.flows f
                    WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut
                    ORDER BY f.last_round, f.place, f.last_seq LIMIT 1)
    WHERE l.lane = p_lane AND l.tier = p_tier;
    RETURN coalesce(cardinality(ids), 0);
END
$$;

-- Stamp if nobody else is stamping this lane and tier (a try-lock: never waits).
CREATE OR REPLACE FUNCTION sched.fold(p_lane text, p_tier smallint, p_horizon integer)
RETURNS bigint LANGUAGE sql AS $$
    SELECT CASE WHEN pg_try_advisory_xact_lock(hashtextextended(p_lane, p_tier))
                THEN sched.stamp(p_lane, p_tier, p_horizon) ELSE 0 END
$$;

-- Claim up to `n` jobs of one lane and tier in key order, side by side with other claimers
-- (after a fold when `stamp_first`): stamped jobs only, never past the frontier.
CREATE OR REPLACE FUNCTION sched.claim(p_lane text, p_tier smallint, n integer,
                                       p_worker text DEFAULT 'w', p_horizon integer DEFAULT 4,
                                       stamp_first boolean DEFAULT true)
RETURNS SETOF sched.jobs LANGUAGE plpgsql AS $$
DECLARE
    fr sched.key;
BEGIN
    IF stamp_first THEN
        PERFORM sched.fold(p_lane, p_tier, p_horizon);
    END IF;
    fr := (SELECT l.frontier FROM sched.lane_tiers l WHERE l.lane = p_lane AND l.tier = p_tier);
    RETURN QUERY
    WITH picked AS (
        SELECT j.id FROM sched.jobs j
        WHERE j.lane = p_lane AND j.tier = p_tier AND j.state = 'queued'
          AND j.key_round IS NOT NULL
          AND (fr IS NULL OR (j.key_round, j.key_place, j.key_seq)
                             <= ((fr).r, (fr).place, (fr).seq))
        ORDER BY j.key_round, j.key_place, j.key_seq
        LIMIT n FOR UPDATE SKIP LOCKED
    ), taken AS (
        UPDATE sched.jobs j SET state = 'running' FROM picked WHERE j.id = picked.id
        RETURNING j.*
    ), moved AS (
        INSERT INTO sched.cursors AS c (lane, tier, worker_id, k)
        SELECT p_lane, p_tier, p_worker, ROW(t.key_round, t.key_place, t.key_seq)::sched.key
        FROM taken t ORDER BY t.key_round DESC, t.key_place DESC, t.key_seq DESC LIMIT 1
        ON CONFLICT (lane, tier, worker_id) DO UPDATE SET k = greatest(c.k, excluded.k)
    )
    SELECT * FROM taken t ORDER BY t.key_round, t.key_place, t.key_seq;
END
$$;

-- What runs next, per lane and tier, in claim order (`round` counted from the cursor).
CREATE OR REPLACE VIEW sched.claim_order AS
SELECT j.lane, j.tier, j.tenant_id, j.id AS job_id, j.cost,
       j.key_round - coalesce(c.r, 0) AS round, j.key_place AS place, j.key_seq AS seq
FROM sched.jobs j
LEFT JOIN LATERAL (SELECT (x.k).r FROM sched.cursors x WHERE (x.lane, x.tier) = (j.lane, j.tier)
                   ORDER BY x.k DESC LIMIT 1) c ON true
WHERE j.state = 'queued' AND j.key_round IS NOT NULL
ORDER BY j.lane, j.tier, j.key_round, j.key_place, j.key_seq;
