-- pgqueue schema, revision 0013: the jobs-to-tenants reference is checked once per statement.
--
-- The foreign key jobs.tenant_id -> tenants ran one lookup per inserted row (a row trigger with
-- its own query): about half the cost of inserting a job, the largest part of a bulk enqueue.
-- The insert trigger now checks (and FOR KEY SHARE-locks, as the foreign key did) the distinct
-- tenants of the statement at once, and a trigger on pgqueue.tenants refuses to delete or
-- rename a tenant that jobs still reference. Errors keep the foreign key's SQLSTATE (23503).
-- (Not guarded: TRUNCATE pgqueue.tenants, an operator's tool; the claim treats a job of an
-- unregistered tenant as a tenant with the default quantum.)

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
