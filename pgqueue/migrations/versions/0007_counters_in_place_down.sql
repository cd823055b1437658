-- Revision 0007 downgrade: the 0006 bodies of the counter triggers and the admission check.

CREATE OR REPLACE FUNCTION pgqueue.queue_counts_on_insert()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
    SELECT n.priority, n.tenant_id, count(*)
    FROM new_rows n
    WHERE n.state = 'queued'
    GROUP BY GROUPING SETS ((n.priority, n.tenant_id), (n.priority));
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.queue_counts_on_update()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
    SELECT d.priority, d.tenant_id, sum(d.delta)
    FROM (SELECT n.priority, n.tenant_id, 1 AS delta FROM new_rows n WHERE n.state = 'queued'
          UNION ALL
          SELECT o.priority, o.tenant_id, -1 FROM old_rows o WHERE o.state = 'queued') d
    GROUP BY GROUPING SETS ((d.priority, d.tenant_id), (d.priority))
    HAVING sum(d.delta) <> 0;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.queue_counts_on_delete()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
    SELECT o.priority, o.tenant_id, -count(*)
    FROM old_rows o
    WHERE o.state = 'queued'
    GROUP BY GROUPING SETS ((o.priority, o.tenant_id), (o.priority));
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pgqueue.admission_check(p_tier pgqueue.tier, p_tenant text, n integer DEFAULT 1,
                                        OUT admitted boolean, OUT policy text, OUT scope text,
                                        OUT depth bigint, OUT cap bigint)
LANGUAGE plpgsql
AS $$
DECLARE
    tier_cap bigint;
    tenant_cap bigint;
    tier_depth bigint;
    tenant_depth bigint;
    rows_seen integer;
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
    SELECT coalesce(sum(c.queued) FILTER (WHERE c.tenant_id IS NULL), 0),
           coalesce(sum(c.queued) FILTER (WHERE c.tenant_id = p_tenant), 0),
           count(*)
    INTO tier_depth, tenant_depth, rows_seen
    FROM pgqueue.queue_counts c
    WHERE c.tier = p_tier
      AND (c.tenant_id IS NULL OR (tenant_cap IS NOT NULL AND c.tenant_id = p_tenant));
    IF rows_seen > 32 THEN
        PERFORM pgqueue.queue_counts_compact(p_tier, p_tenant, 1000);
    END IF;
    IF tier_cap IS NOT NULL AND tier_depth + n > tier_cap THEN
        admitted := false; scope := 'tier'; depth := tier_depth; cap := tier_cap;
    ELSIF tenant_cap IS NOT NULL AND tenant_depth + n > tenant_cap THEN
        admitted := false; scope := 'tenant'; depth := tenant_depth; cap := tenant_cap;
    END IF;
END
$$;

DROP FUNCTION pgqueue.queue_counts_add(pgqueue.tier[], text[], bigint[]);
