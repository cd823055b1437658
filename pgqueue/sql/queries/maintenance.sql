-- Upkeep a worker does besides claiming: pruning and vacuum of the scheduler's small, hot
-- tables.

-- name: flow_prune :one
-- Delete up to `limit` rows of pgqueue.flows of tenants that left their lane and tier
-- (pgqueue.flows_prune, 075_prune.sql; they rejoin afresh, in the same order); one pruner at
-- a time (the row 'prune' of pgqueue.leader_locks, as job_prune: a concurrent call deletes
-- nothing). Returns how many.
WITH leader AS MATERIALIZED (
    SELECT l.name FROM pgqueue.leader_locks l WHERE l.name = 'prune' FOR UPDATE SKIP LOCKED
)
SELECT coalesce((SELECT pgqueue.flows_prune(%(limit)s) FROM leader), 0) AS deleted

-- name: hot_tables_vacuum_due :one
-- Whether the hot tables are due for a vacuum (nobody, autovacuum included, vacuumed the
-- claimers' cursors in the last %(seconds)s s), and whether this role may vacuum all of them
-- (their owner, or, on Postgres 17 and newer, the MAINTAIN privilege `pgqueue grant` gives
-- pgqueue_worker). The date of the last vacuum is what keeps a fleet of workers to about one
-- vacuum per interval; no lock is held across statements, which PgBouncer's transaction mode
-- could not keep on one server connection.
SELECT coalesce(now() - greatest(s.last_vacuum, s.last_autovacuum)
                    >= make_interval(secs => %(seconds)s), true) AS due,
       (SELECT bool_and(pg_has_role(c.relowner, 'USAGE')
                        OR CASE WHEN current_setting('server_version_num')::int >= 170000
                                THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END)
        FROM pg_class c
        WHERE c.oid IN ('pgqueue.lane_tiers'::regclass, 'pgqueue.flows'::regclass,
                        'pgqueue.cursors'::regclass, 'pgqueue.queue_counts'::regclass,
                        'pgqueue.rate_limits'::regclass)) AS allowed
FROM pg_stat_user_tables s
WHERE s.relid = 'pgqueue.cursors'::regclass

-- name: hot_tables_vacuum :exec
-- Every claim moves its claimer's cursor row (a key update, so not HOT), every fold rewrites
-- its lane and tier's row and the flows it stamped, and claims and completions write the
-- counters and the limiter's buckets: their dead rows pile up between autovacuum rounds
-- (autovacuum_naptime, 1 min by default), and the stamper and the claims read them by index.
-- (Measured under scheduler v1: one minute of single enqueues at ~560/s left its inbox at
-- 120 pages of dead rows, all scanned by every claim.) SKIP_LOCKED: a table another vacuum
-- holds is skipped this round.
VACUUM (SKIP_LOCKED) pgqueue.lane_tiers, pgqueue.flows, pgqueue.cursors,
    pgqueue.queue_counts, pgqueue.rate_limits
