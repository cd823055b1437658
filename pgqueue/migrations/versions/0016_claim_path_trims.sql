-- pgqueue schema, revision 0016: the queued counters take one statement per key.
--
-- Revision 0007's queue_counts_add did every key in one statement (a CTE that picked an
-- unlocked row per key with LATERAL ... FOR UPDATE SKIP LOCKED, updated the picked rows by a
-- TID list with a correlated delta, then inserted the keys it could not place). A write
-- touches few keys (a single enqueue two, a claim of 10 jobs about eight), and starting that
-- statement cost more than the work: one UPDATE per key, on the row its subquery locked,
-- costs less. Same rule as before: each delta goes into a row of its key that no other
-- transaction holds, or into a new row when all are held (or when the locked row is a version
-- committed after this statement's snapshot, which the UPDATE then does not see: still exact).

CREATE OR REPLACE FUNCTION pgqueue.queue_counts_add(p_tiers pgqueue.tier[], p_tenants text[],
                                                    p_queued bigint[])
RETURNS void
LANGUAGE plpgsql
-- The plan is the same index lookup and TID fetch for any key.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    i integer;
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
    FOR i IN 1 .. cardinality(p_tiers) LOOP
        IF p_tenants[i] IS NULL THEN  -- the tier's total
            UPDATE pgqueue.queue_counts c SET queued = c.queued + p_queued[i]
            WHERE c.ctid = (SELECT x.ctid FROM pgqueue.queue_counts x
                            WHERE x.tier = p_tiers[i] AND x.tenant_id IS NULL
                            LIMIT 1 FOR UPDATE SKIP LOCKED);
        ELSE
            UPDATE pgqueue.queue_counts c SET queued = c.queued + p_queued[i]
            WHERE c.ctid = (SELECT x.ctid FROM pgqueue.queue_counts x
                            WHERE x.tier = p_tiers[i] AND x.tenant_id = p_tenants[i]
                            LIMIT 1 FOR UPDATE SKIP LOCKED);
        END IF;
        IF NOT FOUND THEN
            INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
            VALUES (p_tiers[i], p_tenants[i], p_queued[i]);
        END IF;
    END LOOP;
END
$$;
