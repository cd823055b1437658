-- Pruning: rows the queue no longer needs. Finished jobs go by the named statement job_prune
-- (sql/queries/jobs.sql); the scheduler's idle flow rows by flows_prune, below. The worker
-- runs both on its rescuer's round (pgqueue.worker.upkeep), `pgqueue prune` on demand.

-- Delete up to p_limit rows of pgqueue.flows (070_scheduler.sql) of tenants that left their
-- lane and tier: flows the horizon did not cut, whose last stamped job is no longer queued,
-- and whose last key the cursor has reached (claimed in key order, or passed). At its next
-- job such a tenant joins afresh, in a round after the cursor's, whether its row is there or
-- not (pgqueue.stamp's flows_in), so pruning leaves the claim order as it was (docs/drr.md,
-- "Pruning"). A lane and tier with such rows is pruned under pgqueue.fold's try-lock (a pair
-- being folded is skipped), by a statement after the lock, which sees what the last fold
-- committed; one with none is not locked. Returns the number of rows deleted.
CREATE OR REPLACE FUNCTION pgqueue.flows_prune(p_limit integer)
RETURNS bigint
LANGUAGE plpgsql
SET jit TO 'off'
AS $$
DECLARE
    lt record;
    cr bigint;
    cp numeric;
    cs bigint;
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
        DELETE FROM pgqueue.flows f WHERE f.ctid IN (
            SELECT x.ctid FROM pgqueue.flows x
            WHERE x.lane = lt.lane AND x.tier = lt.tier AND NOT x.cut
              AND (x.last_round, x.place, x.last_seq) <= (cr, cp, cs)
              AND NOT EXISTS (
                  SELECT FROM pgqueue.jobs j
                  WHERE j.lane = lt.lane AND j.priority = lt.tier AND j.state = 'queued'
                    AND (j.key_round, j.key_place, j.key_seq)
                        = (x.last_round, x.place, x.last_seq))
            LIMIT p_limit - total);
        GET DIAGNOSTICS n = ROW_COUNT;
        total := total + n;
    END LOOP;
    RETURN total;
END
$$;
