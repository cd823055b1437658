-- One job, in fewer statements (revision 0019).
--
-- The insert trigger's bookkeeping (tenant check, DRR inbox, queue counts, NOTIFY) cost about
-- 80 µs of server CPU for a one-row INSERT: five statements and a plpgsql function over a
-- transition table, built for batches. For the common single job (no dedupe key, a tenant
-- already registered, no admission cap, READ COMMITTED), try_enqueue now does that work
-- itself: the tenant lock and the tier's admission row come with the demotion lookup (one
-- statement), and the job's row, its inbox entry, its two counter updates and the NOTIFY are
-- one statement of data-modifying CTEs. While that statement runs, the transaction-local
-- setting pgqueue.insert_bookkept names the transaction and the trigger depth, and
-- jobs_after_insert (WHEN) does not fire for it; the setting is cleared right after, and a
-- failed statement takes it back with its (sub)transaction. As with revision 0017's
-- pgqueue.claim_counted, a value left in the session (SET, ALTER ROLE) or by another
-- transaction never switches the trigger off; the depth keeps it on for an insert that a
-- user's row trigger on pgqueue.jobs makes during that statement (one level deeper), and off
-- for try_enqueue called from a user's trigger on another table (the same level). Every
-- other insert into pgqueue.jobs keeps the trigger. Every other case of try_enqueue takes
-- revision 0008's path.

DROP TRIGGER jobs_after_insert ON pgqueue.jobs;
CREATE TRIGGER jobs_after_insert
    AFTER INSERT ON pgqueue.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT
    WHEN (current_setting('pgqueue.insert_bookkept', true)
          IS DISTINCT FROM pg_current_xact_id()::text || '/' || pg_trigger_depth())
    EXECUTE FUNCTION pgqueue.jobs_after_insert();
