"""Scheduler v2 (issue 28): the fair order as keys on the jobs, one DRR per lane and tier.

Adds ``pgqueue.jobs.lane`` (generated: the model of a Messages API job, else the kind) and the
key columns (``key_round``, ``key_place``, ``key_seq``; NULL = unstamped: every job starts
unstamped), their partial indexes, and the scheduler's state (``lane_tiers``, ``flows``,
``cursors``); replaces the claim (``claim``, ``claim_admitted`` and the new ``claim_lanes``,
``claim_keyed``, ``stamp``, ``fold``: 070_scheduler.sql, 071_claim.sql) and the
``claim_order`` view; drops ``drr_dispatch``, ``claim_preview``, the DRR inbox (its triggers,
functions and table), ``deficits`` and ``tier_state``. Every drop is ``IF EXISTS``: on a fresh
database the baseline has the new schema already, and the revisions after it (0033, 0036,
0038) put back only old function texts, which this one replaces.

Downgrade drops what this adds and restores the v1 scheduler (texts copied below, as of
revision 0039); the DRR state starts empty.

Revision ID: 0042
Revises: 0041
"""

from __future__ import annotations

from alembic import op

revision = "0042"
down_revision = "0041"
branch_labels = None
depends_on = None

DROP_V1 = """\
DROP VIEW IF EXISTS pgqueue.claim_order;
DROP TRIGGER IF EXISTS jobs_drr_requeue ON pgqueue.jobs;
DROP FUNCTION IF EXISTS pgqueue.drr_note_requeued();
DROP FUNCTION IF EXISTS pgqueue.drr_note_inserted();
DROP FUNCTION IF EXISTS pgqueue.claim_preview(integer);
DROP FUNCTION IF EXISTS pgqueue.drr_dispatch(integer, text, double precision);
DROP TABLE IF EXISTS pgqueue.deficits, pgqueue.tier_state, pgqueue.drr_inbox;
"""

JOBS_COLUMNS = """\
ALTER TABLE pgqueue.jobs
    ADD COLUMN IF NOT EXISTS lane text GENERATED ALWAYS AS (
CASE
    WHEN ((kind = 'anthropic.messages'::text) AND (model IS NOT NULL)) THEN model
    ELSE kind
END) STORED,
    ADD COLUMN IF NOT EXISTS key_round bigint,
    ADD COLUMN IF NOT EXISTS key_place numeric,
    ADD COLUMN IF NOT EXISTS key_seq bigint;
"""

TABLES = """\
CREATE INDEX IF NOT EXISTS jobs_claim_idx ON pgqueue.jobs USING btree (lane, priority, key_round, key_place, key_seq) WHERE ((state = 'queued'::pgqueue.job_state) AND (key_round IS NOT NULL));

CREATE INDEX IF NOT EXISTS jobs_unstamped_idx ON pgqueue.jobs USING btree (lane, priority, tenant_id, run_at, id) WHERE ((state = 'queued'::pgqueue.job_state) AND (key_round IS NULL));

CREATE INDEX IF NOT EXISTS jobs_unstamped_due_idx ON pgqueue.jobs USING btree (lane, priority, run_at, tenant_id) WHERE ((state = 'queued'::pgqueue.job_state) AND (key_round IS NULL));

CREATE TABLE IF NOT EXISTS pgqueue.lane_tiers (
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

CREATE TABLE IF NOT EXISTS pgqueue.flows (
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

CREATE INDEX IF NOT EXISTS flows_place_idx ON pgqueue.flows USING btree (lane, tier, place);

CREATE INDEX IF NOT EXISTS flows_cut_idx ON pgqueue.flows USING btree (lane, tier, last_round, place, last_seq) WHERE cut;

CREATE TABLE IF NOT EXISTS pgqueue.cursors (
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

CREATE INDEX IF NOT EXISTS cursors_key_idx ON pgqueue.cursors USING btree (lane, tier, key_round, key_place, key_seq);
"""

SCHEDULER = """\
DROP TRIGGER IF EXISTS jobs_unstamp ON pgqueue.jobs;

-- The scheduler (docs/drr.md): Deficit Round Robin's order as sort keys on the jobs, one DRR
-- per lane (rate-limit pool: the model of a Messages API job, else the kind) and tier. Its
-- pure reference is pgqueue.scheduling.keys.KeyedDrr (tests/db/test_drr_claim.py compares).
--
-- A job's key is (key_round, key_place, key_seq): a tenant backlogged since it joined in round
-- R with credit 0 serves the job of cumulative cost S in round R - 1 + ceil(S / quantum);
-- within a round the tenants go by place; a tenant that (re)joins takes a place just before
-- the cursor (the key of the last claimed job), in the cursor's round. Jobs arrive unstamped;
-- a claimer that wins the lane and tier's try-lock stamps them (pgqueue.fold), every claimer
-- takes stamped jobs in key order (pgqueue.claim_keyed), side by side. Costs and quanta are
-- integer cost units: round(cost * 1000), one unit per estimated input token.

-- stable_offset() of pgqueue.scheduling.drr: first 4 bytes of SHA-256, big-endian. The order
-- in which tenants that join in the same fold take their places.
CREATE OR REPLACE FUNCTION pgqueue.refill_offset(tenant_id text)
RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT ('x' || left(encode(sha256(convert_to(tenant_id, 'UTF8')), 'hex'), 8))::bit(32)::bigint
$$;

-- Stamp the unstamped due jobs of one lane and tier; the caller holds its try-lock
-- (pgqueue.fold). Joiners first (places in refill_offset order between the last place before
-- the cursor's and the cursor's), then each flow's jobs in FIFO order up to `p_horizon` rounds
-- past the next key to claim (at least one job for a flow with none stamped): one tenant's
-- million jobs cost a fold a few rounds of them. One statement computes, two write (from
-- arrays, so that the writes are key probes). Returns the number of jobs stamped.
CREATE OR REPLACE FUNCTION pgqueue.stamp(p_lane text, p_tier pgqueue.tier, p_horizon integer)
RETURNS bigint
LANGUAGE plpgsql
SET jit TO 'off'
SET enable_seqscan TO 'off'
AS $$
DECLARE
    lt pgqueue.lane_tiers;
    cr bigint;
    cp numeric;
    cs bigint;
    base bigint;
    look_at_all boolean;
    ids bigint[]; tenants text[]; rnds bigint[]; places numeric[]; seqs bigint[];
    f_tenants text[]; f_places numeric[]; f_rounds bigint[]; f_seqs bigint[];
    f_credits bigint[]; f_cuts boolean[]; f_nexts bigint[];
BEGIN
    INSERT INTO pgqueue.lane_tiers (lane, tier) VALUES (p_lane, p_tier) ON CONFLICT DO NOTHING;
    SELECT * INTO lt FROM pgqueue.lane_tiers l WHERE l.lane = p_lane AND l.tier = p_tier;
    SELECT c.key_round, c.key_place, c.key_seq INTO cr, cp, cs
    FROM pgqueue.cursors c WHERE c.lane = p_lane AND c.tier = p_tier
    ORDER BY c.key_round DESC, c.key_place DESC, c.key_seq DESC LIMIT 1;
    cr := coalesce(cr, 0); cp := coalesce(cp, 0); cs := coalesce(cs, 0);
    -- rows of claimers behind the cursor and quiet for a minute say nothing the greatest does not
    DELETE FROM pgqueue.cursors c WHERE c.ctid IN (
        SELECT x.ctid FROM pgqueue.cursors x
        WHERE x.lane = p_lane AND x.tier = p_tier AND x.moved_at < now() - interval '1 minute'
          AND (x.key_round, x.key_place, x.key_seq) < (cr, cp, cs)
        FOR UPDATE SKIP LOCKED);
    base := greatest(cr, (SELECT j.key_round FROM pgqueue.jobs j
                          WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
                            AND j.key_round IS NOT NULL
                          ORDER BY j.key_round, j.key_place, j.key_seq LIMIT 1));
    look_at_all := lt.full_at < now() - interval '1 second';
    -- The tenants to visit: those with jobs due since the last fold (a skip scan over the
    -- distinct (run_at, tenant) pairs), the flows the horizon cut that may go on, and at most
    -- once a second every tenant with unstamped due jobs (a job whose transaction began
    -- before the last fold and committed after it).
    WITH RECURSIVE arrived(run_at, tenant_id) AS (
        (SELECT j.run_at, j.tenant_id FROM pgqueue.jobs j
         WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
           AND j.key_round IS NULL AND j.run_at >= lt.folded_at AND j.run_at <= now()
         ORDER BY j.run_at, j.tenant_id LIMIT 1)
        UNION ALL
        SELECT n.run_at, n.tenant_id FROM arrived a, LATERAL (
            SELECT j.run_at, j.tenant_id FROM pgqueue.jobs j
            WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
              AND j.key_round IS NULL AND (j.run_at, j.tenant_id) > (a.run_at, a.tenant_id)
              AND j.run_at <= now()
            ORDER BY j.run_at, j.tenant_id LIMIT 1) n
    ), everyone(tenant_id) AS (
        (SELECT j.tenant_id FROM pgqueue.jobs j
         WHERE look_at_all AND j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
           AND j.key_round IS NULL
         ORDER BY j.tenant_id LIMIT 1)
        UNION ALL
        SELECT (SELECT j.tenant_id FROM pgqueue.jobs j
                WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
                  AND j.key_round IS NULL AND j.tenant_id > e.tenant_id
                ORDER BY j.tenant_id LIMIT 1)
        FROM everyone e WHERE e.tenant_id IS NOT NULL
    ), pending(tenant_id) AS (
        SELECT a.tenant_id FROM arrived a
        UNION SELECT f.tenant_id FROM pgqueue.flows f
        WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut AND f.next_round <= base + p_horizon
        UNION SELECT f.tenant_id FROM pgqueue.flows f   -- cut, and all its stamped jobs claimed
        WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut
          AND (f.last_round, f.place, f.last_seq) <= (cr, cp, cs)
        UNION SELECT e.tenant_id FROM everyone e
    ), flows_in AS (   -- a flow continues while its last stamped job is queued, or it was cut
        SELECT p.tenant_id, f.place, f.last_round, f.last_seq, f.credit,
               round(pgqueue.tenant_quantum(p.tenant_id) * 1000)::bigint AS q,
               coalesce(f.cut OR h.holds_one, false) AS continuing,
               coalesce(h.holds_one, false) AS holds_one
        FROM pending p
        LEFT JOIN pgqueue.flows f
               ON f.lane = p_lane AND f.tier = p_tier AND f.tenant_id = p.tenant_id
        LEFT JOIN LATERAL (SELECT EXISTS (
            SELECT FROM pgqueue.jobs j
            WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
              AND (j.key_round, j.key_place, j.key_seq) = (f.last_round, f.place, f.last_seq))
            AS holds_one) h ON true
        WHERE p.tenant_id IS NOT NULL
    ), joiners AS (
        SELECT tenant_id, count(*) OVER () AS m,
               row_number() OVER (ORDER BY pgqueue.refill_offset(tenant_id),
                                           tenant_id COLLATE "C") AS i
        FROM flows_in WHERE NOT continuing
    ), pred AS (
        SELECT max(f.place) AS place FROM pgqueue.flows f
        WHERE f.lane = p_lane AND f.tier = p_tier AND f.place < cp
    ), starts AS (
        SELECT fi.tenant_id, fi.q, fi.holds_one,
               CASE WHEN fi.continuing THEN fi.place
                    WHEN pred.place IS NULL THEN cp - (jn.m + 1 - jn.i)
                    ELSE pred.place + (cp - pred.place) * jn.i / (jn.m + 1) END AS place,
               CASE WHEN fi.continuing THEN fi.last_round ELSE cr END AS r0,
               CASE WHEN fi.continuing THEN fi.credit ELSE 0 END AS d0,
               CASE WHEN fi.continuing THEN fi.last_seq ELSE 0 END AS s0
        FROM flows_in fi LEFT JOIN joiners jn USING (tenant_id) CROSS JOIN pred
    ), fetched AS (   -- each flow's next due jobs: a job costs >= 1000 units, so one more
                      -- than can fall within the horizon (a row left over: the flow is cut)
        SELECT s.*, j.id, j.cost, count(*) OVER (PARTITION BY s.tenant_id) AS n_fetched,
               row_number() OVER w AS k, (sum(j.cost) OVER w)::bigint AS cum
        FROM starts s CROSS JOIN LATERAL (
            SELECT j.id, greatest(1, round(j.cost * 1000))::bigint AS cost, j.run_at
            FROM pgqueue.jobs j
            WHERE j.lane = p_lane AND j.priority = p_tier AND j.tenant_id = s.tenant_id
              AND j.state = 'queued' AND j.key_round IS NULL AND j.run_at <= now()
            ORDER BY j.run_at, j.id
            LIMIT greatest(2, (p_horizon + 1 + base - s.r0) * s.q / 1000 + 1)) j
        WINDOW w AS (PARTITION BY s.tenant_id ORDER BY j.run_at, j.id)
    ), kept AS (
        SELECT f.*, r.rnd, r.rnd <= base + p_horizon OR (f.k = 1 AND NOT f.holds_one) AS keep
        FROM fetched f, LATERAL (SELECT f.r0 + greatest(0, (f.cum - f.d0 + f.q - 1) / f.q)) r(rnd)
    ), numbered AS (
        SELECT k.*, lt.seq + row_number() OVER (ORDER BY k.tenant_id, k.k) AS sq
        FROM kept k WHERE k.keep
    ), last AS (      -- where each flow's last stamped job leaves it (or where it was)
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
    SELECT n.ids, n.tenants, n.rnds, n.places, n.seqs, l.tenants, l.places, l.rounds, l.seqs,
           l.credits, l.cuts, l.nexts
    INTO ids, tenants, rnds, places, seqs, f_tenants, f_places, f_rounds, f_seqs, f_credits,
         f_cuts, f_nexts
    FROM (SELECT array_agg(id) AS ids, array_agg(tenant_id) AS tenants, array_agg(rnd) AS rnds,
                 array_agg(place) AS places, array_agg(sq) AS seqs FROM numbered) n,
         (SELECT array_agg(tenant_id) AS tenants, array_agg(place) AS places,
                 array_agg(last_round) AS rounds, array_agg(last_seq) AS seqs,
                 array_agg(credit) AS credits, array_agg(cut) AS cuts,
                 array_agg(next_round) AS nexts FROM last) l;
    UPDATE pgqueue.jobs j SET key_round = u.r, key_place = u.p, key_seq = u.s
    FROM unnest(ids, tenants, rnds, places, seqs) AS u(id, tenant_id, r, p, s)
    WHERE j.id = u.id AND j.tenant_id = u.tenant_id;
    INSERT INTO pgqueue.flows AS f
        (lane, tier, tenant_id, place, last_round, last_seq, credit, cut, next_round)
    SELECT p_lane, p_tier, u.*
    FROM unnest(f_tenants, f_places, f_rounds, f_seqs, f_credits, f_cuts, f_nexts) u
    ON CONFLICT (lane, tier, tenant_id) DO UPDATE
    SET place = excluded.place, last_round = excluded.last_round, last_seq = excluded.last_seq,
        credit = excluded.credit, cut = excluded.cut, next_round = excluded.next_round;
    UPDATE pgqueue.lane_tiers l
    SET seq = l.seq + coalesce(cardinality(ids), 0), folded_at = now(),
        full_at = CASE WHEN look_at_all THEN now() ELSE l.full_at END,
        (frontier_round, frontier_place, frontier_seq) = (
            SELECT f.last_round, f.place, f.last_seq FROM pgqueue.flows f
            WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut
            ORDER BY f.last_round, f.place, f.last_seq LIMIT 1)
    WHERE l.lane = p_lane AND l.tier = p_tier;
    RETURN coalesce(cardinality(ids), 0);
END
$$;

-- Stamp a lane and tier if nobody else is stamping it: a try-lock, so a claimer never waits
-- for a fold (it claims the jobs stamped already). Horizon: GUC
-- pgqueue.stamp_horizon_rounds, default 4. Returns the number of jobs stamped.
CREATE OR REPLACE FUNCTION pgqueue.fold(p_lane text, p_tier pgqueue.tier)
RETURNS bigint
LANGUAGE sql
AS $$
    SELECT CASE WHEN pg_try_advisory_xact_lock(hashtextextended(p_lane,
                                     array_position(enum_range(NULL::pgqueue.tier), p_tier)))
                THEN pgqueue.stamp(p_lane, p_tier,
                                   pgqueue.setting('stamp_horizon_rounds', 4)::integer)
                ELSE 0 END
$$;

-- Claim up to p_max stamped jobs of one lane and tier in key order (or only job p_only,
-- already locked by the caller), never past the frontier: lock them (SKIP LOCKED), lease them
-- to p_worker, keep their keys, and move p_worker's cursor row. No row another claimer writes.
CREATE OR REPLACE FUNCTION pgqueue.claim_keyed(p_lane text, p_tier pgqueue.tier, p_max integer,
                                               p_worker text, p_lease double precision,
                                               p_only bigint DEFAULT NULL)
RETURNS SETOF pgqueue.jobs
LANGUAGE plpgsql
SET jit TO 'off'
AS $$
DECLARE
    fr bigint;
    fp numeric;
    fs bigint;
BEGIN
    SELECT l.frontier_round, l.frontier_place, l.frontier_seq INTO fr, fp, fs
    FROM pgqueue.lane_tiers l WHERE l.lane = p_lane AND l.tier = p_tier;
    IF fr IS NULL THEN
        fr := 9223372036854775807; fp := 0; fs := 0;
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT j.id, j.tenant_id FROM pgqueue.jobs j
        WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
          AND j.key_round IS NOT NULL AND (j.key_round, j.key_place, j.key_seq) <= (fr, fp, fs)
          AND (p_only IS NULL OR j.id = p_only)
        ORDER BY j.key_round, j.key_place, j.key_seq
        LIMIT p_max FOR UPDATE SKIP LOCKED
    ), taken AS (
        UPDATE pgqueue.jobs j
        SET state = 'running', attempts = j.attempts + 1, started_at = now(),
            worker_id = p_worker, lease_token = gen_random_uuid(),
            lease_expires_at = now() + make_interval(secs => p_lease)
        FROM picked WHERE j.id = picked.id AND j.tenant_id = picked.tenant_id
        RETURNING j.*
    ), moved AS (
        INSERT INTO pgqueue.cursors AS c (lane, tier, worker_id, key_round, key_place, key_seq)
        SELECT p_lane, p_tier, p_worker, t.key_round, t.key_place, t.key_seq FROM taken t
        ORDER BY t.key_round DESC, t.key_place DESC, t.key_seq DESC LIMIT 1
        ON CONFLICT (lane, tier, worker_id) DO UPDATE
        SET key_round = excluded.key_round, key_place = excluded.key_place,
            key_seq = excluded.key_seq, moved_at = excluded.moved_at
        WHERE (excluded.key_round, excluded.key_place, excluded.key_seq)
              > (c.key_round, c.key_place, c.key_seq)
    )
    SELECT * FROM taken t ORDER BY t.key_round, t.key_place, t.key_seq;
END
$$;

-- The first stamped job of a lane and tier in key order (within the frontier), locked for the
-- caller (SKIP LOCKED), or NULL: what a rate-limited lane tries to send next.
CREATE OR REPLACE FUNCTION pgqueue.lane_head(p_lane text, p_tier pgqueue.tier)
RETURNS pgqueue.jobs
LANGUAGE sql
AS $$
    SELECT j.* FROM pgqueue.jobs j
    LEFT JOIN pgqueue.lane_tiers l ON l.lane = p_lane AND l.tier = p_tier
    WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
      AND j.key_round IS NOT NULL
      AND (l.frontier_round IS NULL OR (j.key_round, j.key_place, j.key_seq)
                                       <= (l.frontier_round, l.frontier_place, l.frontier_seq))
    ORDER BY j.key_round, j.key_place, j.key_seq
    LIMIT 1 FOR UPDATE OF j SKIP LOCKED
$$;

-- A job queued again (retry, throttle, rescue), or whose run_at, tier or tenant changed while
-- queued, loses its key: it is stamped anew when due, as a new arrival.
CREATE OR REPLACE FUNCTION pgqueue.jobs_unstamp()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    NEW.key_round := NULL;
    NEW.key_place := NULL;
    NEW.key_seq := NULL;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_unstamp
    BEFORE UPDATE ON pgqueue.jobs
    FOR EACH ROW
    WHEN (((new.state = 'queued'::pgqueue.job_state) AND (new.key_round IS NOT NULL) AND ((old.state <> 'queued'::pgqueue.job_state) OR (new.run_at <> old.run_at) OR (new.priority <> old.priority) OR (new.tenant_id <> old.tenant_id))))
    EXECUTE FUNCTION pgqueue.jobs_unstamp();
"""

CLAIM = """\
-- The claim entry points workers call: pgqueue.claim (the fair order alone) and
-- pgqueue.claim_admitted (only jobs the provider's limits let through now). Both take from
-- every lane with due work (pgqueue.claim_lanes), in each lane and tier in key order
-- (070_scheduler.sql). No lock is shared across claimers. docs/drr.md explains the design.

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

-- A tier's weight under the weighted policy: GUC pgqueue.tier_weight_<tier>, else 70/25/5.
CREATE OR REPLACE FUNCTION pgqueue.tier_weight(p_tier pgqueue.tier)
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT pgqueue.setting('tier_weight_' || p_tier::text,
                           CASE p_tier WHEN 'critical' THEN 70 WHEN 'standard' THEN 25 ELSE 5 END)
$$;

-- The lanes and tiers with unstamped due jobs (skip scans: one probe per pair).
CREATE OR REPLACE FUNCTION pgqueue.lane_tiers_unstamped()
RETURNS TABLE(lane text, tier pgqueue.tier)
LANGUAGE sql STABLE
AS $$
    WITH RECURSIVE s(lane, tier) AS (
        (SELECT j.lane, j.priority FROM pgqueue.jobs j
         WHERE j.state = 'queued' AND j.key_round IS NULL ORDER BY j.lane, j.priority LIMIT 1)
        UNION ALL
        SELECT n.lane, n.priority FROM s, LATERAL (
            SELECT j.lane, j.priority FROM pgqueue.jobs j
            WHERE j.state = 'queued' AND j.key_round IS NULL
              AND (j.lane, j.priority) > (s.lane, s.tier)
            ORDER BY j.lane, j.priority LIMIT 1) n
    )
    SELECT s.lane, s.tier FROM s
    WHERE EXISTS (SELECT FROM pgqueue.jobs j
                  WHERE j.lane = s.lane AND j.priority = s.tier AND j.state = 'queued'
                    AND j.key_round IS NULL AND j.run_at <= now())
$$;

-- The lanes and tiers with stamped jobs, and the head job of each in key order.
CREATE OR REPLACE FUNCTION pgqueue.lane_tiers_stamped()
RETURNS TABLE(lane text, tier pgqueue.tier, id bigint, kind text, model text)
LANGUAGE sql STABLE
AS $$
    WITH RECURSIVE s(lane, tier, id, kind, model) AS (
        (SELECT j.lane, j.priority, j.id, j.kind, j.model FROM pgqueue.jobs j
         WHERE j.state = 'queued' AND j.key_round IS NOT NULL
         ORDER BY j.lane, j.priority, j.key_round, j.key_place, j.key_seq LIMIT 1)
        UNION ALL
        SELECT n.* FROM s, LATERAL (
            SELECT j.lane, j.priority, j.id, j.kind, j.model FROM pgqueue.jobs j
            WHERE j.state = 'queued' AND j.key_round IS NOT NULL
              AND (j.lane, j.priority) > (s.lane, s.tier)
            ORDER BY j.lane, j.priority, j.key_round, j.key_place, j.key_seq LIMIT 1) n
    )
    SELECT * FROM s
$$;

-- Whether the horizon left due jobs of this lane and tier unstamped (claims stop at its
-- frontier until a fold goes on): the tier is still backlogged.
CREATE OR REPLACE FUNCTION pgqueue.lane_tier_cut(p_lane text, p_tier pgqueue.tier)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (SELECT FROM pgqueue.lane_tiers l
                   WHERE l.lane = p_lane AND l.tier = p_tier AND l.frontier_round IS NOT NULL)
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

-- How many of `n` slots each of a lane's backlogged tiers (`tiers`, highest first) gets, by
-- pgqueue.tier_policy(): strict gives them all to the first; weighted draws each slot's tier
-- at random by weight (pgqueue.tier_weight), so no row is written to keep the shares: in
-- expectation each tier gets its weight's share of the slots; probabilistic takes critical
-- with probability 0.9 when it is backlogged, else standard:batch 25:5 (the article's rule).
CREATE OR REPLACE FUNCTION pgqueue.tier_slots(tiers pgqueue.tier[], n integer)
RETURNS integer[]
LANGUAGE plpgsql
AS $$
DECLARE
    policy constant text := pgqueue.tier_policy();
    weights double precision[] := ARRAY(SELECT pgqueue.tier_weight(t) FROM unnest(tiers) t);
    slots integer[] := array_fill(0, ARRAY[cardinality(tiers)]);
    total double precision := (SELECT sum(w) FROM unnest(weights) w);
    x double precision;
    i integer;
BEGIN
    IF policy = 'strict' THEN
        slots[1] := n;
        RETURN slots;
    END IF;
    FOR k IN 1 .. n LOOP
        i := 1;
        IF policy = 'weighted' THEN
            x := random() * total;
            WHILE i < cardinality(tiers) AND x >= weights[i] LOOP
                x := x - weights[i];
                i := i + 1;
            END LOOP;
        ELSIF tiers[1] <> 'critical' OR random() >= 0.9 THEN
            i := coalesce(CASE WHEN random() * 30 < 25
                               THEN array_position(tiers, 'standard')
                               ELSE array_position(tiers, 'batch') END,
                          array_position(tiers, 'standard'), array_position(tiers, 'batch'), 1);
        END IF;
        slots[i] := slots[i] + 1;
    END LOOP;
    RETURN slots;
END
$$;

-- Claim up to p_max jobs over every lane, leased to p_worker. Each lane and tier with due
-- unstamped jobs is folded (if no one else is folding it), then the lanes are served in the
-- order of the highest tier each has, then of that tier's head job's arrival (LaneScheduler of
-- pgqueue.scheduling.lanes). A lane's slots go to its tiers by pgqueue.tier_slots, then what
-- a tier could not fill to the others in priority order (work-conserving). With p_admit, a
-- rate-limited lane (Messages API jobs of a model; the batches lane's jobs take nothing) goes
-- one job at a time, the highest tier first: the job's request and tokens are taken from the
-- model's buckets (pgqueue.ratelimit_try_take); a lane in cooldown or out of tokens stops
-- there and holds back no other lane. A lane and tier whose claims reached its frontier (the
-- horizon left jobs unstamped) is folded again in another pass. Rows: the jobs, then, when a
-- lane was stopped and fewer than p_max were claimed, one row with a NULL job and the seconds
-- until the soonest stopped lane frees up.
CREATE OR REPLACE FUNCTION pgqueue.claim_lanes(p_max integer, p_worker text,
                                               p_lease double precision, p_admit boolean)
RETURNS TABLE(job pgqueue.jobs, blocked_seconds double precision)
LANGUAGE plpgsql
SET jit TO 'off'
AS $$
DECLARE
    got integer := 0;
    got_before integer;
    n integer;
    k integer;
    again boolean;
    blocked double precision;
    wait double precision;
    lane record;
    t pgqueue.tier;
    j pgqueue.jobs;
    slots integer[];
BEGIN
    IF coalesce(p_max, 0) <= 0 THEN
        RETURN;
    END IF;
    PERFORM pgqueue.tier_policy();  -- an unknown policy is refused even on an empty queue
    LOOP
        again := false;
        got_before := got;
        PERFORM pgqueue.fold(u.lane, u.tier) FROM pgqueue.lane_tiers_unstamped() u;
        FOR lane IN
            SELECT h.lane, array_agg(h.tier ORDER BY h.tier) AS tiers,
                   bool_or(h.kind = 'anthropic.messages' AND h.model IS NOT NULL) AS limited
            FROM pgqueue.lane_tiers_stamped() h
            GROUP BY h.lane
            ORDER BY min(h.tier), (array_agg(h.id ORDER BY h.tier))[1], h.lane
        LOOP
            EXIT WHEN got >= p_max;
            IF p_admit AND lane.limited THEN
                LOOP
                    EXIT WHEN got >= p_max;
                    -- The tier to send: strict priority order among the backlogged tiers.
                    -- issue-28-shares: t := pgqueue.ratelimit_pick_tier(lane.lane, needs)
                    j := NULL;
                    FOREACH t IN ARRAY lane.tiers LOOP
                        j := pgqueue.lane_head(lane.lane, t);
                        EXIT WHEN j.id IS NOT NULL OR pgqueue.lane_tier_cut(lane.lane, t);
                    END LOOP;
                    IF j.id IS NULL THEN
                        again := again OR pgqueue.lane_tier_cut(lane.lane, t);
                        EXIT;
                    END IF;
                    wait := 0;
                    IF j.kind = 'anthropic.messages' AND j.model IS NOT NULL
                       AND NOT pgqueue.batch_lane_takes(j.id, j.tenant_id, j.priority, j.kind)
                    THEN
                        wait := pgqueue.ratelimit_try_take(j.model, j.est_input_tokens,
                                                           j.max_output_tokens);
                    END IF;
                    IF wait > 0 AND wait < 'Infinity'::double precision THEN
                        blocked := least(coalesce(blocked, wait), wait);
                        EXIT;
                    END IF;
                    RETURN QUERY SELECT c, NULL::double precision
                                 FROM pgqueue.claim_keyed(lane.lane, j.priority, 1, p_worker,
                                                          p_lease, j.id) c;
                    got := got + 1;
                END LOOP;
                CONTINUE;
            END IF;
            slots := pgqueue.tier_slots(lane.tiers, p_max - got);
            <<tiers>>
            FOR pass IN 1 .. 2 LOOP
                FOR i IN 1 .. cardinality(lane.tiers) LOOP
                    t := lane.tiers[i];
                    n := CASE WHEN pass = 1 THEN slots[i] ELSE p_max - got END;
                    CONTINUE WHEN n <= 0;
                    RETURN QUERY SELECT c, NULL::double precision
                                 FROM pgqueue.claim_keyed(lane.lane, t, n, p_worker, p_lease) c;
                    GET DIAGNOSTICS k = ROW_COUNT;
                    got := got + k;
                    IF k < n AND pgqueue.lane_tier_cut(lane.lane, t) THEN
                        again := true;  -- fold it again before a lower tier goes
                        EXIT tiers;
                    END IF;
                END LOOP;
            END LOOP;
        END LOOP;
        EXIT WHEN NOT again OR got >= p_max OR got = got_before;
    END LOOP;
    IF blocked IS NOT NULL AND got < p_max THEN
        RETURN QUERY SELECT NULL::pgqueue.jobs, blocked;
    END IF;
END
$$;

-- Claim up to max_jobs jobs in the fair order, leased to worker_id (no provider limiter).
CREATE OR REPLACE FUNCTION pgqueue.claim(max_jobs integer, worker_id text,
                                         lease_seconds double precision)
RETURNS SETOF pgqueue.jobs
LANGUAGE sql
AS $$
    SELECT (c.job).* FROM pgqueue.claim_lanes(max_jobs, worker_id, lease_seconds, false) c
    WHERE (c.job).id IS NOT NULL
$$;

-- The claim behind admission control by the provider's limits ("claim only when the job can
-- be sent now"): pgqueue.claim_lanes with the limiter. The claim's commit does not wait for
-- its WAL flush (job_claim_durable makes the handed-out claims durable): a claim lost in a
-- crash only leaves its jobs queued, to be claimed again (every completion is fenced by the
-- lease token).
CREATE OR REPLACE FUNCTION pgqueue.claim_admitted(
    max_jobs integer,
    worker_id text,
    lease_seconds double precision
)
RETURNS TABLE(job pgqueue.jobs, blocked_seconds double precision)
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY SELECT c.job, c.blocked_seconds
                 FROM pgqueue.claim_lanes(max_jobs, worker_id, lease_seconds, true) c;
END
$$;
"""

TRY_ENQUEUE = """\
CREATE OR REPLACE FUNCTION pgqueue.try_enqueue(
    tenant_id text,
    origin text,
    payload jsonb,
    sla_seconds double precision DEFAULT NULL::double precision,
    kind text DEFAULT 'anthropic.messages'::text,
    max_attempts integer DEFAULT NULL::integer,
    run_at timestamp with time zone DEFAULT NULL::timestamp with time zone,
    dedupe_key text DEFAULT NULL::text
)
RETURNS TABLE(id bigint, outcome text, tier pgqueue.tier, policy text, scope text, depth bigint, cap bigint)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    o pgqueue.origin;
    t pgqueue.tier;
    v record;
    pol text;
    tier_cap bigint;
    tenant_cap bigint;
    known boolean;
    new_id bigint;
BEGIN
    PERFORM pgqueue.check_tenant_scope(ARRAY[try_enqueue.tenant_id]);  -- before any read
    IF pgqueue.job_is_valid(try_enqueue.tenant_id, try_enqueue.origin, try_enqueue.payload,
                            try_enqueue.sla_seconds, try_enqueue.kind, try_enqueue.max_attempts,
                            coalesce(nullif(pgqueue.guarded_setting('max_payload_bytes'),
                                            '')::bigint, 1048576)) IS NOT TRUE THEN
        PERFORM pgqueue.validate_job(try_enqueue.tenant_id, try_enqueue.origin,
                                     try_enqueue.payload, try_enqueue.sla_seconds,
                                     try_enqueue.kind, try_enqueue.max_attempts);
    END IF;
    o := try_enqueue.origin::pgqueue.origin;
    try_enqueue.sla_seconds := try_enqueue.sla_seconds + 0.0;  -- -0 is stored as 0
    IF try_enqueue.dedupe_key IS NOT NULL THEN
        IF try_enqueue.dedupe_key = '' OR char_length(try_enqueue.dedupe_key) > 256 THEN
            RAISE EXCEPTION 'dedupe_key must be 1 to 256 characters' USING ERRCODE = 'PQ009';
        END IF;
        -- Control characters (C0, DEL, C1) print as nothing or move the cursor: refused, as
        -- pgqueue.validation.check_dedupe_key does (found by a fault run: U+0001 was stored).
        IF try_enqueue.dedupe_key ~ '[\\x01-\\x1f\\x7f-\\x9f]' THEN
            RAISE EXCEPTION 'dedupe_key holds a control character' USING ERRCODE = 'PQ009';
        END IF;
        SELECT j.id INTO new_id FROM pgqueue.jobs j
        WHERE j.tenant_id = try_enqueue.tenant_id AND j.dedupe_key = try_enqueue.dedupe_key
          AND j.state IN ('queued', 'running');
        IF FOUND THEN
            id := new_id; outcome := 'duplicate';
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    -- One statement: the tier (pgqueue.is_demoted's rule), its admission row, and the tenant:
    -- registered or not, and if so locked FOR KEY SHARE until the transaction ends, as the
    -- insert trigger's check would lock it.
    SELECT k.tier, a.policy, a.max_queued, coalesce(r.max_queued, a.tenant_max_queued),
           coalesce(r.known, false)
    INTO t, pol, tier_cap, tenant_cap, known
    FROM (SELECT pgqueue.classify(o, try_enqueue.sla_seconds,
                                  EXISTS (SELECT 1 FROM pgqueue.demotions d
                                          WHERE d.tenant_id = try_enqueue.tenant_id
                                            AND d.expires_at > now())) AS tier) k
    LEFT JOIN pgqueue.admission a ON a.tier = k.tier
    LEFT JOIN LATERAL (SELECT true AS known, x.max_queued FROM pgqueue.tenants x
                       WHERE x.tenant_id = try_enqueue.tenant_id FOR KEY SHARE) r ON true;
    IF NOT known AND pgqueue.tenants_required() THEN
        -- refused before admission has a say (revision 0030): raises PQ007 unless the
        -- tenant was registered since the lookup
        PERFORM pgqueue.ensure_tenant(try_enqueue.tenant_id);
    END IF;
    IF tier_cap IS NOT NULL OR tenant_cap IS NOT NULL THEN
        v := pgqueue.admission_check(t, try_enqueue.tenant_id, 1);
        IF NOT v.admitted THEN
            IF v.policy = 'drop' THEN
                INSERT INTO pgqueue.queue_counts (tier, tenant_id, dropped)
                VALUES (t, try_enqueue.tenant_id, 1);
                outcome := 'dropped';
            ELSE
                outcome := 'full';
            END IF;
            tier := t; policy := v.policy; scope := v.scope; depth := v.depth; cap := v.cap;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    IF NOT known THEN
        PERFORM pgqueue.ensure_tenant(try_enqueue.tenant_id);
    END IF;
    IF try_enqueue.dedupe_key IS NULL THEN  -- no arbiter index to consult
        INSERT INTO pgqueue.jobs AS j (tenant_id, kind, origin, sla_seconds, priority, payload,
                                       model, est_input_tokens, max_output_tokens, cost,
                                       max_attempts, run_at)
        SELECT try_enqueue.tenant_id, try_enqueue.kind, o, try_enqueue.sla_seconds, t,
               try_enqueue.payload, try_enqueue.payload ->> 'model', e.est,
               pgqueue.payload_max_tokens(try_enqueue.payload), pgqueue.job_cost(e.est),
               coalesce(try_enqueue.max_attempts, 5), coalesce(try_enqueue.run_at, now())
        FROM pgqueue.input_token_estimate(try_enqueue.payload) e
        RETURNING j.id INTO new_id;
        id := new_id; outcome := 'enqueued'; tier := t; policy := pol;
        RETURN NEXT;
        RETURN;
    END IF;
    INSERT INTO pgqueue.jobs AS j (tenant_id, kind, origin, sla_seconds, priority, payload,
                                   model, est_input_tokens, max_output_tokens, cost,
                                   max_attempts, run_at, dedupe_key)
    SELECT try_enqueue.tenant_id, try_enqueue.kind, o, try_enqueue.sla_seconds, t,
           try_enqueue.payload, try_enqueue.payload ->> 'model', e.est,
           pgqueue.payload_max_tokens(try_enqueue.payload), pgqueue.job_cost(e.est),
           coalesce(try_enqueue.max_attempts, 5), coalesce(try_enqueue.run_at, now()),
           try_enqueue.dedupe_key
    FROM pgqueue.input_token_estimate(try_enqueue.payload) e
    ON CONFLICT (tenant_id, dedupe_key)
        WHERE dedupe_key IS NOT NULL AND state IN ('queued', 'running')
        DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN  -- a concurrent enqueue of the same key won the race
        SELECT j.id INTO new_id FROM pgqueue.jobs j
        WHERE j.tenant_id = try_enqueue.tenant_id AND j.dedupe_key = try_enqueue.dedupe_key
          AND j.state IN ('queued', 'running');
        id := new_id; outcome := 'duplicate';
        RETURN NEXT;
        RETURN;
    END IF;
    id := new_id; outcome := 'enqueued'; tier := t; policy := pol;
    RETURN NEXT;
END
$$;
"""

JOBS_AFTER_INSERT = """\
CREATE OR REPLACE FUNCTION pgqueue.jobs_after_insert() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    tiers pgqueue.tier[];
    unknown text;
    tenants text[];
    deltas bigint[];
    touched text;
BEGIN
    -- What the foreign key to pgqueue.tenants did, once per statement (revision 0013): every
    -- tenant exists, and stays (FOR KEY SHARE) until this transaction ends.
    -- One statement: each distinct tenant locked by a probe; the first one missing, if any.
    SELECT n.tenant_id INTO unknown
    FROM (SELECT DISTINCT r.tenant_id FROM new_rows r) AS n
    LEFT JOIN LATERAL (SELECT true AS known FROM pgqueue.tenants t
                       WHERE t.tenant_id = n.tenant_id FOR KEY SHARE) AS k ON true
    WHERE k.known IS NULL
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'unknown tenant %: register it first (pgqueue.ensure_tenant)',
            quote_literal(unknown) USING ERRCODE = 'foreign_key_violation';
    END IF;
    -- Per (tier, tenant) and per tier (tenant NULL): how many new rows are queued.
    -- (No ORDER BY in the aggregates: a sort per aggregate cost more than the rest of the
    -- function; the three arrays are built from the same rows in the same order.)
    SELECT array_agg(g.tier) FILTER (WHERE g.n > 0),
           array_agg(g.tenant_id) FILTER (WHERE g.n > 0),
           array_agg(g.n) FILTER (WHERE g.n > 0),
           string_agg(g.tier::text, ',') FILTER (WHERE g.tier_total)
    INTO tiers, tenants, deltas, touched
    FROM (SELECT n.priority AS tier, n.tenant_id,
                 count(*) FILTER (WHERE n.state = 'queued') AS n,
                 GROUPING(n.tenant_id) = 1 AS tier_total
          FROM new_rows n
          GROUP BY GROUPING SETS ((n.priority, n.tenant_id), (n.priority))) g;
    IF tiers IS NOT NULL THEN
        PERFORM pgqueue.queue_counts_add(tiers, tenants, deltas);
    END IF;
    PERFORM pg_notify('pgqueue_jobs', coalesce(touched, ''));
    RETURN NULL;
END
$$;
"""

JOBS_AFTER_UPDATE = """\
CREATE OR REPLACE FUNCTION pgqueue.jobs_after_update() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    tiers pgqueue.tier[];
    tenants text[];
    deltas bigint[];
    t text;
BEGIN
    SELECT array_agg(g.tier), array_agg(g.tenant_id), array_agg(g.n)
    INTO tiers, tenants, deltas
    FROM (SELECT d.priority AS tier, d.tenant_id, sum(d.delta)::bigint AS n
          FROM (SELECT n.priority, n.tenant_id, 1 AS delta FROM new_rows n
                WHERE n.state = 'queued'
                UNION ALL
                SELECT o.priority, o.tenant_id, -1 FROM old_rows o WHERE o.state = 'queued') d
          GROUP BY GROUPING SETS ((d.priority, d.tenant_id), (d.priority))
          HAVING sum(d.delta) <> 0) g;
    IF tiers IS NOT NULL THEN
        PERFORM pgqueue.queue_counts_add(tiers, tenants, deltas);
    END IF;
    -- A claim, a heartbeat, a retry: nothing succeeded with usage, nothing to charge.
    IF NOT EXISTS (SELECT 1 FROM new_rows n
                   WHERE n.state = 'succeeded'
                     AND (n.input_tokens IS NOT NULL OR n.output_tokens IS NOT NULL)) THEN
        RETURN NULL;
    END IF;
    WITH charged AS (
        INSERT INTO pgqueue.usage_daily AS u (tenant_id, day, requests, input_tokens,
                                              output_tokens)
        SELECT n.tenant_id, pgqueue.budget_day(), count(*),
               sum(coalesce(n.input_tokens, 0)), sum(coalesce(n.output_tokens, 0))
        FROM new_rows n
        JOIN old_rows o ON o.id = n.id AND o.tenant_id = n.tenant_id
        WHERE n.state = 'succeeded' AND o.state = 'running'
          AND (n.input_tokens IS NOT NULL OR n.output_tokens IS NOT NULL)
        GROUP BY n.tenant_id
        ORDER BY n.tenant_id COLLATE "C"
        ON CONFLICT (tenant_id, day) DO UPDATE
        SET requests = u.requests + EXCLUDED.requests,
            input_tokens = u.input_tokens + EXCLUDED.input_tokens,
            output_tokens = u.output_tokens + EXCLUDED.output_tokens
        RETURNING u.tenant_id
    )
    SELECT array_agg(c.tenant_id ORDER BY c.tenant_id COLLATE "C") INTO tenants FROM charged c;
    FOREACH t IN ARRAY coalesce(tenants, '{}') LOOP
        PERFORM pgqueue.demotion_check(t);
    END LOOP;
    RETURN NULL;
END
$$;
"""

CLAIM_ORDER = """\
CREATE VIEW pgqueue.claim_order AS
SELECT j.lane, j.priority AS tier, j.tenant_id, j.id AS job_id, j.cost,
       j.key_round - coalesce(c.key_round, 0) AS round, j.key_place AS place, j.key_seq AS seq
FROM pgqueue.jobs j
LEFT JOIN pgqueue.lane_tiers l ON l.lane = j.lane AND l.tier = j.priority
LEFT JOIN LATERAL (SELECT x.key_round FROM pgqueue.cursors x
                   WHERE x.lane = j.lane AND x.tier = j.priority
                   ORDER BY x.key_round DESC LIMIT 1) c ON true
WHERE j.state = 'queued'
  AND CASE WHEN j.key_round IS NULL THEN j.run_at <= now()
           ELSE l.frontier_round IS NULL OR (j.key_round, j.key_place, j.key_seq)
                                            <= (l.frontier_round, l.frontier_place, l.frontier_seq)
      END
ORDER BY j.priority, j.lane, j.key_round NULLS LAST, j.key_place, j.key_seq, j.run_at, j.id;
"""

DROP_V2 = """\
DROP VIEW IF EXISTS pgqueue.claim_order;
DROP TRIGGER IF EXISTS jobs_unstamp ON pgqueue.jobs;
DROP FUNCTION IF EXISTS pgqueue.jobs_unstamp();
DROP FUNCTION IF EXISTS pgqueue.claim_lanes(integer, text, double precision, boolean);
DROP FUNCTION IF EXISTS pgqueue.claim_keyed(text, pgqueue.tier, integer, text, double precision, bigint);
DROP FUNCTION IF EXISTS pgqueue.lane_head(text, pgqueue.tier);
DROP FUNCTION IF EXISTS pgqueue.lane_tier_cut(text, pgqueue.tier);
DROP FUNCTION IF EXISTS pgqueue.tier_slots(pgqueue.tier[], integer);
DROP FUNCTION IF EXISTS pgqueue.lane_tiers_stamped();
DROP FUNCTION IF EXISTS pgqueue.lane_tiers_unstamped();
DROP FUNCTION IF EXISTS pgqueue.fold(text, pgqueue.tier);
DROP FUNCTION IF EXISTS pgqueue.stamp(text, pgqueue.tier, integer);
DROP FUNCTION IF EXISTS pgqueue.tier_weight(pgqueue.tier);
DROP FUNCTION IF EXISTS pgqueue.claim(integer, text, double precision);
DROP TABLE IF EXISTS pgqueue.lane_tiers, pgqueue.flows, pgqueue.cursors;
DROP INDEX IF EXISTS pgqueue.jobs_claim_idx, pgqueue.jobs_unstamped_idx, pgqueue.jobs_unstamped_due_idx;
ALTER TABLE pgqueue.jobs
    DROP COLUMN IF EXISTS key_seq,
    DROP COLUMN IF EXISTS key_place,
    DROP COLUMN IF EXISTS key_round,
    DROP COLUMN IF EXISTS lane;
"""

OLD_TABLES = """\
CREATE TABLE IF NOT EXISTS pgqueue.deficits (
    tenant_id text NOT NULL,
    tier pgqueue.tier NOT NULL,
    deficit double precision DEFAULT 0 NOT NULL,
    pos bigint,
    due_at timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    refill_offset bigint NOT NULL,
    CONSTRAINT deficits_deficit_check CHECK ((deficit >= (0)::double precision)),
    CONSTRAINT deficits_pkey PRIMARY KEY (tenant_id, tier)
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='500');

CREATE INDEX IF NOT EXISTS deficits_round_idx ON pgqueue.deficits USING btree (tier, pos);

CREATE INDEX IF NOT EXISTS deficits_waiting_idx ON pgqueue.deficits USING btree (tier, due_at, refill_offset, tenant_id COLLATE "C") WHERE (pos IS NULL);

CREATE TABLE IF NOT EXISTS pgqueue.tier_state (
    tier pgqueue.tier NOT NULL,
    weight double precision NOT NULL,
    swrr_current double precision DEFAULT 0 NOT NULL,
    turn_tenant text,
    next_pos bigint DEFAULT 1 NOT NULL,
    round bigint DEFAULT 0 NOT NULL,
    round_end_pos bigint DEFAULT 0 NOT NULL,
    CONSTRAINT tier_state_weight_check CHECK (((weight > (0)::double precision) AND (weight < 'Infinity'::double precision))),
    CONSTRAINT tier_state_pkey PRIMARY KEY (tier)
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='500');

INSERT INTO pgqueue.tier_state (tier, weight)
VALUES ('critical', 70), ('standard', 25), ('batch', 5)
ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS pgqueue.drr_inbox (
    tier pgqueue.tier NOT NULL,
    tenant_id text NOT NULL
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='500');
"""

OLD_CLAIM = """\
DROP TRIGGER IF EXISTS jobs_drr_requeue ON pgqueue.jobs;

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
"""

OLD_DISPATCH = """\
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
"""

OLD_TRY_ENQUEUE = """\
CREATE OR REPLACE FUNCTION pgqueue.try_enqueue(
    tenant_id text,
    origin text,
    payload jsonb,
    sla_seconds double precision DEFAULT NULL::double precision,
    kind text DEFAULT 'anthropic.messages'::text,
    max_attempts integer DEFAULT NULL::integer,
    run_at timestamp with time zone DEFAULT NULL::timestamp with time zone,
    dedupe_key text DEFAULT NULL::text
)
RETURNS TABLE(id bigint, outcome text, tier pgqueue.tier, policy text, scope text, depth bigint, cap bigint)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    o pgqueue.origin;
    t pgqueue.tier;
    v record;
    pol text;
    tier_cap bigint;
    tenant_cap bigint;
    known boolean;
    new_id bigint;
BEGIN
    PERFORM pgqueue.check_tenant_scope(ARRAY[try_enqueue.tenant_id]);  -- before any read
    IF pgqueue.job_is_valid(try_enqueue.tenant_id, try_enqueue.origin, try_enqueue.payload,
                            try_enqueue.sla_seconds, try_enqueue.kind, try_enqueue.max_attempts,
                            coalesce(nullif(pgqueue.guarded_setting('max_payload_bytes'),
                                            '')::bigint, 1048576)) IS NOT TRUE THEN
        PERFORM pgqueue.validate_job(try_enqueue.tenant_id, try_enqueue.origin,
                                     try_enqueue.payload, try_enqueue.sla_seconds,
                                     try_enqueue.kind, try_enqueue.max_attempts);
    END IF;
    o := try_enqueue.origin::pgqueue.origin;
    try_enqueue.sla_seconds := try_enqueue.sla_seconds + 0.0;  -- -0 is stored as 0
    IF try_enqueue.dedupe_key IS NOT NULL THEN
        IF try_enqueue.dedupe_key = '' OR char_length(try_enqueue.dedupe_key) > 256 THEN
            RAISE EXCEPTION 'dedupe_key must be 1 to 256 characters' USING ERRCODE = 'PQ009';
        END IF;
        -- Control characters (C0, DEL, C1) print as nothing or move the cursor: refused, as
        -- pgqueue.validation.check_dedupe_key does (found by a fault run: U+0001 was stored).
        IF try_enqueue.dedupe_key ~ '[\\x01-\\x1f\\x7f-\\x9f]' THEN
            RAISE EXCEPTION 'dedupe_key holds a control character' USING ERRCODE = 'PQ009';
        END IF;
        SELECT j.id INTO new_id FROM pgqueue.jobs j
        WHERE j.tenant_id = try_enqueue.tenant_id AND j.dedupe_key = try_enqueue.dedupe_key
          AND j.state IN ('queued', 'running');
        IF FOUND THEN
            id := new_id; outcome := 'duplicate';
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    -- One statement: the tier (pgqueue.is_demoted's rule), its admission row, and the tenant:
    -- registered or not, and if so locked FOR KEY SHARE until the transaction ends, as the
    -- insert trigger's check would lock it.
    SELECT k.tier, a.policy, a.max_queued, coalesce(r.max_queued, a.tenant_max_queued),
           coalesce(r.known, false)
    INTO t, pol, tier_cap, tenant_cap, known
    FROM (SELECT pgqueue.classify(o, try_enqueue.sla_seconds,
                                  EXISTS (SELECT 1 FROM pgqueue.demotions d
                                          WHERE d.tenant_id = try_enqueue.tenant_id
                                            AND d.expires_at > now())) AS tier) k
    LEFT JOIN pgqueue.admission a ON a.tier = k.tier
    LEFT JOIN LATERAL (SELECT true AS known, x.max_queued FROM pgqueue.tenants x
                       WHERE x.tenant_id = try_enqueue.tenant_id FOR KEY SHARE) r ON true;
    IF NOT known AND pgqueue.tenants_required() THEN
        -- refused before admission has a say (revision 0030): raises PQ007 unless the
        -- tenant was registered since the lookup
        PERFORM pgqueue.ensure_tenant(try_enqueue.tenant_id);
    END IF;
    IF tier_cap IS NOT NULL OR tenant_cap IS NOT NULL THEN
        v := pgqueue.admission_check(t, try_enqueue.tenant_id, 1);
        IF NOT v.admitted THEN
            IF v.policy = 'drop' THEN
                INSERT INTO pgqueue.queue_counts (tier, tenant_id, dropped)
                VALUES (t, try_enqueue.tenant_id, 1);
                outcome := 'dropped';
            ELSE
                outcome := 'full';
            END IF;
            tier := t; policy := v.policy; scope := v.scope; depth := v.depth; cap := v.cap;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    IF NOT known THEN
        PERFORM pgqueue.ensure_tenant(try_enqueue.tenant_id);
    END IF;
    IF try_enqueue.dedupe_key IS NULL THEN  -- no arbiter index to consult
        INSERT INTO pgqueue.jobs AS j (tenant_id, kind, origin, sla_seconds, priority, payload,
                                       model, est_input_tokens, max_output_tokens, cost,
                                       max_attempts, run_at)
        SELECT try_enqueue.tenant_id, try_enqueue.kind, o, try_enqueue.sla_seconds, t,
               try_enqueue.payload, try_enqueue.payload ->> 'model', e.est,
               pgqueue.payload_max_tokens(try_enqueue.payload), pgqueue.job_cost(e.est),
               coalesce(try_enqueue.max_attempts, 5), coalesce(try_enqueue.run_at, now())
        FROM pgqueue.input_token_estimate(try_enqueue.payload) e
        RETURNING j.id INTO new_id;
        id := new_id; outcome := 'enqueued'; tier := t; policy := pol;
        RETURN NEXT;
        RETURN;
    END IF;
    INSERT INTO pgqueue.jobs AS j (tenant_id, kind, origin, sla_seconds, priority, payload,
                                   model, est_input_tokens, max_output_tokens, cost,
                                   max_attempts, run_at, dedupe_key)
    SELECT try_enqueue.tenant_id, try_enqueue.kind, o, try_enqueue.sla_seconds, t,
           try_enqueue.payload, try_enqueue.payload ->> 'model', e.est,
           pgqueue.payload_max_tokens(try_enqueue.payload), pgqueue.job_cost(e.est),
           coalesce(try_enqueue.max_attempts, 5), coalesce(try_enqueue.run_at, now()),
           try_enqueue.dedupe_key
    FROM pgqueue.input_token_estimate(try_enqueue.payload) e
    ON CONFLICT (tenant_id, dedupe_key)
        WHERE dedupe_key IS NOT NULL AND state IN ('queued', 'running')
        DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN  -- a concurrent enqueue of the same key won the race
        SELECT j.id INTO new_id FROM pgqueue.jobs j
        WHERE j.tenant_id = try_enqueue.tenant_id AND j.dedupe_key = try_enqueue.dedupe_key
          AND j.state IN ('queued', 'running');
        id := new_id; outcome := 'duplicate';
        RETURN NEXT;
        RETURN;
    END IF;
    id := new_id; outcome := 'enqueued'; tier := t; policy := pol;
    RETURN NEXT;
END
$$;
"""

OLD_JOBS_AFTER_INSERT = """\
CREATE OR REPLACE FUNCTION pgqueue.jobs_after_insert() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    tiers pgqueue.tier[];
    unknown text;
    tenants text[];
    deltas bigint[];
    touched text;
BEGIN
    -- What the foreign key to pgqueue.tenants did, once per statement (revision 0013): every
    -- tenant exists, and stays (FOR KEY SHARE) until this transaction ends.
    -- One statement: each distinct tenant locked by a probe; the first one missing, if any.
    SELECT n.tenant_id INTO unknown
    FROM (SELECT DISTINCT r.tenant_id FROM new_rows r) AS n
    LEFT JOIN LATERAL (SELECT true AS known FROM pgqueue.tenants t
                       WHERE t.tenant_id = n.tenant_id FOR KEY SHARE) AS k ON true
    WHERE k.known IS NULL
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'unknown tenant %: register it first (pgqueue.ensure_tenant)',
            quote_literal(unknown) USING ERRCODE = 'foreign_key_violation';
    END IF;
    -- Per (tier, tenant) and per tier (tenant NULL): how many new rows are queued.
    -- (No ORDER BY in the aggregates: a sort per aggregate cost more than the rest of the
    -- function; the three arrays are built from the same rows in the same order.)
    SELECT array_agg(g.tier) FILTER (WHERE g.n > 0),
           array_agg(g.tenant_id) FILTER (WHERE g.n > 0),
           array_agg(g.n) FILTER (WHERE g.n > 0),
           string_agg(g.tier::text, ',') FILTER (WHERE g.tier_total)
    INTO tiers, tenants, deltas, touched
    FROM (SELECT n.priority AS tier, n.tenant_id,
                 count(*) FILTER (WHERE n.state = 'queued') AS n,
                 GROUPING(n.tenant_id) = 1 AS tier_total
          FROM new_rows n
          GROUP BY GROUPING SETS ((n.priority, n.tenant_id), (n.priority))) g;
    IF tiers IS NOT NULL THEN
        INSERT INTO pgqueue.drr_inbox (tier, tenant_id)
        SELECT u.tier, u.tenant_id FROM unnest(tiers, tenants) AS u(tier, tenant_id)
        WHERE u.tenant_id IS NOT NULL;
        PERFORM pgqueue.queue_counts_add(tiers, tenants, deltas);
    END IF;
    PERFORM pg_notify('pgqueue_jobs', coalesce(touched, ''));
    RETURN NULL;
END
$$;
"""

OLD_JOBS_AFTER_UPDATE = """\
CREATE OR REPLACE FUNCTION pgqueue.jobs_after_update() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    tiers pgqueue.tier[];
    tenants text[];
    deltas bigint[];
    t text;
BEGIN
    -- A claim's batch write (drr_dispatch) counted its rows itself, and none succeeded: nothing
    -- to do (revision 0017). The mark names the claim's transaction, so a value left in the
    -- session (SET, ALTER ROLE) or by another transaction never switches counting off; and it
    -- is honoured only for a session that may write pgqueue.jobs itself (a worker: it could
    -- write the counters anyway). Found by a hostile tester (issue 32): a producer set it by
    -- hand (set_config(..., pg_current_xact_id()::text, true)) before cancel_queued, and the
    -- cancelled jobs stayed counted, filling the tier's cap for every tenant.
    IF current_setting('pgqueue.claim_counted', true) = pg_current_xact_id()::text
       AND pgqueue.session_writes_jobs() THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(g.tier), array_agg(g.tenant_id), array_agg(g.n)
    INTO tiers, tenants, deltas
    FROM (SELECT d.priority AS tier, d.tenant_id, sum(d.delta)::bigint AS n
          FROM (SELECT n.priority, n.tenant_id, 1 AS delta FROM new_rows n
                WHERE n.state = 'queued'
                UNION ALL
                SELECT o.priority, o.tenant_id, -1 FROM old_rows o WHERE o.state = 'queued') d
          GROUP BY GROUPING SETS ((d.priority, d.tenant_id), (d.priority))
          HAVING sum(d.delta) <> 0) g;
    IF tiers IS NOT NULL THEN
        PERFORM pgqueue.queue_counts_add(tiers, tenants, deltas);
    END IF;
    -- A claim, a heartbeat, a retry: nothing succeeded with usage, nothing to charge.
    IF NOT EXISTS (SELECT 1 FROM new_rows n
                   WHERE n.state = 'succeeded'
                     AND (n.input_tokens IS NOT NULL OR n.output_tokens IS NOT NULL)) THEN
        RETURN NULL;
    END IF;
    WITH charged AS (
        INSERT INTO pgqueue.usage_daily AS u (tenant_id, day, requests, input_tokens,
                                              output_tokens)
        SELECT n.tenant_id, pgqueue.budget_day(), count(*),
               sum(coalesce(n.input_tokens, 0)), sum(coalesce(n.output_tokens, 0))
        FROM new_rows n
        JOIN old_rows o ON o.id = n.id AND o.tenant_id = n.tenant_id
        WHERE n.state = 'succeeded' AND o.state = 'running'
          AND (n.input_tokens IS NOT NULL OR n.output_tokens IS NOT NULL)
        GROUP BY n.tenant_id
        ORDER BY n.tenant_id COLLATE "C"
        ON CONFLICT (tenant_id, day) DO UPDATE
        SET requests = u.requests + EXCLUDED.requests,
            input_tokens = u.input_tokens + EXCLUDED.input_tokens,
            output_tokens = u.output_tokens + EXCLUDED.output_tokens
        RETURNING u.tenant_id
    )
    SELECT array_agg(c.tenant_id ORDER BY c.tenant_id COLLATE "C") INTO tenants FROM charged c;
    FOREACH t IN ARRAY coalesce(tenants, '{}') LOOP
        PERFORM pgqueue.demotion_check(t);
    END LOOP;
    RETURN NULL;
END
$$;
"""

OLD_CLAIM_ORDER = """\
CREATE VIEW pgqueue.claim_order AS
SELECT p.seq, p.tier, p.round, p.tenant_id, p.job_id, p.cost
FROM pgqueue.claim_preview(
    coalesce(nullif(current_setting('pgqueue.claim_order_rows', true), '')::integer, 100)) p
ORDER BY p.seq;
"""


def upgrade() -> None:
    for text in (
        DROP_V1,
        JOBS_COLUMNS,
        TABLES,
        SCHEDULER,
        CLAIM,
        TRY_ENQUEUE,
        JOBS_AFTER_INSERT,
        JOBS_AFTER_UPDATE,
        CLAIM_ORDER,
    ):
        op.execute(text)


def downgrade() -> None:
    for text in (
        DROP_V2,
        OLD_TABLES,
        OLD_CLAIM,
        OLD_DISPATCH,
        OLD_TRY_ENQUEUE,
        OLD_JOBS_AFTER_INSERT,
        OLD_JOBS_AFTER_UPDATE,
        OLD_CLAIM_ORDER,
    ):
        op.execute(text)
