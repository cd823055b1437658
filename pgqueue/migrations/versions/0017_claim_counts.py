"""A claim writes its own queued counters, in its batch write, to a row only claims touch.

Every claim decremented the queued counters through the update trigger on ``pgqueue.jobs``:
one statement to find the deltas in the transition tables, then ``queue_counts_add`` with one
``UPDATE`` per key on a row locked ``FOR UPDATE SKIP LOCKED`` (a claim of 10 jobs touches about
six keys). Claims run one at a time under the scheduler's advisory lock, so while other workers
waited for that lock this cost was paid by all of them.

Now each key has at most one *claim row* (``claim_stripe``), which only claims write: no two
claims run at once, producers skip it when they choose a row (``queue_counts_add``), and
``queue_counts_compact`` leaves it alone, so a claim never waits on it. The claim's batch write
(the last statement of ``drr_dispatch``) upserts the deltas of the jobs it took into the claim
rows, and marks the statement (``pgqueue.claim_counted`` set to its transaction's id, locally,
and cleared right after) so that the update trigger does not count those rows again. The
depth of a key is still ``sum(queued)`` over its rows, exact in every snapshot. Measured on
the benchmark machine (``docs/bench.md``): server CPU of a claim of 10 plus its completion
−8 %, of the claim −10 %.

``drr_dispatch`` is revision 0014's, ``jobs_after_update`` 0012's, ``queue_counts_add`` 0016's
and ``queue_counts_compact`` 0006's, each edited here, not copied.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from alembic import op

from pgqueue.db.sqltext import function_definition, replace_anchor, revision_module

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_HERE = Path(__file__).parent
_ADMISSION_SQL = _HERE / "0006_admission.sql"
_ONE_TRIGGER_SQL = _HERE / "0012_one_trigger_per_write.sql"

_COLUMN = "ALTER TABLE pgqueue.queue_counts ADD COLUMN claim_stripe boolean NOT NULL DEFAULT false"
_KEY = (
    "CREATE UNIQUE INDEX queue_counts_claim_key_idx ON pgqueue.queue_counts "
    "(tier, (coalesce(tenant_id, ''))) WHERE claim_stripe"
)
_COMMENT = (
    "COMMENT ON COLUMN pgqueue.queue_counts.claim_stripe IS "
    "'The key''s claim row (revision 0017): written only by claims, one at a time under the "
    "scheduler lock; producers and the compactor leave it alone'"
)

#: Workers hand the claim rows over to the compactor now and then (``pgqueue.worker.upkeep``):
#: otherwise a key whose jobs are all gone keeps two rows forever (+n and -n) instead of none.
_RELEASE = """CREATE FUNCTION pgqueue.queue_counts_release_claims()
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    released integer;
BEGIN
    -- Under the scheduler's lock, so that no claim is writing its rows: the rows become
    -- ordinary counter rows, which queue_counts_compact folds (revision 0017).
    PERFORM pg_advisory_xact_lock(7310575183440224370);  -- 'pgq_drr!', drr_dispatch's
    UPDATE pgqueue.queue_counts c SET claim_stripe = false WHERE c.claim_stripe;
    GET DIAGNOSTICS released = ROW_COUNT;
    RETURN released;
END
$$"""

# --- drr_dispatch: the batch write counts the jobs it takes
_RETURN = "    RETURN QUERY\n    WITH flushed AS (\n"
_RETURN_MARKED = """    -- The batch write below counts its own rows (revision 0017): the update trigger skips
    -- them while this names this transaction (a value set any other way never matches).
    PERFORM set_config('pgqueue.claim_counted', pg_current_xact_id()::text, true);
    RETURN QUERY
    WITH flushed AS (
"""
_TOOK_END = """        RETURNING x.ord, x.tier, x.round, j
    )
    SELECT took.tier, took.round, took.j FROM took ORDER BY took.ord;
"""
_TOOK_COUNTED = """        RETURNING x.ord, x.tier, x.round, j
    ), counted AS (
        -- The queued counters of the jobs taken, per (tier, tenant) and per tier, into the
        -- keys' claim rows (revision 0017): only claims write them, one at a time under the
        -- scheduler lock, so this never waits.
        INSERT INTO pgqueue.queue_counts AS c (tier, tenant_id, queued, claim_stripe)
        SELECT k.tier, k.tenant_id, -count(*), true
        FROM (SELECT t.tier, (t.j).tenant_id AS tenant_id FROM took t) k
        GROUP BY GROUPING SETS ((k.tier, k.tenant_id), (k.tier))
        ON CONFLICT (tier, (coalesce(tenant_id, ''))) WHERE claim_stripe
        DO UPDATE SET queued = c.queued + EXCLUDED.queued
    )
    SELECT took.tier, took.round, took.j FROM took ORDER BY took.ord;
    PERFORM set_config('pgqueue.claim_counted', '', true);
"""

# --- jobs_after_update: rows a claim has counted are not counted again
_TRIGGER_BEGIN = "BEGIN\n    SELECT array_agg(g.tier), array_agg(g.tenant_id), array_agg(g.n)\n"
_TRIGGER_SKIP = """BEGIN
    -- A claim's batch write (drr_dispatch) counted its rows itself, and none succeeded: nothing
    -- to do (revision 0017). The mark names the claim's transaction, so a value left in the
    -- session (SET, ALTER ROLE) or by another transaction never switches counting off.
    IF current_setting('pgqueue.claim_counted', true) = pg_current_xact_id()::text THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(g.tier), array_agg(g.tenant_id), array_agg(g.n)
"""

# --- queue_counts_add: producers never take a claim row
_TOTAL_ROW = "WHERE x.tier = p_tiers[i] AND x.tenant_id IS NULL\n"
_TENANT_ROW = "WHERE x.tier = p_tiers[i] AND x.tenant_id = p_tenants[i]\n"
_NOT_CLAIM = "AND NOT x.claim_stripe\n"

# --- queue_counts_compact: the claim rows stay as they are
_PICK = "        WHERE p_tier IS NULL\n           OR (c.tier = p_tier"
_PICK_NO_CLAIM = (
    "        WHERE NOT c.claim_stripe  -- claims' rows stay (revision 0017)\n"
    "          AND (p_tier IS NULL\n           OR (c.tier = p_tier"
)
_PICK_END = "(c.tenant_id IS NULL OR c.tenant_id = p_tenant))\n"
_PICK_END_CLOSED = "(c.tenant_id IS NULL OR c.tenant_id = p_tenant)))\n"


def _revision(name: str) -> ModuleType:
    return revision_module(_HERE / name)


def _replace_once(body: str, anchor: str, replacement: str, what: str) -> str:
    return replace_anchor(body, anchor, replacement, what=f"revision 0017: {what}")


def _dispatch_before() -> str:
    r0014 = _revision("0014_claim_start.py")
    text: str = r0014._one_statement_start(r0014._revision_0011().created())
    return text


def dispatch_settings() -> tuple[str, ...]:
    """``drr_dispatch``'s settings (revision 0011), applied after every CREATE OR REPLACE."""
    settings: tuple[str, ...] = _revision("0011_claim_by_tenant.py").SETTINGS
    return settings


def _counts_add_before() -> str:
    r0016 = _revision("0016_claim_path_trims.py")
    text: str = r0016._per_key(r0016._counts_add_before())
    return text


def dispatch() -> str:
    """``drr_dispatch`` as this revision creates it."""
    body = _dispatch_before()
    body = _replace_once(body, _RETURN, _RETURN_MARKED, "drr_dispatch")
    return _replace_once(body, _TOOK_END, _TOOK_COUNTED, "drr_dispatch")


def after_update() -> str:
    """``jobs_after_update`` as this revision creates it."""
    body = function_definition(_ONE_TRIGGER_SQL, "jobs_after_update")
    return _replace_once(body, _TRIGGER_BEGIN, _TRIGGER_SKIP, "jobs_after_update")


def counts_add() -> str:
    """``queue_counts_add`` as this revision creates it."""
    body = _counts_add_before()
    body = _replace_once(body, _TOTAL_ROW, _TOTAL_ROW + " " * 28 + _NOT_CLAIM, "counts_add")
    return _replace_once(body, _TENANT_ROW, _TENANT_ROW + " " * 28 + _NOT_CLAIM, "counts_add")


def compact() -> str:
    """``queue_counts_compact`` as this revision creates it."""
    body = function_definition(_ADMISSION_SQL, "queue_counts_compact")
    body = _replace_once(body, _PICK, _PICK_NO_CLAIM, "queue_counts_compact")
    return _replace_once(body, _PICK_END, _PICK_END_CLOSED, "queue_counts_compact")


def upgrade() -> None:
    op.execute(_COLUMN)
    op.execute(_KEY)
    op.execute(_COMMENT)
    op.execute(_RELEASE)
    op.execute(counts_add())
    op.execute(compact())
    op.execute(after_update())
    op.execute(dispatch())
    for statement in dispatch_settings():  # CREATE OR REPLACE dropped the function's settings
        op.execute(statement)


def downgrade() -> None:
    op.execute(_dispatch_before())
    for statement in dispatch_settings():
        op.execute(statement)
    op.execute(function_definition(_ONE_TRIGGER_SQL, "jobs_after_update"))
    op.execute(function_definition(_ADMISSION_SQL, "queue_counts_compact"))
    op.execute(_counts_add_before())
    op.execute("DROP FUNCTION pgqueue.queue_counts_release_claims()")
    # The claim rows become ordinary counter rows: every key's sum stays the same.
    op.execute("ALTER TABLE pgqueue.queue_counts DROP COLUMN claim_stripe")
