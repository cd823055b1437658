"""The fold leaves rows another transaction holds unstamped instead of waiting for them (found
by a tester): ``pgqueue.stamp`` locks each flow's next due jobs ``FOR NO KEY UPDATE SKIP
LOCKED`` before it keys them. A ``cancel_queued`` of one tenant held open in a transaction (or
a user's UPDATE of a queued job left open) made the claim's fold wait for that tenant's rows,
and with it the workers' claims for every tenant; such a row is now stamped at a later fold if
it is still queued then. The text is 070_scheduler.sql's.

Revision ID: 0064
Revises: 0063
"""

from __future__ import annotations

from alembic import op

revision = "0064"
down_revision = "0063"
branch_labels = None
depends_on = None

STAMP = r"""
CREATE OR REPLACE FUNCTION pgqueue.stamp(p_lane text, p_tier pgqueue.tier, p_horizon integer)
RETURNS bigint
LANGUAGE plpgsql
SET jit TO 'off'
SET enable_seqscan TO 'off'
SET enable_incremental_sort TO 'off'  -- a tenant's FIFO is a range of jobs_unstamped_idx
AS $$
DECLARE
    lt pgqueue.lane_tiers;
    cr bigint;
    cp numeric;
    cs bigint;
    base bigint;
    look_at_all boolean;
    slice constant integer := greatest(1, pgqueue.setting('stamp_slice_flows', 64)::integer);
    margin constant interval := make_interval(secs => pgqueue.setting('stamp_arrival_margin', 0.1));
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
    -- The tenants to visit: a slice of the cut flows, and those with no cut flow and jobs due
    -- since 0.1 s before the last fold began (a skip scan over the distinct (run_at, tenant)
    -- pairs: an enqueue's run_at is its transaction's start), or, at most once a second, any
    -- unstamped due jobs (a job that committed later still).
    WITH RECURSIVE arrived(run_at, tenant_id) AS (
        (SELECT j.run_at, j.tenant_id FROM pgqueue.jobs j
         WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
           AND j.key_round IS NULL AND j.run_at >= lt.folded_at - margin
           AND j.run_at <= now()
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
        SELECT n.tenant_id FROM (SELECT tenant_id FROM arrived
                                 UNION SELECT tenant_id FROM everyone) n
        WHERE NOT EXISTS (SELECT FROM pgqueue.flows f WHERE f.lane = p_lane AND f.tier = p_tier
                                                        AND f.tenant_id = n.tenant_id AND f.cut)
        UNION SELECT c.tenant_id FROM (  -- cut, all its stamped jobs claimed (the frontier's)
            SELECT f.tenant_id FROM pgqueue.flows f
            WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut
              AND (f.last_round, f.place, f.last_seq) <= (cr, cp, cs)
            ORDER BY f.last_round, f.place, f.last_seq LIMIT slice) c
        UNION SELECT c.tenant_id FROM (SELECT f.tenant_id FROM pgqueue.flows f  -- cut, its next
            WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut  -- job within the horizon
              AND f.next_round <= base + p_horizon ORDER BY f.next_round, f.place LIMIT slice) c
    ), flows_in AS (   -- a flow continues while its last stamped job is queued, or it was cut
        SELECT p.tenant_id, f.place, f.last_round, f.last_seq, f.credit,
               round(pgqueue.tenant_quantum(p.tenant_id) * 1000)::bigint AS q,
               coalesce(f.cut OR h.holds_one, false) AS continuing,
               coalesce(h.holds_one, false) AS holds_one
        FROM pending p
        LEFT JOIN pgqueue.flows f
               ON f.lane = p_lane AND f.tier = p_tier AND f.tenant_id = p.tenant_id
        LEFT JOIN LATERAL (SELECT true AS holds_one FROM pgqueue.jobs j  -- a probe, not a hash
            WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'  -- of every job
              AND j.key_round IS NOT NULL
              AND (j.key_round, j.key_place, j.key_seq) = (f.last_round, f.place, f.last_seq)
            LIMIT 1) h ON true
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
        SELECT fi.tenant_id, fi.q, fi.holds_one, fi.continuing OR jn.i <= slice AS whole,
               CASE WHEN fi.continuing THEN fi.place
                    WHEN pred.place IS NULL THEN cp - (jn.m + 1 - jn.i)
                    ELSE pred.place + (cp - pred.place) * jn.i / (jn.m + 1) END AS place,
               CASE WHEN fi.continuing THEN fi.last_round ELSE cr END AS r0,
               CASE WHEN fi.continuing THEN fi.credit ELSE 0 END AS d0,
               CASE WHEN fi.continuing THEN fi.last_seq ELSE 0 END AS s0
        FROM flows_in fi LEFT JOIN joiners jn USING (tenant_id) CROSS JOIN pred
    ), fetched AS (   -- each flow's next due jobs: a job costs >= 1000 units, so one more
                      -- than can fall within the horizon (a row left over: the flow is cut);
                      -- locked, and a row another transaction holds (a cancel, a user's
                      -- UPDATE left open) is left unstamped, not waited for: waiting, the
                      -- claim stopped every tenant's work (a tester); it is stamped at a
                      -- later fold if it is still queued then
        SELECT s.*, j.id, j.cost, count(*) OVER (PARTITION BY s.tenant_id) AS n_fetched,
               row_number() OVER w AS k, (sum(j.cost) OVER w)::bigint AS cum
        FROM starts s CROSS JOIN LATERAL (
            SELECT j.id, greatest(1, round(j.cost * 1000))::bigint AS cost, j.run_at
            FROM pgqueue.jobs j
            WHERE j.lane = p_lane AND j.priority = p_tier AND j.tenant_id = s.tenant_id
              AND j.state = 'queued' AND j.key_round IS NULL AND j.run_at <= now()
            ORDER BY j.run_at, j.id
            LIMIT CASE WHEN s.whole
                       THEN greatest(2, (p_horizon + 1 + base - s.r0) * s.q / 1000 + 1)
                       ELSE 2 END
            FOR NO KEY UPDATE OF j SKIP LOCKED) j
        WINDOW w AS (PARTITION BY s.tenant_id ORDER BY j.run_at, j.id)
    ), kept AS (
        SELECT f.*, r.rnd,
               (f.whole AND r.rnd <= base + p_horizon) OR (f.k = 1 AND NOT f.holds_one)
                   AS keep
        FROM fetched f, LATERAL (SELECT f.r0 + greatest(0, (f.cum - f.d0 + f.q - 1) / f.q)) r(rnd)
    ), numbered AS (
        SELECT k.*, lt.seq + row_number() OVER (ORDER BY k.tenant_id, k.k) AS sq
        FROM kept k WHERE k.keep
    ), last AS (      -- where each flow's last stamped job leaves it (or where it was)
        SELECT DISTINCT ON (s.tenant_id) s.tenant_id, s.place,
               coalesce(n.rnd, s.r0) AS last_round, coalesce(n.sq, s.s0) AS last_seq,
               coalesce(n.d0 + (n.rnd - n.r0) * n.q - n.cum, s.d0) AS credit,
               coalesce(c.cut, false) AS cut, c.next_round   -- none fetched: cancelled, not cut
        FROM starts s
        LEFT JOIN (SELECT k.tenant_id, bool_or(NOT k.keep) AS cut,
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
        full_at = CASE WHEN look_at_all THEN clock_timestamp() ELSE l.full_at END,
        (frontier_round, frontier_place, frontier_seq) = (
            SELECT f.last_round, f.place, f.last_seq FROM pgqueue.flows f
            WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut
            ORDER BY f.last_round, f.place, f.last_seq LIMIT 1)
    WHERE l.lane = p_lane AND l.tier = p_tier;
    RETURN coalesce(cardinality(ids), 0);
END
$$;

"""

STAMP_BEFORE = r"""
CREATE OR REPLACE FUNCTION pgqueue.stamp(p_lane text, p_tier pgqueue.tier, p_horizon integer)
RETURNS bigint
LANGUAGE plpgsql
SET jit TO 'off'
SET enable_seqscan TO 'off'
SET enable_incremental_sort TO 'off'  -- a tenant's FIFO is a range of jobs_unstamped_idx
AS $$
DECLARE
    lt pgqueue.lane_tiers;
    cr bigint;
    cp numeric;
    cs bigint;
    base bigint;
    look_at_all boolean;
    slice constant integer := greatest(1, pgqueue.setting('stamp_slice_flows', 64)::integer);
    margin constant interval := make_interval(secs => pgqueue.setting('stamp_arrival_margin', 0.1));
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
    -- The tenants to visit: a slice of the cut flows, and those with no cut flow and jobs due
    -- since 0.1 s before the last fold began (a skip scan over the distinct (run_at, tenant)
    -- pairs: an enqueue's run_at is its transaction's start), or, at most once a second, any
    -- unstamped due jobs (a job that committed later still).
    WITH RECURSIVE arrived(run_at, tenant_id) AS (
        (SELECT j.run_at, j.tenant_id FROM pgqueue.jobs j
         WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'
           AND j.key_round IS NULL AND j.run_at >= lt.folded_at - margin
           AND j.run_at <= now()
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
        SELECT n.tenant_id FROM (SELECT tenant_id FROM arrived
                                 UNION SELECT tenant_id FROM everyone) n
        WHERE NOT EXISTS (SELECT FROM pgqueue.flows f WHERE f.lane = p_lane AND f.tier = p_tier
                                                        AND f.tenant_id = n.tenant_id AND f.cut)
        UNION SELECT c.tenant_id FROM (  -- cut, all its stamped jobs claimed (the frontier's)
            SELECT f.tenant_id FROM pgqueue.flows f
            WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut
              AND (f.last_round, f.place, f.last_seq) <= (cr, cp, cs)
            ORDER BY f.last_round, f.place, f.last_seq LIMIT slice) c
        UNION SELECT c.tenant_id FROM (SELECT f.tenant_id FROM pgqueue.flows f  -- cut, its next
            WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut  -- job within the horizon
              AND f.next_round <= base + p_horizon ORDER BY f.next_round, f.place LIMIT slice) c
    ), flows_in AS (   -- a flow continues while its last stamped job is queued, or it was cut
        SELECT p.tenant_id, f.place, f.last_round, f.last_seq, f.credit,
               round(pgqueue.tenant_quantum(p.tenant_id) * 1000)::bigint AS q,
               coalesce(f.cut OR h.holds_one, false) AS continuing,
               coalesce(h.holds_one, false) AS holds_one
        FROM pending p
        LEFT JOIN pgqueue.flows f
               ON f.lane = p_lane AND f.tier = p_tier AND f.tenant_id = p.tenant_id
        LEFT JOIN LATERAL (SELECT true AS holds_one FROM pgqueue.jobs j  -- a probe, not a hash
            WHERE j.lane = p_lane AND j.priority = p_tier AND j.state = 'queued'  -- of every job
              AND j.key_round IS NOT NULL
              AND (j.key_round, j.key_place, j.key_seq) = (f.last_round, f.place, f.last_seq)
            LIMIT 1) h ON true
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
        SELECT fi.tenant_id, fi.q, fi.holds_one, fi.continuing OR jn.i <= slice AS whole,
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
            LIMIT CASE WHEN s.whole
                       THEN greatest(2, (p_horizon + 1 + base - s.r0) * s.q / 1000 + 1)
                       ELSE 2 END) j
        WINDOW w AS (PARTITION BY s.tenant_id ORDER BY j.run_at, j.id)
    ), kept AS (
        SELECT f.*, r.rnd,
               (f.whole AND r.rnd <= base + p_horizon) OR (f.k = 1 AND NOT f.holds_one)
                   AS keep
        FROM fetched f, LATERAL (SELECT f.r0 + greatest(0, (f.cum - f.d0 + f.q - 1) / f.q)) r(rnd)
    ), numbered AS (
        SELECT k.*, lt.seq + row_number() OVER (ORDER BY k.tenant_id, k.k) AS sq
        FROM kept k WHERE k.keep
    ), last AS (      -- where each flow's last stamped job leaves it (or where it was)
        SELECT DISTINCT ON (s.tenant_id) s.tenant_id, s.place,
               coalesce(n.rnd, s.r0) AS last_round, coalesce(n.sq, s.s0) AS last_seq,
               coalesce(n.d0 + (n.rnd - n.r0) * n.q - n.cum, s.d0) AS credit,
               coalesce(c.cut, false) AS cut, c.next_round   -- none fetched: cancelled, not cut
        FROM starts s
        LEFT JOIN (SELECT k.tenant_id, bool_or(NOT k.keep) AS cut,
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
        full_at = CASE WHEN look_at_all THEN clock_timestamp() ELSE l.full_at END,
        (frontier_round, frontier_place, frontier_seq) = (
            SELECT f.last_round, f.place, f.last_seq FROM pgqueue.flows f
            WHERE f.lane = p_lane AND f.tier = p_tier AND f.cut
            ORDER BY f.last_round, f.place, f.last_seq LIMIT 1)
    WHERE l.lane = p_lane AND l.tier = p_tier;
    RETURN coalesce(cardinality(ids), 0);
END
$$;

"""


def upgrade() -> None:
    op.execute(STAMP)


def downgrade() -> None:
    op.execute(STAMP_BEFORE)
