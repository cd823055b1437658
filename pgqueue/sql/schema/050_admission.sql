-- Admission control: per-tier and per-tenant caps on queued jobs and the policy of a full
-- tier, checked against exact counters (queue_counts: a delta log written by the triggers on
-- jobs, folded by queue_counts_compact). docs/admission.md explains the design.

-- The admission verdict (as in 0006), reading the tier's total and the tenant's count with one
-- index lookup each instead of every counter row of the tier. depth is NULL for a full tier
-- when the session may not see every tenant's jobs (a producer).
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
        -- The tier's depth counts every tenant's jobs: only for a session that may see them
        -- all (pgqueue.session_writes_jobs); a producer learns the cap and that it is reached
        -- (found by a hostile tester, issue 32: the error told a tenant others' queue depth).
        admitted := false; scope := 'tier'; cap := tier_cap;
        depth := CASE WHEN pgqueue.session_writes_jobs() THEN tier_depth END;
    ELSIF tenant_cap IS NOT NULL AND tenant_depth + n > tenant_cap THEN
        admitted := false; scope := 'tenant'; depth := tenant_depth; cap := tenant_cap;
    END IF;
END
$$;

-- Set a tier's caps and policy (NULL caps = none). Critical work is never dropped.
CREATE OR REPLACE FUNCTION pgqueue.admission_set(tier text, max_queued bigint, tenant_max_queued bigint,
                                                 policy text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF tier IS NULL OR tier NOT IN ('critical', 'standard', 'batch') THEN
        RAISE EXCEPTION 'unknown tier %; expected critical, standard or batch',
            quote_nullable(tier) USING ERRCODE = 'PQ009';
    END IF;
    IF policy IS NULL OR policy NOT IN ('reject', 'block', 'drop') THEN
        RAISE EXCEPTION 'unknown admission policy %; expected reject, block or drop',
            quote_nullable(policy) USING ERRCODE = 'PQ009';
    END IF;
    IF tier = 'critical' AND policy = 'drop' THEN
        RAISE EXCEPTION 'critical work is never dropped: use reject or block for the critical tier'
            USING ERRCODE = 'PQ009';
    END IF;
    IF max_queued < 0 OR tenant_max_queued < 0 THEN
        RAISE EXCEPTION 'caps must be >= 0 or NULL (no cap)' USING ERRCODE = 'PQ009';
    END IF;
    UPDATE pgqueue.admission a
    SET max_queued = admission_set.max_queued,
        tenant_max_queued = admission_set.tenant_max_queued,
        policy = admission_set.policy,
        updated_at = now()
    WHERE a.tier = admission_set.tier::pgqueue.tier;
END
$$;

-- Every tier keeps its admission row: deleting or truncating them is refused.
CREATE OR REPLACE FUNCTION pgqueue.admission_keep_rows() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'pgqueue.admission keeps one row per tier: set its caps to NULL instead '
                    '(pgqueue admission set)' USING ERRCODE = 'PQ009';
END
$$;

CREATE TRIGGER admission_keep_rows
    BEFORE DELETE ON pgqueue.admission
    FOR EACH ROW
    EXECUTE FUNCTION pgqueue.admission_keep_rows();

CREATE TRIGGER admission_keep_rows_truncate
    BEFORE TRUNCATE ON pgqueue.admission
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgqueue.admission_keep_rows();

-- Add deltas to the queued counters: keys (tier, tenant_id), tenant_id NULL being the tier's
-- total; arrays of equal length, one entry per distinct key. In READ COMMITTED (the default)
-- each delta goes into a row of its key that no other transaction holds, or into a new row;
-- in REPEATABLE READ or SERIALIZABLE every delta is a new row (updating a row another
-- transaction changed after our snapshot would raise a serialization failure there).
-- enable_seqscan off (revision 0072): the generic plans read the one-page table by Seq Scan
-- and updated by Seq Scan, not TID, testing every dead version of its rows, which another
-- claimer's snapshot keeps from pruning (212 to 384 versions a job at two connections,
-- bench/claim_instructions_peer.py --conns 2: -1.5 % instructions a job at one, -2.9 % at
-- two; the floor's -7.6 % and -11.6 %).
CREATE OR REPLACE FUNCTION pgqueue.queue_counts_add(
    p_tiers pgqueue.tier[],
    p_tenants text[],
    p_queued bigint[]
)
RETURNS void
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
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
    -- One UPDATE per key (revision 0016), on a row of the key no other transaction holds.
    FOR i IN 1 .. cardinality(p_tiers) LOOP
        IF p_tenants[i] IS NULL THEN  -- the tier's total
            UPDATE pgqueue.queue_counts c SET queued = c.queued + p_queued[i]
            WHERE c.ctid = (SELECT x.ctid FROM pgqueue.queue_counts x
                            WHERE x.tier = p_tiers[i] AND x.tenant_id IS NULL
                            AND NOT x.claim_stripe
                            LIMIT 1 FOR UPDATE SKIP LOCKED);
        ELSE
            UPDATE pgqueue.queue_counts c SET queued = c.queued + p_queued[i]
            WHERE c.ctid = (SELECT x.ctid FROM pgqueue.queue_counts x
                            WHERE x.tier = p_tiers[i] AND x.tenant_id = p_tenants[i]
                            AND NOT x.claim_stripe
                            LIMIT 1 FOR UPDATE SKIP LOCKED);
        END IF;
        -- No row (all held, or the one locked changed after the snapshot): a new row.
        IF NOT FOUND THEN
            INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
            VALUES (p_tiers[i], p_tenants[i], p_queued[i]);
        END IF;
    END LOOP;
END
$$;

-- The counters follow every write on pgqueue.jobs: inserts and updates through
-- jobs_after_insert and jobs_after_update (040, 080), deletes and truncates through the
-- triggers below.
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

CREATE TRIGGER jobs_queue_counts_delete
    AFTER DELETE ON pgqueue.jobs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgqueue.queue_counts_on_delete();

CREATE OR REPLACE FUNCTION pgqueue.queue_counts_on_truncate()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pgqueue.queue_counts_rebuild();
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_queue_counts_truncate
    AFTER TRUNCATE ON pgqueue.jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgqueue.queue_counts_on_truncate();

-- Fold the committed delta rows of one tier (and its total plus one tenant's rows when
-- p_tenant is given), or of every key when p_tier is NULL, into one row per key. Rows another
-- transaction is folding are skipped, never waited for; returns the number of rows folded.
CREATE OR REPLACE FUNCTION pgqueue.queue_counts_compact(
    p_tier pgqueue.tier DEFAULT NULL::pgqueue.tier,
    p_tenant text DEFAULT NULL::text,
    max_rows integer DEFAULT 10000
)
RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    folded integer;
BEGIN
    WITH picked AS (
        SELECT c.ctid AS row_id
        FROM pgqueue.queue_counts c
        WHERE NOT c.claim_stripe  -- claims' rows stay (revision 0017)
          AND (p_tier IS NULL
           OR (c.tier = p_tier AND (c.tenant_id IS NULL OR c.tenant_id = p_tenant)))
        LIMIT max_rows
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM pgqueue.queue_counts c
        WHERE c.ctid = ANY (ARRAY(SELECT picked.row_id FROM picked))
        RETURNING c.tier, c.tenant_id, c.queued, c.dropped
    ), kept AS (
        INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued, dropped)
        SELECT g.tier, g.tenant_id, sum(g.queued), sum(g.dropped)
        FROM gone g
        GROUP BY g.tier, g.tenant_id
        HAVING sum(g.queued) <> 0 OR sum(g.dropped) <> 0
    )
    SELECT count(*) INTO folded FROM gone;
    RETURN folded;
END
$$;

-- Turn the counter rows of v1's claims (claim_stripe) into ordinary rows for the compactor to
-- fold. Scheduler v2 (revision 0042) writes no such rows: this only releases those that a
-- database upgraded from v1 still holds, so it takes no lock (v1's advisory lock is gone).
CREATE OR REPLACE FUNCTION pgqueue.queue_counts_release_claims() RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    released integer;
BEGIN
    UPDATE pgqueue.queue_counts c SET claim_stripe = false WHERE c.claim_stripe;
    GET DIAGNOSTICS released = ROW_COUNT;
    RETURN released;
END
$$;

-- Recount queued jobs from pgqueue.jobs (drop counts are kept). Blocks writers of jobs for
-- its duration; used by this migration, after TRUNCATE, and as a repair tool.
CREATE OR REPLACE FUNCTION pgqueue.queue_counts_rebuild()
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    LOCK TABLE pgqueue.jobs IN SHARE MODE;
    LOCK TABLE pgqueue.queue_counts IN EXCLUSIVE MODE;
    WITH gone AS (
        DELETE FROM pgqueue.queue_counts c RETURNING c.tier, c.tenant_id, c.dropped
    )
    INSERT INTO pgqueue.queue_counts (tier, tenant_id, dropped)
    SELECT g.tier, g.tenant_id, sum(g.dropped) FROM gone g
    GROUP BY g.tier, g.tenant_id
    HAVING sum(g.dropped) <> 0;
    INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
    SELECT j.priority, j.tenant_id, count(*)
    FROM pgqueue.jobs j
    WHERE j.state = 'queued'
    GROUP BY GROUPING SETS ((j.priority, j.tenant_id), (j.priority));
END
$$;
