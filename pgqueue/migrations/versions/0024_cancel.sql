-- Revision 0024: cancelling a job (pgqueue.cancel).

CREATE FUNCTION pgqueue.cancel(job_id bigint, tenant_id text DEFAULT NULL,
                               reason text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
-- Cancel one queued or running job; returns its state after the call: 'cancelled' (now, or
-- before), or the state it had already finished in ('succeeded' or 'failed'), unchanged.
-- A running job loses its lease: its worker's outcome write is fenced off (dropped), and the
-- worker stops its handler at its next heartbeat. The counters (queue_counts) follow through
-- jobs_after_update; a DRR pair left without queued jobs leaves the round at its turn.
-- With `tenant_id`, only that tenant's job; a session that sets pgqueue.tenant_id (a
-- producer's tenant scope, see `pgqueue grant`) only ever reaches its own tenant's jobs.
-- Raises PQ011 when no such job is visible, PQ009 for a reason that is empty or longer than
-- 1,000 characters.
DECLARE
    scope text := nullif(current_setting('pgqueue.tenant_id', true), '');
    found_state pgqueue.job_state;
    found_tenant text;
BEGIN
    IF cancel.reason IS NOT NULL AND (cancel.reason = '' OR char_length(cancel.reason) > 1000)
    THEN
        RAISE EXCEPTION 'reason must be 1 to 1000 characters' USING ERRCODE = 'PQ009';
    END IF;
    -- Waits for a claim or an outcome write that holds the row, then sees what it wrote.
    SELECT j.state, j.tenant_id INTO found_state, found_tenant
    FROM pgqueue.jobs j
    WHERE j.id = cancel.job_id
      AND (cancel.tenant_id IS NULL OR j.tenant_id = cancel.tenant_id)
      AND (scope IS NULL OR j.tenant_id = scope)
    FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PQ011', MESSAGE = format(
            'no job %s%s', cancel.job_id,
            coalesce(' of tenant ' || quote_literal(coalesce(cancel.tenant_id, scope)), ''));
    END IF;
    IF found_state NOT IN ('queued', 'running') THEN
        RETURN found_state::text;
    END IF;
    UPDATE pgqueue.jobs j
    SET state = 'cancelled',
        finished_at = now(),
        last_error = 'cancelled' || coalesce(': ' || cancel.reason, ''),
        lease_token = NULL,
        lease_expires_at = NULL
    WHERE j.id = cancel.job_id AND j.tenant_id = found_tenant;
    RETURN 'cancelled';
END
$$;
