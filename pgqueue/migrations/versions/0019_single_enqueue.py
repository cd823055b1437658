"""One job in fewer statements: ``try_enqueue`` does the insert trigger's work for its row.

For a job without a dedupe key, of a registered tenant, with no admission cap on its tier or
tenant, in READ COMMITTED, ``pgqueue.try_enqueue`` (and so ``pgqueue.enqueue`` and the Python
``enqueue``) now inserts the job, its DRR inbox entry and its two counter updates and sends the
NOTIFY in one statement, and locks the tenant with the demotion and admission lookup, instead
of leaving that to ``jobs_after_insert`` (five statements over a transition table, built for
batches). The trigger gets a ``WHEN`` that skips it while the transaction-local setting
``pgqueue.insert_bookkept`` names the current transaction and trigger depth, which only that
statement sets (a value set in the session never matches; an insert a user's row trigger makes
during that statement runs one level deeper and keeps the trigger). Server CPU per
single enqueue on the benchmark's job: ~355 µs before, ~328 µs after (``docs/bench.md``).

Every other case, and every other insert into ``pgqueue.jobs``, is unchanged.
``try_enqueue`` is revision 0008's, edited here, not copied.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

from pgqueue.db.sqltext import function_definition, replace_anchor

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_SQL = Path(__file__).with_suffix(".sql")
_FAST_ENQUEUE_SQL = Path(__file__).with_name("0008_fast_enqueue.sql")
_TRIGGER = """
DROP TRIGGER jobs_after_insert ON pgqueue.jobs;
CREATE TRIGGER jobs_after_insert
    AFTER INSERT ON pgqueue.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.jobs_after_insert();
"""

# --- try_enqueue: its variables
_DEMOTED = "    demoted boolean;\n"
_CAPS = "    pol text;\n    tier_cap bigint;\n    tenant_cap bigint;\n"
_NEW_ID = "    new_id bigint;\nBEGIN\n"
_NEW_ID_COUNTED = (
    "    new_id bigint;\n    ruled boolean;\n    bookkept text;\n    row_tenant text;\n"
    "    row_tier pgqueue.tier;\n    row_queued boolean;\n    tier_counted boolean;\n"
    "    tenant_counted boolean;\nBEGIN\n"
)
# --- the lookup and admission of revision 0008, up to the tenant's registration
_LOOKUP_START = (
    "    -- pgqueue.is_demoted's rule, and whether the tenant is registered, in one statement.\n"
)
_REGISTER = "    IF NOT known THEN\n"
#: The tier, its admission row and the tenant (locked) in one statement; admission only when
#: a cap applies; then the one-statement insert with its bookkeeping.
_LOOKUP_AND_ONE_STATEMENT = """    -- One statement: the tier (pgqueue.is_demoted's rule), its admission row, and the tenant:
    -- registered or not, and if so locked FOR KEY SHARE until the transaction ends, as the
    -- insert trigger's check would lock it; and whether pgqueue.jobs has rules, which a
    -- statement with data-modifying CTEs cannot run (found by a tester: a DO ALSO rule of the
    -- user's made every single enqueue fail).
    SELECT k.tier, a.policy, a.max_queued, coalesce(r.max_queued, a.tenant_max_queued),
           coalesce(r.known, false),
           (SELECT c.relhasrules FROM pg_catalog.pg_class c
            WHERE c.oid = 'pgqueue.jobs'::regclass)
    INTO t, pol, tier_cap, tenant_cap, known, ruled
    FROM (SELECT pgqueue.classify(o, try_enqueue.sla_seconds,
                                  EXISTS (SELECT 1 FROM pgqueue.demotions d
                                          WHERE d.tenant_id = try_enqueue.tenant_id
                                            AND d.expires_at > now())) AS tier) k
    LEFT JOIN pgqueue.admission a ON a.tier = k.tier
    LEFT JOIN LATERAL (SELECT true AS known, x.max_queued FROM pgqueue.tenants x
                       WHERE x.tenant_id = try_enqueue.tenant_id FOR KEY SHARE) r ON true;
    IF tier_cap IS NOT NULL OR tenant_cap IS NOT NULL THEN
        v := pgqueue.admission_check(t, try_enqueue.tenant_id, 1);
        IF NOT v.admitted THEN
            IF v.policy = 'drop' THEN
                INSERT INTO pgqueue.queue_counts (tier, tenant_id, dropped)
                VALUES (t, try_enqueue.tenant_id, 1);
                outcome := 'dropped';
            ELSE
                outcome := 'full';
            END IF;
            tier := t; policy := v.policy; scope := v.scope; depth := v.depth; cap := v.cap;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    IF try_enqueue.dedupe_key IS NULL AND known AND NOT ruled
       AND current_setting('transaction_isolation') = 'read committed' THEN
        -- The trigger's work for this one row, driven by the row as inserted (a BEFORE
        -- trigger of the user's may change its tenant, tier or state, or drop it): its inbox
        -- row and counters (as pgqueue.queue_counts_add updates them in READ COMMITTED: a row
        -- of the key no other transaction holds) and NOTIFY; another tenant is checked and
        -- locked after it. The setting is put back as it was after, for an enqueue nested in
        -- such a trigger.
        bookkept := current_setting('pgqueue.insert_bookkept', true);
        PERFORM set_config('pgqueue.insert_bookkept',
                           pg_current_xact_id()::text || '/' || pg_trigger_depth(), true);
        WITH ins AS (
            INSERT INTO pgqueue.jobs AS j (tenant_id, kind, origin, sla_seconds, priority,
                                           payload, model, est_input_tokens, max_output_tokens,
                                           cost, max_attempts, run_at)
            SELECT try_enqueue.tenant_id, try_enqueue.kind, o, try_enqueue.sla_seconds, t,
                   try_enqueue.payload, try_enqueue.payload ->> 'model', e.est,
                   pgqueue.payload_max_tokens(try_enqueue.payload), pgqueue.job_cost(e.est),
                   coalesce(try_enqueue.max_attempts, 5), coalesce(try_enqueue.run_at, now())
            FROM pgqueue.input_token_estimate(try_enqueue.payload) e
            RETURNING j.id, j.tenant_id, j.priority, j.state = 'queued' AS queued
        ), inbox AS (
            INSERT INTO pgqueue.drr_inbox (tier, tenant_id)
            SELECT i.priority, i.tenant_id FROM ins i WHERE i.queued
        ), counted AS (
            UPDATE pgqueue.queue_counts c SET queued = c.queued + 1
            WHERE c.ctid = ANY (ARRAY[
                (SELECT x.ctid FROM pgqueue.queue_counts x, ins i
                 WHERE i.queued AND x.tier = i.priority AND x.tenant_id IS NULL
                   AND NOT x.claim_stripe
                 LIMIT 1 FOR UPDATE OF x SKIP LOCKED),
                (SELECT x.ctid FROM pgqueue.queue_counts x, ins i
                 WHERE i.queued AND x.tier = i.priority AND x.tenant_id = i.tenant_id
                   AND NOT x.claim_stripe
                 LIMIT 1 FOR UPDATE OF x SKIP LOCKED)])
            RETURNING c.tenant_id IS NULL AS tier_total
        )
        SELECT i.id, i.tenant_id, i.priority, i.queued,
               coalesce((SELECT bool_or(k.tier_total) FROM counted k), false),
               coalesce((SELECT bool_or(NOT k.tier_total) FROM counted k), false),
               pg_notify('pgqueue_jobs', CASE WHEN i.queued THEN i.priority::text ELSE '' END)
        INTO new_id, row_tenant, row_tier, row_queued, tier_counted, tenant_counted
        FROM ins i;
        PERFORM set_config('pgqueue.insert_bookkept', coalesce(bookkept, ''), true);
        -- Another tenant than the one looked up: checked and locked as the trigger would, by
        -- a statement of its own, whose snapshot sees a tenant registered meanwhile (by that
        -- BEFORE trigger, or by another transaction; found by a tester).
        IF new_id IS NOT NULL AND row_tenant <> try_enqueue.tenant_id THEN
            PERFORM 1 FROM pgqueue.tenants r WHERE r.tenant_id = row_tenant FOR KEY SHARE;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'unknown tenant %: register it first (pgqueue.ensure_tenant)',
                    quote_literal(row_tenant) USING ERRCODE = 'foreign_key_violation';
            END IF;
        END IF;
        -- No row of a key updated (all held, or the one locked changed after the snapshot):
        -- a new row, as queue_counts_add does.
        IF row_queued AND NOT tier_counted THEN
            INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
            VALUES (row_tier, NULL, 1);
        END IF;
        IF row_queued AND NOT tenant_counted THEN
            INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
            VALUES (row_tier, row_tenant, 1);
        END IF;
        id := new_id; outcome := 'enqueued'; tier := t; policy := pol;
        RETURN NEXT;
        RETURN;
    END IF;
"""
# --- the policy the rows report: the one read by the lookup
_ENQUEUED = "outcome := 'enqueued'; tier := t; policy := v.policy;"
_ENQUEUED_POL = "outcome := 'enqueued'; tier := t; policy := pol;"


def _replace_once(body: str, anchor: str, replacement: str) -> str:
    return replace_anchor(body, anchor, replacement, what="revision 0019: 0008's try_enqueue")


def try_enqueue() -> str:
    """Revision 0008's ``try_enqueue``, edited: the one-statement path for a single job."""
    text = function_definition(_FAST_ENQUEUE_SQL, "try_enqueue")
    text = _replace_once(text, _DEMOTED, _CAPS)
    text = _replace_once(text, _NEW_ID, _NEW_ID_COUNTED)
    start, end = text.index(_LOOKUP_START), text.index(_REGISTER)
    text = text[:start] + _LOOKUP_AND_ONE_STATEMENT + text[end:]
    if text.count(_ENQUEUED) != 2:
        raise RuntimeError("revision 0019: 0008's try_enqueue lacks its two enqueued rows")
    return text.replace(_ENQUEUED, _ENQUEUED_POL)


def upgrade() -> None:
    op.execute(_SQL.read_text(encoding="utf-8"))
    op.execute(try_enqueue())


def downgrade() -> None:
    op.execute(_TRIGGER)
    op.execute(function_definition(_FAST_ENQUEUE_SQL, "try_enqueue"))
