-- Revision 0012 undone: the five triggers of revisions 0001-0007 on their functions again.
DROP TRIGGER jobs_after_insert ON pgqueue.jobs;
DROP TRIGGER jobs_after_update ON pgqueue.jobs;
DROP FUNCTION pgqueue.jobs_after_insert();
DROP FUNCTION pgqueue.jobs_after_update();

CREATE TRIGGER jobs_notify_insert
    AFTER INSERT ON pgqueue.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.notify_jobs();
CREATE TRIGGER jobs_drr_insert
    AFTER INSERT ON pgqueue.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.drr_note_inserted();
CREATE TRIGGER jobs_charge_usage
    AFTER UPDATE ON pgqueue.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.job_charge_usage();
CREATE TRIGGER jobs_queue_counts_insert
    AFTER INSERT ON pgqueue.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.queue_counts_on_insert();
CREATE TRIGGER jobs_queue_counts_update
    AFTER UPDATE ON pgqueue.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.queue_counts_on_update();
