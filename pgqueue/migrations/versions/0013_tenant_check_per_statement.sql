-- pgqueue schema, revision 0013: the jobs-to-tenants reference is checked once per statement.
--
-- The foreign key jobs.tenant_id -> tenants ran one lookup per inserted row (a row trigger with
-- its own query): about half the cost of inserting a job, the largest part of a bulk enqueue.
-- The insert trigger now checks (and FOR KEY SHARE-locks, as the foreign key did) the distinct
-- tenants of the statement at once, and a trigger on pgqueue.tenants refuses to delete or
-- rename a tenant that jobs still reference, and TRUNCATE pgqueue.tenants alone while jobs
-- remain. Errors keep the foreign key's SQLSTATE (23503). Unlike the foreign key, the check
-- reads the transaction's snapshot, so tenants are deleted or renamed in READ COMMITTED only
-- (in REPEATABLE READ it could miss a job committed after the snapshot).

ALTER TABLE pgqueue.jobs DROP CONSTRAINT jobs_tenant_id_fkey;

-- A tenant that jobs reference cannot go away or change its id (the foreign key's NO ACTION).
CREATE FUNCTION pgqueue.tenants_keep_referenced()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.tenant_id = OLD.tenant_id THEN
        RETURN NEW;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'delete or rename tenants in a READ COMMITTED transaction, not %',
            upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'The check for the tenant''s jobs must see jobs committed after '
                           'this transaction''s snapshot.';
    END IF;
    IF EXISTS (SELECT 1 FROM pgqueue.jobs j WHERE j.tenant_id = OLD.tenant_id) THEN
        RAISE EXCEPTION 'tenant % still has jobs in pgqueue.jobs', quote_literal(OLD.tenant_id)
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END
$$;

CREATE TRIGGER tenants_keep_referenced
    BEFORE DELETE OR UPDATE OF tenant_id ON pgqueue.tenants
    FOR EACH ROW EXECUTE FUNCTION pgqueue.tenants_keep_referenced();

-- A job moved to another tenant (rare: no pgqueue statement does it) must name a known one.
CREATE FUNCTION pgqueue.jobs_tenant_known()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM 1 FROM pgqueue.tenants t WHERE t.tenant_id = NEW.tenant_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown tenant %: register it first (pgqueue.ensure_tenant)',
            quote_literal(NEW.tenant_id) USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_tenant_known
    BEFORE UPDATE OF tenant_id ON pgqueue.jobs
    FOR EACH ROW WHEN (NEW.tenant_id IS DISTINCT FROM OLD.tenant_id)
    EXECUTE FUNCTION pgqueue.jobs_tenant_known();

-- TRUNCATE pgqueue.tenants while jobs remain (the foreign key refused it, or with CASCADE
-- emptied pgqueue.jobs too): refused, unless pgqueue.jobs is truncated in the same statement.
CREATE FUNCTION pgqueue.tenants_truncate_guard()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pgqueue.jobs) THEN
        RAISE EXCEPTION 'pgqueue.jobs still has jobs: truncate it in the same statement'
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tenants_truncate_guard
    AFTER TRUNCATE ON pgqueue.tenants
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.tenants_truncate_guard();
