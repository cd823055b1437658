"""A batch enqueue runs its admission pass only where a cap can apply, and looks up each of
its tenants once.

``pgqueue.try_enqueue_batch`` grouped its jobs by (tier, tenant) and called
``pgqueue.admission_check`` for every group, twice for a tier's first group, even when no cap
was set anywhere: each call read the tier's admission row and the tenant's row only to find
both caps NULL and admit. For the benchmark's batch of 1,000 jobs over 10 tenants and three
tiers that was the grouping query and 30–60 PL/pgSQL calls, ~0.8 µs of the server's ~10.7
per job (``bench/enqueue_floor.py``, docs/bench.md).

Now the pass runs only when a cap could refuse something: a tier with ``max_queued`` or
``tenant_max_queued`` in ``pgqueue.admission``, or a tenant of the batch with its own
``max_queued``. With neither, every ``admission_check`` of the pass would have admitted (it
returns before reading any counter when both caps are NULL), so what a batch stores, returns
and raises is unchanged. The caps are read in the statement's snapshot, as the checks read
them.

Its check for tenants not yet registered probed ``tenants_pkey`` once per job and only then
took the distinct tenants (1,000 probes for a batch of 10 tenants; with 200,000 tenants
registered, 1.3 ms of a batch); it now takes the distinct tenants first and probes each once
(0.55 ms). The same tenants are registered, in the same order.

``pgqueue.admission`` keeps its row per tier. A tier without one was admitted by the single
enqueue (a missing row reads as no cap) but lost by the batch paths, which join the row to
their jobs: a batch of three returned two ids, misplaced, while it stored three (found by a
fresh tester; older than this revision). A missing row is put back (no caps, policy reject),
and ``DELETE`` and ``TRUNCATE`` of the table are refused (PQ009): set a tier's caps to NULL
to lift them (``pgqueue admission set``).

``try_enqueue_batch`` is revision 0015's, edited here, not copied.

Revision ID: 0029
Revises: 0028
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from alembic import op

from pgqueue.db.sqltext import function_definition, replace_anchor, revision_module

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

_WHAT = "revision 0029: try_enqueue_batch"
_PASS_START = """\
    -- Admission: room for all of each key's jobs, and for all of each tier's jobs.
    FOR r IN
"""
_PASS_END = """\
        IF NOT v.admitted THEN
            fits := false;
            EXIT;
        END IF;
    END LOOP;
"""
_UNKNOWN = """\
    PERFORM pgqueue.ensure_tenant(d.tenant_id)
    FROM (SELECT DISTINCT u.tenant_id FROM unnest(tenant_ids) AS u(tenant_id)
          WHERE NOT EXISTS (SELECT 1 FROM pgqueue.tenants known
                            WHERE known.tenant_id = u.tenant_id)) d
    ORDER BY d.tenant_id COLLATE "C";
"""
_UNKNOWN_ONCE = """\
    -- (each distinct tenant probed once: revision 0029)
    PERFORM pgqueue.ensure_tenant(d.tenant_id)
    FROM (SELECT DISTINCT u.tenant_id FROM unnest(tenant_ids) AS u(tenant_id)) d
    WHERE NOT EXISTS (SELECT 1 FROM pgqueue.tenants known WHERE known.tenant_id = d.tenant_id)
    ORDER BY d.tenant_id COLLATE "C";
"""
_GUARD = """\
    -- Admission: room for all of each key's jobs, and for all of each tier's jobs; only where
    -- a cap can refuse (revision 0029): with no cap on any tier and none on the batch's
    -- tenants, every check below would admit.
    IF EXISTS (SELECT 1 FROM pgqueue.admission a
               WHERE a.max_queued IS NOT NULL OR a.tenant_max_queued IS NOT NULL)
       OR EXISTS (SELECT 1 FROM pgqueue.tenants t
                  WHERE t.tenant_id = ANY (tenant_ids) AND t.max_queued IS NOT NULL) THEN
"""


_ROWS_BACK = """
INSERT INTO pgqueue.admission (tier)
SELECT t.tier FROM unnest(enum_range(NULL::pgqueue.tier)) AS t(tier)
ON CONFLICT (tier) DO NOTHING
"""
_KEEP_ROWS = [
    """
CREATE FUNCTION pgqueue.admission_keep_rows()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'pgqueue.admission keeps one row per tier: set its caps to NULL instead '
                    '(pgqueue admission set)' USING ERRCODE = 'PQ009';
END
$$
""",
    """
CREATE TRIGGER admission_keep_rows BEFORE DELETE ON pgqueue.admission
    FOR EACH ROW EXECUTE FUNCTION pgqueue.admission_keep_rows()
""",
    """
CREATE TRIGGER admission_keep_rows_truncate BEFORE TRUNCATE ON pgqueue.admission
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.admission_keep_rows()
""",
]
_DROP_KEEP_ROWS = [
    "DROP TRIGGER IF EXISTS admission_keep_rows_truncate ON pgqueue.admission",
    "DROP TRIGGER IF EXISTS admission_keep_rows ON pgqueue.admission",
    "DROP FUNCTION IF EXISTS pgqueue.admission_keep_rows()",
]


def _revision_0015() -> ModuleType:
    return revision_module(Path(__file__).with_name("0015_enqueue_boundary.py"))


def batch_before() -> str:
    """``try_enqueue_batch`` as revision 0015 creates it."""
    module = _revision_0015()
    body: str = module._named_errors(function_definition(module._BATCH_SQL, "try_enqueue_batch"))
    return body


def batch() -> str:
    """``try_enqueue_batch`` as this revision creates it: revision 0015's, its admission pass
    indented under the guard, its tenants probed once each.

    Raises:
        RuntimeError: revision 0015's text lacks the pass this edit was written for.
    """
    body = replace_anchor(batch_before(), _UNKNOWN, _UNKNOWN_ONCE, what=_WHAT)
    if body.count(_PASS_START) != 1 or body.count(_PASS_END) != 1:
        raise RuntimeError(f"{_WHAT}: not the admission pass this edit was written for")
    start = body.index(_PASS_START)
    end = body.index(_PASS_END) + len(_PASS_END)
    if end <= start:
        raise RuntimeError(f"{_WHAT}: the admission pass ends before it starts")
    pass_lines = body[start:end].splitlines(keepends=True)[1:]  # without its comment line
    indented = "".join("    " + line if line.strip() else line for line in pass_lines)
    return body[:start] + _GUARD + indented + "    END IF;\n" + body[end:]


def upgrade() -> None:
    op.execute(batch())
    op.execute(_ROWS_BACK)
    for statement in _KEEP_ROWS:
        op.execute(statement)


def downgrade() -> None:
    for statement in _DROP_KEEP_ROWS:
        op.execute(statement)
    op.execute(batch_before())
