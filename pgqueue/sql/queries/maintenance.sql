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

-- name: jobs_analyze_due :one
-- Whether pgqueue.jobs's planner statistics are missing or describe a table of another size:
-- never analyzed (reltuples -1), or live rows (n_live_tup) off from the rows its last ANALYZE
-- counted by more than half of them plus 1,000. Every claim statement runs a generic plan
-- made once a session (claim_lanes); made with no statistics (a queue filled since its last
-- ANALYZE, before autovacuum's next round: autovacuum_naptime, 1 min by default), the fold's
-- probe read a tenant index whole: a claim of 10 took 6.9 ms instead of 1.6 ms with 10,000
-- jobs just enqueued (and Postgres CPU per job of `bench/cpu_per_job.py` went from 294 to
-- 630 us). Rows written are not the test: a drain writes each job three times (stamp, claim,
-- success) without changing the table's size, and counting them ran an ANALYZE every few
-- thousand jobs (3-5 in a 20,000-job drain, 4-7 % of its Postgres time, each invalidating
-- every session's plans). Drift within a size is autovacuum's
-- (autovacuum_analyze_scale_factor 0.02 on pgqueue.jobs). `allowed`: this role may ANALYZE it
-- (its owner, or MAINTAIN on Postgres 17 and newer).
SELECT c.reltuples < 0 OR abs(s.n_live_tup - c.reltuples) > 1000 + c.reltuples / 2 AS due,
       pg_has_role(c.relowner, 'USAGE')
       OR CASE WHEN current_setting('server_version_num')::int >= 170000
               THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END AS allowed
FROM pg_class c
JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = 'pgqueue.jobs'::regclass

-- name: jobs_analyze :exec
-- SKIP_LOCKED: another worker analyzing it now does it for this one.
ANALYZE (SKIP_LOCKED) pgqueue.jobs
