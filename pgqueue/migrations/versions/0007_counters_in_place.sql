-- pgqueue schema, revision 0007: the queued counters of admission control are updated in place.
--
-- Revision 0006 appended one delta row per key for every write to pgqueue.jobs and folded the
-- rows later. Under concurrent producers the log grew faster than it was folded, and every
-- enqueue with a cap re-read (and re-folded) the same hot rows: with 4 producers, caps on ran
-- at 0.42x of caps off. Now a write adds its delta to a counter row of the key that no other
-- transaction holds (SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE of that row), and appends a
-- new row only when every row of the key is held by someone else. So nobody ever waits on a
-- counter row (a long producer transaction keeps only its own rows), the rows per key stay about
-- the number of concurrent writers of that key, and the value is still the sum of the committed
-- rows, exact in every snapshot. docs/admission.md explains the design.

-- Add deltas to the queued counters: keys (tier, tenant_id), tenant_id NULL being the tier's
-- total; arrays of equal length, one entry per distinct key. In READ COMMITTED (the default)
-- each delta goes into a row of its key that no other transaction holds, or into a new row;
-- in REPEATABLE READ or SERIALIZABLE every delta is a new row (updating a row another
-- transaction changed after our snapshot would raise a serialization failure there).
CREATE FUNCTION pgqueue.queue_counts_add(p_tiers pgqueue.tier[], p_tenants text[],
                                         p_queued bigint[])
RETURNS void
LANGUAGE plpgsql
-- The plan is the same two index lookups for any keys; re-planning per call cost ~120 us.
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    IF coalesce(cardinality(p_tiers), 0) = 0 THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
        SELECT u.tier, u.tenant_id, u.queued FROM unnest(p_tiers, p_tenants, p_queued)
                                                  AS u(tier, tenant_id, queued);
        RETURN;
    END IF;
    -- A row locked here may be a version committed after this statement's snapshot; the
    -- UPDATE then does not see it and the key's delta goes to a new row instead (still exact).
    WITH d AS (
        SELECT u.tier, u.tenant_id, u.queued, u.ord
        FROM unnest(p_tiers, p_tenants, p_queued) WITH ORDINALITY AS u(tier, tenant_id, queued, ord)
    ), picked AS (
        SELECT d.ord, d.queued, p.row_id
        FROM d
        CROSS JOIN LATERAL (
            SELECT c.ctid AS row_id FROM pgqueue.queue_counts c
            WHERE c.tier = d.tier AND c.tenant_id = d.tenant_id
            LIMIT 1 FOR UPDATE SKIP LOCKED
        ) p
        WHERE d.tenant_id IS NOT NULL
        UNION ALL
        SELECT d.ord, d.queued, p.row_id
        FROM d
        CROSS JOIN LATERAL (
            SELECT c.ctid AS row_id FROM pgqueue.queue_counts c
            WHERE c.tier = d.tier AND c.tenant_id IS NULL
            LIMIT 1 FOR UPDATE SKIP LOCKED
        ) p
        WHERE d.tenant_id IS NULL
    ), bumped AS (
        -- By TID list, not a join: a join may be planned as a scan of every counter row
        -- (the plan is generic, made once per session, maybe while the table was small).
        UPDATE pgqueue.queue_counts c
        SET queued = c.queued + (SELECT p.queued FROM picked p WHERE p.row_id = c.ctid)
        WHERE c.ctid = ANY (ARRAY(SELECT picked.row_id FROM picked))
        RETURNING c.tier, c.tenant_id  -- one locked row per key: the key tells which delta
    )
    INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
    SELECT d.tier, d.tenant_id, d.queued
    FROM d
    WHERE NOT EXISTS (SELECT 1 FROM bumped b
                      WHERE b.tier = d.tier AND b.tenant_id IS NOT DISTINCT FROM d.tenant_id);
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.queue_counts_on_insert()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    tiers pgqueue.tier[];
    tenants text[];
    deltas bigint[];
BEGIN
    SELECT array_agg(g.tier), array_agg(g.tenant_id), array_agg(g.n)
    INTO tiers, tenants, deltas
    FROM (SELECT n.priority AS tier, n.tenant_id, count(*) AS n
          FROM new_rows n
          WHERE n.state = 'queued'
          GROUP BY GROUPING SETS ((n.priority, n.tenant_id), (n.priority))) g;
    PERFORM pgqueue.queue_counts_add(tiers, tenants, deltas);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.queue_counts_on_update()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    tiers pgqueue.tier[];
    tenants text[];
    deltas bigint[];
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
    PERFORM pgqueue.queue_counts_add(tiers, tenants, deltas);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.queue_counts_on_delete()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    tiers pgqueue.tier[];
    tenants text[];
    deltas bigint[];
BEGIN
    SELECT array_agg(g.tier), array_agg(g.tenant_id), array_agg(g.n)
    INTO tiers, tenants, deltas
    FROM (SELECT o.priority AS tier, o.tenant_id, -count(*) AS n
          FROM old_rows o
          WHERE o.state = 'queued'
          GROUP BY GROUPING SETS ((o.priority, o.tenant_id), (o.priority))) g;
    PERFORM pgqueue.queue_counts_add(tiers, tenants, deltas);
    RETURN NULL;
END
$$;

-- The admission verdict (as in 0006), reading the tier's total and the tenant's count with one
-- index lookup each instead of every counter row of the tier.
CREATE OR REPLACE FUNCTION pgqueue.admission_check(p_tier pgqueue.tier, p_tenant text,
                                                   n integer DEFAULT 1,
                                                   OUT admitted boolean, OUT policy text,
                                                   OUT scope text, OUT depth bigint,
                                                   OUT cap bigint)
LANGUAGE plpgsql
AS $$
DECLARE
    tier_cap bigint;
    tenant_cap bigint;
    tier_depth bigint := 0;
    tenant_depth bigint := 0;
    tier_rows integer := 0;
    tenant_rows integer := 0;
BEGIN
    SELECT a.policy, a.max_queued, coalesce(t.max_queued, a.tenant_max_queued)
    INTO policy, tier_cap, tenant_cap
    FROM pgqueue.admission a
    LEFT JOIN pgqueue.tenants t ON t.tenant_id = p_tenant
    WHERE a.tier = p_tier;
    admitted := true;
    IF tier_cap IS NULL AND tenant_cap IS NULL THEN
        RETURN;
    END IF;
    IF tier_cap IS NOT NULL THEN
        SELECT coalesce(sum(c.queued), 0), count(*) INTO tier_depth, tier_rows
        FROM pgqueue.queue_counts c
        WHERE c.tier = p_tier AND c.tenant_id IS NULL;
    END IF;
    IF tenant_cap IS NOT NULL THEN
        SELECT coalesce(sum(c.queued), 0), count(*) INTO tenant_depth, tenant_rows
        FROM pgqueue.queue_counts c
        WHERE c.tier = p_tier AND c.tenant_id = p_tenant;
    END IF;
    -- Fold only in READ COMMITTED: under REPEATABLE READ or SERIALIZABLE, locking a row that
    -- changed after the snapshot raises a serialization failure (the workers fold anyway).
    IF tier_rows + tenant_rows > 32
       AND current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM pgqueue.queue_counts_compact(p_tier, p_tenant, 1000);
    END IF;
    IF tier_cap IS NOT NULL AND tier_depth + n > tier_cap THEN
        admitted := false; scope := 'tier'; depth := tier_depth; cap := tier_cap;
    ELSIF tenant_cap IS NOT NULL AND tenant_depth + n > tenant_cap THEN
        admitted := false; scope := 'tenant'; depth := tenant_depth; cap := tenant_cap;
    END IF;
END
$$;

-- Fold what the 0006 log left behind into one row per key.
SELECT pgqueue.queue_counts_compact(NULL, NULL, 1000000);
