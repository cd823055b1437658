-- Settings and tenants: how a rule reads its GUC (pgqueue.<name>), a tenant's DRR quantum,
-- registering a tenant on first use (or refusing an unknown one, PQ007, when
-- pgqueue.require_known_tenant is on), and the triggers that keep jobs pointing at known
-- tenants without a foreign key (jobs has none: 010_tables.sql).

-- A numeric setting's value from its text `raw` (NULL or blank: `default_value`), checked
-- against its range: anything else raises PQ012 (InvalidSetting in pgqueue.errors) naming the
-- setting, its range and the value, never a cast's error (found by a tester, issue 28:
-- SET pgqueue.stamp_horizon_rounds = 'abc' failed every claim with "invalid input syntax for
-- type integer"). NaN, infinities and exponents past 4 digits are not numbers here. Every
-- numeric GUC that the SQL reads is listed in numeric_settings() ({least, greatest, 1 if a
-- whole number}); a name not listed is refused. Simple expressions only: settings are read on
-- every claim.
CREATE OR REPLACE FUNCTION pgqueue.numeric_settings()
RETURNS TABLE(name text, bounds numeric[])
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT v.name, v.bounds::numeric[] FROM (VALUES
        ('default_quantum', '{0.001, 1e9, 0}'),
        ('max_payload_bytes', '{1, 1073741824, 1}'),
        ('stamp_horizon_rounds', '{0, 1000, 1}'),
        ('stamp_slice_flows', '{1, 1000000, 1}'),
        ('stamp_arrival_margin', '{0, 60, 0}'),
        ('tier_weight_critical', '{0, 1e6, 0}'),
        ('tier_weight_standard', '{0, 1e6, 0}'),
        ('tier_weight_batch', '{0, 1e6, 0}'),
        ('default_requests_per_minute', '{0.001, 1e9, 0}'),
        ('default_input_tokens_per_minute', '{0.001, 1e12, 0}'),
        ('default_output_tokens_per_minute', '{0.001, 1e12, 0}'),
        ('ratelimit_trunk_reserve', '{0, 1, 0}'),
        ('ratelimit_trunk_reserve_jobs', '{0, 1e6, 0}'),
        ('ratelimit_input_margin', '{0, 1, 0}'),
        ('demotion_throttle_threshold', '{1, 2147483647, 1}'),
        ('demotion_throttle_window_seconds', '{0, 1e7, 0}'),
        ('demotion_budget_ratio', '{0, 1e6, 0}'),
        ('demotion_seconds', '{0, 1e8, 0}'),
        ('default_daily_budget', '{0, 1e15, 1}'),
        ('slo_p99_critical_seconds', '{0, 1e7, 0}'),
        ('slo_p99_standard_seconds', '{0, 1e7, 0}'),
        ('slo_p99_batch_seconds', '{0, 1e7, 0}')) AS v(name, bounds)
$$;

CREATE OR REPLACE FUNCTION pgqueue.setting_value(name text, raw text,
                                                 default_value double precision)
RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    b constant numeric[] := (SELECT n.bounds FROM pgqueue.numeric_settings() n
                             WHERE n.name = setting_value.name);
    v numeric;
BEGIN
    IF b IS NULL THEN
        RAISE EXCEPTION 'pgqueue.% is not a numeric setting of pgqueue', setting_value.name
            USING ERRCODE = 'PQ012';
    END IF;
    IF raw IS NULL OR btrim(raw) = '' THEN
        RETURN default_value;
    END IF;
    IF raw ~ '^\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,4})?\s*$' THEN
        v := raw::numeric;
        IF v BETWEEN b[1] AND b[2] AND (b[3] = 0 OR v = trunc(v)) THEN
            RETURN v::double precision;
        END IF;
    END IF;
    RAISE EXCEPTION 'pgqueue.% must be % from % to %, got %', setting_value.name,
        CASE WHEN b[3] = 1 THEN 'an integer' ELSE 'a number' END, b[1], b[2], quote_literal(raw)
        USING ERRCODE = 'PQ012',
              HINT = format('Fix or RESET pgqueue.%s (ALTER DATABASE, ALTER ROLE or SET; '
                            'default %s).', setting_value.name, default_value);
END
$$;

-- A numeric GUC (pgqueue.<name>) as this session sees it, checked (pgqueue.setting_value),
-- else the default (settings are read where the rule runs, on any host). Inlined: a setting
-- left unset costs no function call.
CREATE OR REPLACE FUNCTION pgqueue.setting(name text, default_value double precision)
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN coalesce(current_setting('pgqueue.' || name, true), '') = ''
                THEN default_value
                ELSE pgqueue.setting_value(name, current_setting('pgqueue.' || name, true),
                                           default_value) END
$$;

-- Every numeric setting as this session sees it, checked (PQ012 for the first bad one), and the
-- tier policy: a worker runs it when it starts and every half minute, so that a bad value stops
-- its claims before a job is sent, not when its outcome is written (found by a tester: a bad
-- pgqueue.demotion_throttle_threshold failed only the completion, and each rescue sent the
-- request again).
CREATE OR REPLACE FUNCTION pgqueue.settings_check()
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    PERFORM pgqueue.setting(n.name, 0) FROM pgqueue.numeric_settings() n;
    PERFORM pgqueue.tier_policy();
END
$$;

-- Base quantum in cost units: GUC pgqueue.default_quantum, else 5.
CREATE OR REPLACE FUNCTION pgqueue.base_quantum()
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT pgqueue.setting('default_quantum', 5.0)
$$;

-- quantum_for_plan() of pgqueue.scheduling.drr: the per-tenant override, else base × the
-- plan's multiplier (pro ×3, any other plan ×1).
CREATE OR REPLACE FUNCTION pgqueue.plan_quantum(plan text, override double precision,
                                                base double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT coalesce(override,
                    base * CASE lower(btrim(coalesce(plan, ''), E' \t\n\r\f\v'))
                               WHEN 'pro' THEN 3.0 ELSE 1.0 END)
$$;

-- A tenant's quantum in cost units per DRR turn (the default for an unknown tenant).
CREATE OR REPLACE FUNCTION pgqueue.tenant_quantum(tenant_id text)
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT pgqueue.plan_quantum(t.plan, t.quantum, pgqueue.base_quantum())
    FROM (SELECT 1) AS one
    LEFT JOIN pgqueue.tenants t ON t.tenant_id = tenant_quantum.tenant_id
$$;

-- A setting that guards the system (the payload cap, require_known_tenant), read where a
-- caller cannot raise it: the GUC pgqueue.<name> as this session sees it for a session whose
-- login role may write pgqueue.jobs itself (pgqueue.session_writes_jobs: the owner,
-- superusers, workers, admins, who may change anything anyway); for any other session (a
-- producer) only the value an admin set for this database (ALTER DATABASE ... SET) or for
-- all of them (ALTER ROLE ALL SET), never one the session set (SET, set_config, PGOPTIONS).
-- NULL when there is none. Found by a hostile tester (issue 32): a tenant's role ran
-- SET pgqueue.max_payload_bytes = 1e11 and enqueued a 3 MB payload past the 1 MiB cap.
CREATE OR REPLACE FUNCTION pgqueue.guarded_setting(name text)
RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
    IF pgqueue.session_writes_jobs() THEN
        RETURN current_setting('pgqueue.' || guarded_setting.name, true);
    END IF;
    RETURN (SELECT substr(c.item, char_length(guarded_setting.name) + 10)
            FROM pg_catalog.pg_db_role_setting s
            CROSS JOIN LATERAL unnest(s.setconfig) AS c(item)
            WHERE s.setrole = 0
              AND s.setdatabase IN (0, (SELECT d.oid FROM pg_catalog.pg_database d
                                        WHERE d.datname = current_database()))
              AND starts_with(c.item, 'pgqueue.' || guarded_setting.name || '=')
            ORDER BY s.setdatabase DESC
            LIMIT 1);
END
$$;

-- Whether jobs of tenants not in pgqueue.tenants are refused (PQ007) rather than their tenants
-- registered: the pgqueue.require_known_tenant setting (pgqueue.guarded_setting: a producer
-- cannot switch it off), read as Postgres reads a boolean (on/off, true/false, yes/no, 1/0,
-- t/f, y/n; any case, spaces around; unset or blank: off). Found by a tester: 'ON', 'yes' and
-- 'True ' read as off; and so did any other value ('maybe', 'onn'), which turned the rule off
-- silently: it raises PQ012 (InvalidSetting), as a bad numeric setting does (revision 0073).
CREATE OR REPLACE FUNCTION pgqueue.tenants_required()
RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    raw constant text := pgqueue.guarded_setting('require_known_tenant');
    v constant text := lower(btrim(coalesce(raw, '')));
BEGIN
    IF v IN ('on', 'true', 'yes', '1', 't', 'y') THEN
        RETURN true;
    ELSIF v IN ('', 'off', 'false', 'no', '0', 'f', 'n') THEN
        RETURN false;
    END IF;
    RAISE EXCEPTION 'pgqueue.require_known_tenant must be a boolean (on or off), got %',
        quote_literal(raw)
        USING ERRCODE = 'PQ012',
              HINT = 'Fix or RESET pgqueue.require_known_tenant (ALTER DATABASE, ALTER ROLE '
                     'or SET; default off).';
END
$$;

-- Registers the tenant on first use; with pgqueue.require_known_tenant on, refuses an unknown
-- tenant instead (PQ007).
CREATE OR REPLACE FUNCTION pgqueue.ensure_tenant(tenant_id text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM 1 FROM pgqueue.tenants t WHERE t.tenant_id = ensure_tenant.tenant_id;
    IF FOUND THEN
        RETURN;
    END IF;
    IF pgqueue.tenants_required() THEN
        RAISE EXCEPTION 'unknown tenant %', quote_literal(ensure_tenant.tenant_id)
            USING ERRCODE = 'PQ007';
    END IF;
    INSERT INTO pgqueue.tenants (tenant_id) VALUES (ensure_tenant.tenant_id)
    ON CONFLICT DO NOTHING;
END
$$;

-- A job moved to another tenant (rare: no pgqueue statement does it) must name a known one.
-- An AFTER trigger: any BEFORE ROW trigger makes every UPDATE of pgqueue.jobs lock each row
-- first, whatever its column list (revision 0048).
CREATE OR REPLACE FUNCTION pgqueue.jobs_tenant_known()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM 1 FROM pgqueue.tenants t WHERE t.tenant_id = NEW.tenant_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown tenant %: register it first (pgqueue.ensure_tenant)',
            quote_literal(NEW.tenant_id) USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_tenant_known
    AFTER UPDATE OF tenant_id ON pgqueue.jobs
    FOR EACH ROW
    WHEN ((new.tenant_id IS DISTINCT FROM old.tenant_id))
    EXECUTE FUNCTION pgqueue.jobs_tenant_known();

-- A tenant that jobs reference cannot go away or change its id (the foreign key's NO ACTION).
CREATE OR REPLACE FUNCTION pgqueue.tenants_keep_referenced()
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
    FOR EACH ROW
    EXECUTE FUNCTION pgqueue.tenants_keep_referenced();

-- TRUNCATE pgqueue.tenants while jobs remain (the foreign key refused it, or with CASCADE
-- emptied pgqueue.jobs too): refused, unless pgqueue.jobs is truncated in the same statement.
CREATE OR REPLACE FUNCTION pgqueue.tenants_truncate_guard()
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
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgqueue.tenants_truncate_guard();

-- Create a tenant or change its settings (`pgqueue tenants set`, the dashboard's tenant form;
-- revision 0034).
CREATE OR REPLACE FUNCTION pgqueue.tenant_set(tenant_id text, plan text DEFAULT NULL,
                                              quantum double precision DEFAULT NULL,
                                              daily_token_budget bigint DEFAULT NULL)
RETURNS pgqueue.tenants
LANGUAGE sql
AS $$
-- Create a tenant or change its plan, DRR quantum (cost units) or daily input-token budget;
-- NULL keeps a value (a new tenant: plan 'free', the default quantum and budget). Returns
-- the tenant's row. `pgqueue tenants set`, and the dashboard's tenant form. The table's
-- checks refuse a bad plan name, quantum or budget (23514).
    INSERT INTO pgqueue.tenants AS t (tenant_id, plan, quantum, daily_token_budget)
    VALUES (tenant_set.tenant_id, coalesce(tenant_set.plan, 'free'), tenant_set.quantum,
            tenant_set.daily_token_budget)
    ON CONFLICT (tenant_id) DO UPDATE
    SET plan = coalesce(tenant_set.plan, t.plan),
        quantum = coalesce(tenant_set.quantum, t.quantum),
        daily_token_budget = coalesce(tenant_set.daily_token_budget, t.daily_token_budget),
        updated_at = now()
    RETURNING t.*
$$;
