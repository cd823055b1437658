-- Pruning: rows the queue no longer needs. Finished jobs go by the named statement job_prune
-- (sql/queries/jobs.sql); the scheduler's idle flow rows by flows_prune, below. The worker
-- runs both on its rescuer's round (pgqueue.worker.upkeep), `pgqueue prune` on demand.

-- Delete up to p_limit rows of pgqueue.flows (070_scheduler.sql) that no queued job needs:
-- flows the horizon did not cut none of whose stamped jobs is queued any more (a flow's jobs
-- carry its place, between the lane and tier's next key and the flow's last key). At its next
-- job such a tenant joins afresh whether its row is there or not (pgqueue.stamp's flows_in),
-- so pruning leaves the claim order as it was (docs/drr.md, "Pruning"). Only flows whose last
-- key is at or before the cursor (claimed, or passed) are looked at, so that the live flows
-- of a busy lane cost a comparison each. A lane and tier with such flows is pruned under
-- pgqueue.fold's try-lock (a pair being folded is skipped), by statements after the lock,
-- which see what the last fold committed. Returns the number of rows deleted.
CREATE OR REPLACE FUNCTION pgqueue.flows_prune(p_limit integer)
RETURNS bigint
LANGUAGE plpgsql
SET jit TO 'off'
AS $$
DECLARE
    lt record;
    cr bigint; cp numeric; cs bigint;
    hr bigint; hp numeric; hs bigint;
    n bigint;
    total bigint := 0;
BEGIN
    FOR lt IN SELECT l.lane, l.tier FROM pgqueue.lane_tiers l ORDER BY l.lane, l.tier LOOP
        EXIT WHEN total >= p_limit;
        SELECT c.key_round, c.key_place, c.key_seq INTO cr, cp, cs
        FROM pgqueue.cursors c WHERE c.lane = lt.lane AND c.tier = lt.tier
        ORDER BY c.key_round DESC, c.key_place DESC, c.key_seq DESC LIMIT 1;
        CONTINUE WHEN cr IS NULL OR NOT EXISTS (
            SELECT FROM pgqueue.flows x
            WHERE x.lane = lt.lane AND x.tier = lt.tier AND NOT x.cut
              AND (x.last_round, x.place, x.last_seq) <= (cr, cp, cs));
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtextextended(lt.lane,
                                  array_position(enum_range(NULL::pgqueue.tier), lt.tier)));
        SELECT j.key_round, j.key_place, j.key_seq INTO hr, hp, hs FROM pgqueue.jobs j
        WHERE j.lane = lt.lane AND j.priority = lt.tier AND j.state = 'queued'
          AND j.key_round IS NOT NULL
        ORDER BY j.key_round, j.key_place, j.key_seq LIMIT 1;
        DELETE FROM pgqueue.flows f WHERE f.ctid IN (
            SELECT x.ctid FROM pgqueue.flows x
            WHERE x.lane = lt.lane AND x.tier = lt.tier AND NOT x.cut
              AND (x.last_round, x.place, x.last_seq) <= (cr, cp, cs)
              AND CASE WHEN EXISTS (   -- its last stamped job is queued: the flow goes on
                            SELECT FROM pgqueue.jobs j
                            WHERE j.lane = lt.lane AND j.priority = lt.tier
                              AND j.state = 'queued' AND (j.key_round, j.key_place, j.key_seq)
                                                         = (x.last_round, x.place, x.last_seq))
                       THEN false
                       ELSE hr IS NULL OR NOT EXISTS (   -- nor is an earlier one
                            SELECT FROM pgqueue.jobs j
                            WHERE j.lane = lt.lane AND j.priority = lt.tier
                              AND j.state = 'queued' AND j.key_round IS NOT NULL
                              AND (j.key_round, j.key_place, j.key_seq) >= (hr, hp, hs)
                              AND (j.key_round, j.key_place, j.key_seq)
                                  <= (x.last_round, x.place, x.last_seq)
                              AND j.key_place = x.place AND j.tenant_id = x.tenant_id) END
            LIMIT p_limit - total);
        GET DIAGNOSTICS n = ROW_COUNT;
        total := total + n;
    END LOOP;
    RETURN total;
END
$$;
