-- pgqueue schema, revision 0006: admission control on enqueue. Per-tier and per-tenant caps on
-- queued depth, a policy per tier (reject | block | drop; critical work is never dropped), and
-- exact queued counters kept as an append-only delta log. docs/admission.md explains the design.

-- ------------------------------------------------------------------------------ settings

-- One row per tier. max_queued caps the tier's queued jobs (all tenants); tenant_max_queued
-- caps one tenant's queued jobs in the tier (pgqueue.tenants.max_queued overrides it per
-- tenant). NULL = no cap. The policy says what a full tier does with a new job: reject raises
-- PQ010 (Python QueueFull), block makes the Python producer wait for room (SQL cannot wait:
-- it raises PQ010 too), drop stores nothing, counts the drop and returns NULL.
CREATE TABLE pgqueue.admission (
    tier               pgqueue.tier PRIMARY KEY,
    max_queued         bigint CHECK (max_queued IS NULL OR max_queued >= 0),
    tenant_max_queued  bigint CHECK (tenant_max_queued IS NULL OR tenant_max_queued >= 0),
    policy             text NOT NULL DEFAULT 'reject'
                       CHECK (policy IN ('reject', 'block', 'drop')),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT admission_critical_never_dropped CHECK (tier <> 'critical' OR policy <> 'drop')
);
INSERT INTO pgqueue.admission (tier) VALUES ('critical'), ('standard'), ('batch');

ALTER TABLE pgqueue.tenants
    ADD COLUMN max_queued bigint CHECK (max_queued IS NULL OR max_queued >= 0);

-- ------------------------------------------------------------------------------ counters

-- Queued jobs per (tier, tenant) and per tier (tenant_id NULL), plus jobs dropped by
-- admission, as an append-only log of deltas: the exact value is the sum of the committed
-- rows. Writers only INSERT (triggers on pgqueue.jobs, in the writer's transaction), so a long
-- producer transaction never holds a lock a claim waits for. Anyone may fold rows into one per
-- key (pgqueue.queue_counts_compact: DELETE ... SKIP LOCKED + INSERT of the sums), so the log
-- stays about one row per active key and reading a depth stays cheap.
CREATE TABLE pgqueue.queue_counts (
    tier       pgqueue.tier NOT NULL,
    tenant_id  text,
    queued     bigint NOT NULL DEFAULT 0,
    dropped    bigint NOT NULL DEFAULT 0
);
CREATE INDEX queue_counts_key_idx ON pgqueue.queue_counts (tier, tenant_id);

CREATE FUNCTION pgqueue.queue_counts_on_insert()
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

CREATE FUNCTION pgqueue.queue_counts_on_update()
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

CREATE FUNCTION pgqueue.queue_counts_on_delete()
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

-- Recount queued jobs from pgqueue.jobs (drop counts are kept). Blocks writers of jobs for
-- its duration; used by this migration, after TRUNCATE, and as a repair tool.
CREATE FUNCTION pgqueue.queue_counts_rebuild()
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

CREATE FUNCTION pgqueue.queue_counts_on_truncate()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pgqueue.queue_counts_rebuild();
    RETURN NULL;
END
$$;

-- Creating the triggers locks pgqueue.jobs against writers until this migration commits, so
-- the initial count below is exact.
CREATE TRIGGER jobs_queue_counts_insert
    AFTER INSERT ON pgqueue.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.queue_counts_on_insert();
CREATE TRIGGER jobs_queue_counts_update
    AFTER UPDATE ON pgqueue.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.queue_counts_on_update();
CREATE TRIGGER jobs_queue_counts_delete
    AFTER DELETE ON pgqueue.jobs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.queue_counts_on_delete();
CREATE TRIGGER jobs_queue_counts_truncate
    AFTER TRUNCATE ON pgqueue.jobs
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.queue_counts_on_truncate();

SELECT pgqueue.queue_counts_rebuild();

-- Fold the committed delta rows of one tier (and its total plus one tenant's rows when
-- p_tenant is given), or of every key when p_tier is NULL, into one row per key. Rows another
-- transaction is folding are skipped, never waited for; returns the number of rows folded.
CREATE FUNCTION pgqueue.queue_counts_compact(p_tier pgqueue.tier DEFAULT NULL,
                                             p_tenant text DEFAULT NULL,
                                             max_rows integer DEFAULT 10000)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    folded integer;
BEGIN
    WITH picked AS (
        SELECT c.ctid AS row_id
        FROM pgqueue.queue_counts c
        WHERE p_tier IS NULL
           OR (c.tier = p_tier AND (c.tenant_id IS NULL OR c.tenant_id = p_tenant))
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

-- ----------------------------------------------------------------------------- the check

-- The admission verdict for n new jobs of one tenant in one tier: admitted, or the scope
-- (tier | tenant) whose cap is reached, with that scope's queued depth and cap. With no cap
-- configured nothing is read. Folds the counters it read when they span many rows.
CREATE FUNCTION pgqueue.admission_check(p_tier pgqueue.tier, p_tenant text, n integer DEFAULT 1,
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

-- Set a tier's caps and policy (NULL caps = none). Critical work is never dropped.
CREATE FUNCTION pgqueue.admission_set(tier text, max_queued bigint, tenant_max_queued bigint,
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

-- ---------------------------------------------------------------------------------- enqueue

-- At-least-once made safe: an optional dedupe key, unique among a tenant's live (queued or
-- running) jobs. Enqueueing a key that is live returns the existing job's id and writes
-- nothing; once that job has finished, the key may be used again.
ALTER TABLE pgqueue.jobs ADD COLUMN dedupe_key text
    CHECK (dedupe_key IS NULL OR (dedupe_key <> '' AND char_length(dedupe_key) <= 256));
CREATE UNIQUE INDEX jobs_dedupe_live_idx ON pgqueue.jobs (tenant_id, dedupe_key)
    WHERE dedupe_key IS NOT NULL AND state IN ('queued', 'running');

-- Enqueue one job unless admission control refuses it; never raises for a full queue.
-- outcome: 'enqueued' (id set), 'dropped' (tier policy drop: nothing stored, the drop
-- counted) or 'full' (policy reject or block: nothing written at all). Bad input raises the
-- PQ001..PQ009 SQLSTATEs as pgqueue.enqueue does. The Python enqueue calls this, so that a
-- full queue leaves the caller's transaction usable without a savepoint.
CREATE FUNCTION pgqueue.try_enqueue(tenant_id text, origin text, payload jsonb,
                                    sla_seconds double precision DEFAULT NULL,
                                    kind text DEFAULT 'anthropic.messages',
                                    max_attempts integer DEFAULT NULL,
                                    run_at timestamptz DEFAULT NULL,
                                    dedupe_key text DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text, tier pgqueue.tier, policy text, scope text,
               depth bigint, cap bigint)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    o pgqueue.origin;
    t pgqueue.tier;
    v record;
    est integer;
    new_id bigint;
BEGIN
    o := pgqueue.validate_job(try_enqueue.tenant_id, try_enqueue.origin, try_enqueue.payload,
                              try_enqueue.sla_seconds, try_enqueue.kind,
                              try_enqueue.max_attempts);
    IF try_enqueue.dedupe_key IS NOT NULL THEN
        IF try_enqueue.dedupe_key = '' OR char_length(try_enqueue.dedupe_key) > 256 THEN
            RAISE EXCEPTION 'dedupe_key must be 1 to 256 characters' USING ERRCODE = 'PQ009';
        END IF;
        SELECT j.id INTO new_id FROM pgqueue.jobs j
        WHERE j.tenant_id = try_enqueue.tenant_id AND j.dedupe_key = try_enqueue.dedupe_key
          AND j.state IN ('queued', 'running');
        IF FOUND THEN
            RETURN QUERY SELECT new_id, 'duplicate'::text, NULL::pgqueue.tier, NULL::text,
                                NULL::text, NULL::bigint, NULL::bigint;
            RETURN;
        END IF;
    END IF;
    t := pgqueue.classify(o, try_enqueue.sla_seconds, pgqueue.is_demoted(try_enqueue.tenant_id));
    v := pgqueue.admission_check(t, try_enqueue.tenant_id, 1);
    IF NOT v.admitted THEN
        IF v.policy = 'drop' THEN
            INSERT INTO pgqueue.queue_counts (tier, tenant_id, dropped)
            VALUES (t, try_enqueue.tenant_id, 1);
            RETURN QUERY SELECT NULL::bigint, 'dropped'::text, t, v.policy, v.scope, v.depth,
                                v.cap;
        ELSE
            RETURN QUERY SELECT NULL::bigint, 'full'::text, t, v.policy, v.scope, v.depth,
                                v.cap;
        END IF;
        RETURN;
    END IF;
    PERFORM pgqueue.ensure_tenant(try_enqueue.tenant_id);
    est := pgqueue.estimate_input_tokens(try_enqueue.payload);
    INSERT INTO pgqueue.jobs AS j (tenant_id, kind, origin, sla_seconds, priority, payload,
                                   model, est_input_tokens, max_output_tokens, cost,
                                   max_attempts, run_at, dedupe_key)
    VALUES (try_enqueue.tenant_id, try_enqueue.kind, o, try_enqueue.sla_seconds, t,
            try_enqueue.payload, try_enqueue.payload ->> 'model', est,
            pgqueue.payload_max_tokens(try_enqueue.payload),
            pgqueue.job_cost(est), coalesce(try_enqueue.max_attempts, 5),
            coalesce(try_enqueue.run_at, now()), try_enqueue.dedupe_key)
    ON CONFLICT (tenant_id, dedupe_key)
        WHERE dedupe_key IS NOT NULL AND state IN ('queued', 'running')
        DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN  -- a concurrent enqueue of the same key won the race
        SELECT j.id INTO new_id FROM pgqueue.jobs j
        WHERE j.tenant_id = try_enqueue.tenant_id AND j.dedupe_key = try_enqueue.dedupe_key
          AND j.state IN ('queued', 'running');
        RETURN QUERY SELECT new_id, 'duplicate'::text, NULL::pgqueue.tier, NULL::text,
                            NULL::text, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;
    RETURN QUERY SELECT new_id, 'enqueued'::text, t, v.policy, NULL::text, NULL::bigint,
                        NULL::bigint;
END
$$;

-- Raised for a full tier whose policy is reject or block: SQLSTATE PQ010, the verdict as JSON
-- in DETAIL (tier, tenant_id, policy, scope, depth, cap).
CREATE FUNCTION pgqueue.raise_queue_full(p_tier pgqueue.tier, p_tenant text, p_policy text,
                                         p_scope text, p_depth bigint, p_cap bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'queue full: % holds % queued jobs (cap %, policy %)',
        CASE p_scope WHEN 'tier' THEN 'tier ' || p_tier
                     ELSE 'tenant ' || quote_literal(p_tenant) || ' in tier ' || p_tier END,
        p_depth, p_cap, p_policy
        USING ERRCODE = 'PQ010',
              DETAIL = json_build_object('tier', p_tier, 'tenant_id', p_tenant,
                                         'policy', p_policy, 'scope', p_scope,
                                         'depth', p_depth, 'cap', p_cap)::text,
              HINT = 'retry later; inside a transaction, enqueue under a SAVEPOINT to keep it';
END
$$;

-- Enqueue one job inside the caller's transaction; returns its id, or NULL when the tier's
-- admission policy dropped it. A full tier with policy reject or block raises PQ010 before
-- writing anything (SQL cannot wait; the Python producer implements block).
DROP FUNCTION pgqueue.enqueue(text, text, jsonb, double precision, text, integer, timestamptz);
CREATE FUNCTION pgqueue.enqueue(tenant_id text, origin text, payload jsonb,
                                sla_seconds double precision DEFAULT NULL,
                                kind text DEFAULT 'anthropic.messages',
                                max_attempts integer DEFAULT NULL,
                                run_at timestamptz DEFAULT NULL,
                                dedupe_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r
    FROM pgqueue.try_enqueue(enqueue.tenant_id, enqueue.origin, enqueue.payload,
                             enqueue.sla_seconds, enqueue.kind, enqueue.max_attempts,
                             enqueue.run_at, enqueue.dedupe_key);
    IF r.outcome = 'full' THEN
        PERFORM pgqueue.raise_queue_full(r.tier, enqueue.tenant_id, r.policy, r.scope, r.depth,
                                         r.cap);
    END IF;
    RETURN r.id;
END
$$;

-- One job of a batch on its way through pgqueue.try_enqueue_many.
CREATE TYPE pgqueue.enqueue_batch_item AS (
    ord bigint, tenant_id text, o pgqueue.origin, payload jsonb, sla double precision,
    kind text, tier pgqueue.tier, admitted boolean, policy text, scope text, depth bigint,
    cap bigint
);

-- Many jobs in one statement (arrays of equal length), admitted in input order: job i is
-- admitted when its tenant and its tier still have room after the jobs admitted before it.
-- One row per input position (ord, 1-based). When a job finds its tier full and the tier's
-- policy is reject or block, nothing is written and only the refused rows come back (outcome
-- 'full'); otherwise admitted jobs are stored ('enqueued', id set) and the rest are dropped
-- ('dropped', counted).
CREATE FUNCTION pgqueue.try_enqueue_many(tenant_ids text[], origins text[], payloads jsonb[],
                                         sla_seconds double precision[] DEFAULT NULL,
                                         kinds text[] DEFAULT NULL)
RETURNS TABLE (ord bigint, id bigint, outcome text, tier pgqueue.tier, policy text,
               scope text, depth bigint, cap bigint)
LANGUAGE plpgsql
AS $$
DECLARE
    n integer := coalesce(cardinality(tenant_ids), 0);
    batch pgqueue.enqueue_batch_item[];
BEGIN
    IF coalesce(cardinality(origins), 0) <> n OR coalesce(cardinality(payloads), 0) <> n
       OR (sla_seconds IS NOT NULL AND cardinality(sla_seconds) <> n)
       OR (kinds IS NOT NULL AND cardinality(kinds) <> n) THEN
        RAISE EXCEPTION 'enqueue_many: all arrays must have the same length'
            USING ERRCODE = 'PQ009';
    END IF;
    WITH input AS (
        SELECT i.ord, i.tenant_id, i.origin, i.payload,
               (try_enqueue_many.sla_seconds)[i.ord] AS sla,
               coalesce((try_enqueue_many.kinds)[i.ord], 'anthropic.messages') AS kind
        FROM unnest(tenant_ids, origins, payloads)
             WITH ORDINALITY AS i(tenant_id, origin, payload, ord)
    ), checked AS (
        SELECT input.*,
               pgqueue.validate_job(input.tenant_id, input.origin, input.payload, input.sla,
                                    input.kind, NULL) AS o
        FROM input
    ), classified AS (
        SELECT c.*, pgqueue.classify(c.o, c.sla, pgqueue.is_demoted(c.tenant_id)) AS tier
        FROM checked c
    ), keyed AS (
        -- Room per (tier, tenant) and per tier, read once per key.
        SELECT k.tier, k.tenant_id, v.policy, v.tier_cap, v.tenant_cap,
               v.tier_depth, v.tenant_depth
        FROM (SELECT DISTINCT classified.tier, classified.tenant_id FROM classified) k
        CROSS JOIN LATERAL (
            SELECT a.policy, a.max_queued AS tier_cap,
                   coalesce(t.max_queued, a.tenant_max_queued) AS tenant_cap,
                   (SELECT coalesce(sum(c.queued), 0) FROM pgqueue.queue_counts c
                    WHERE a.max_queued IS NOT NULL
                      AND c.tier = k.tier AND c.tenant_id IS NULL) AS tier_depth,
                   (SELECT coalesce(sum(c.queued), 0) FROM pgqueue.queue_counts c
                    WHERE coalesce(t.max_queued, a.tenant_max_queued) IS NOT NULL
                      AND c.tier = k.tier AND c.tenant_id = k.tenant_id) AS tenant_depth
            FROM pgqueue.admission a
            LEFT JOIN pgqueue.tenants t ON t.tenant_id = k.tenant_id
            WHERE a.tier = k.tier
        ) v
    ), ranked AS (
        SELECT c.*, k.policy, k.tier_cap, k.tenant_cap, k.tier_depth, k.tenant_depth,
               (k.tenant_cap IS NULL
                OR k.tenant_depth + row_number() OVER (PARTITION BY c.tier, c.tenant_id
                                                       ORDER BY c.ord) <= k.tenant_cap)
                   AS tenant_ok
        FROM classified c
        JOIN keyed k ON k.tier = c.tier AND k.tenant_id = c.tenant_id
    ), judged AS (
        SELECT r.*,
               r.tenant_ok AND (r.tier_cap IS NULL
                                OR r.tier_depth + count(*) FILTER (WHERE r.tenant_ok)
                                   OVER (PARTITION BY r.tier ORDER BY r.ord) <= r.tier_cap)
                   AS ok
        FROM ranked r
    )
    SELECT array_agg(ROW(
               j.ord, j.tenant_id, j.o, j.payload, j.sla, j.kind, j.tier, j.ok, j.policy,
               CASE WHEN j.ok THEN NULL WHEN NOT j.tenant_ok THEN 'tenant' ELSE 'tier' END,
               CASE WHEN j.ok THEN NULL WHEN NOT j.tenant_ok THEN j.tenant_depth
                    ELSE j.tier_depth END,
               CASE WHEN j.ok THEN NULL WHEN NOT j.tenant_ok THEN j.tenant_cap
                    ELSE j.tier_cap END)::pgqueue.enqueue_batch_item ORDER BY j.ord)
    INTO batch
    FROM judged j;

    IF EXISTS (SELECT 1 FROM unnest(batch) b WHERE NOT b.admitted AND b.policy <> 'drop') THEN
        RETURN QUERY
        SELECT b.ord, NULL::bigint, 'full'::text, b.tier, b.policy, b.scope, b.depth, b.cap
        FROM unnest(batch) b
        WHERE NOT b.admitted AND b.policy <> 'drop'
        ORDER BY b.ord;
        RETURN;
    END IF;

    -- New tenants are registered in one global order, so that two batches registering the
    -- same new tenants cannot deadlock on each other's uncommitted tenant rows.
    PERFORM pgqueue.ensure_tenant(d.tenant_id)
    FROM (SELECT DISTINCT b.tenant_id FROM unnest(batch) b WHERE b.admitted) d
    ORDER BY d.tenant_id COLLATE "C";
    INSERT INTO pgqueue.queue_counts (tier, tenant_id, dropped)
    SELECT b.tier, b.tenant_id, count(*) FROM unnest(batch) b
    WHERE NOT b.admitted GROUP BY b.tier, b.tenant_id;

    RETURN QUERY
    WITH ins AS (
        INSERT INTO pgqueue.jobs AS j (tenant_id, kind, origin, sla_seconds, priority, payload,
                                       model, est_input_tokens, max_output_tokens, cost)
        SELECT b.tenant_id, b.kind, b.o, b.sla, b.tier, b.payload, b.payload ->> 'model', e.est,
               pgqueue.payload_max_tokens(b.payload), pgqueue.job_cost(e.est)
        FROM unnest(batch) b
        CROSS JOIN LATERAL (SELECT pgqueue.estimate_input_tokens(b.payload) AS est) e
        WHERE b.admitted
        ORDER BY b.ord
        RETURNING j.id
    ), ids AS (
        SELECT ins.id, row_number() OVER (ORDER BY ins.id) AS k FROM ins
    ), admitted AS (
        SELECT b.ord, row_number() OVER (ORDER BY b.ord) AS k
        FROM unnest(batch) b WHERE b.admitted
    )
    SELECT b.ord, ids.id,
           CASE WHEN b.admitted THEN 'enqueued' ELSE 'dropped' END::text,
           b.tier, b.policy, b.scope, b.depth, b.cap
    FROM unnest(batch) b
    LEFT JOIN admitted a ON a.ord = b.ord
    LEFT JOIN ids ON ids.k = a.k
    ORDER BY b.ord;
END
$$;

-- Enqueue many jobs in one statement; returns one id per input position, in input order
-- (NULL where the tier's policy dropped the job). A job refused by a full reject/block tier
-- raises PQ010 and nothing is written.
CREATE OR REPLACE FUNCTION pgqueue.enqueue_many(tenant_ids text[], origins text[],
                                                payloads jsonb[],
                                                sla_seconds double precision[] DEFAULT NULL,
                                                kinds text[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql
AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT * FROM pgqueue.try_enqueue_many(tenant_ids, origins, payloads,
                                               enqueue_many.sla_seconds, kinds) AS t
        ORDER BY t.ord
    LOOP
        IF r.outcome = 'full' THEN
            PERFORM pgqueue.raise_queue_full(r.tier, tenant_ids[r.ord], r.policy, r.scope,
                                             r.depth, r.cap);
        END IF;
        RETURN NEXT r.id;
    END LOOP;
END
$$;

-- --------------------------------------------------------------------------------- views

-- Per tier: queued jobs (from the counters, no scan of jobs), the caps and policy, and the
-- jobs dropped by admission so far.
CREATE VIEW pgqueue.admission_status AS
SELECT a.tier, coalesce(c.queued, 0)::bigint AS queued, a.max_queued, a.tenant_max_queued,
       a.policy, coalesce(c.dropped, 0)::bigint AS dropped
FROM pgqueue.admission a
LEFT JOIN (
    SELECT qc.tier,
           sum(qc.queued) FILTER (WHERE qc.tenant_id IS NULL) AS queued,
           sum(qc.dropped) FILTER (WHERE qc.tenant_id IS NOT NULL) AS dropped
    FROM pgqueue.queue_counts qc
    GROUP BY qc.tier
) c ON c.tier = a.tier
ORDER BY a.tier;
