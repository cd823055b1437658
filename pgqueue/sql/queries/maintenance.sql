-- Upkeep a worker does besides claiming: vacuum of the scheduler's small, hot tables.

-- name: hot_tables_vacuum_lock :one
-- One vacuuming worker at a time (session lock: VACUUM cannot run inside a transaction).
SELECT pg_try_advisory_lock(%(lock_key)s) AS leader

-- name: hot_tables_vacuum :exec
-- Every claim drains the DRR inbox by a full scan and rewrites deficits, tier state and
-- counters rows: their dead rows pile up between autovacuum rounds (autovacuum_naptime, 1 min
-- by default), and a claim reads them all. One measured minute of single enqueues at ~560/s
-- left the inbox at 120 pages of dead rows, all scanned by every claim. SKIP_LOCKED: a table
-- another vacuum holds is skipped this round. Tables this role does not own are skipped with
-- a warning.
VACUUM (SKIP_LOCKED) pgqueue.drr_inbox, pgqueue.deficits, pgqueue.tier_state,
    pgqueue.queue_counts, pgqueue.rate_limits

-- name: hot_tables_vacuum_unlock :one
SELECT pg_advisory_unlock(%(lock_key)s) AS released
