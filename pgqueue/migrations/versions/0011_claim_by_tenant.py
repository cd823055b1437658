"""The claim's per-turn fetches are planned as probes of the tenant's queue, whatever the
queue looked like when the session planned them.

``pgqueue.drr_dispatch`` keeps generic plans, made at a session's first claim. When that first
claim ran while statistics described a small ``pgqueue.jobs`` (a new install, a benchmark: the
table analyzed when it held a few jobs), the per-turn fetch of a tenant's due jobs was planned
as a sequential scan of ``pgqueue.jobs`` (or a scan of the tier's whole queue by
``jobs_queued_priority_idx``) with the tenant as a filter, and kept for the session: every DRR
turn then read every queued job. One run read 48 million index entries to claim 10,000 jobs.

This revision

- plans ``drr_dispatch``'s statements with ``enable_seqscan = off`` (a function setting), and
  turns it back on for the batch write, which revision 0010 plans per call and whose triggers
  scan small tables;
- orders every fetch of a tenant's jobs by ``(tenant_id, priority, run_at, id)``, the key of
  ``jobs_queued_tenant_head_idx`` (the same order: tenant and tier are fixed), so that index
  also gives the order, not only the rows;
- drops ``jobs_queued_priority_idx`` (queued jobs by tier): the claim was its only user, and
  the one plan it offered was the bad one; every enqueue maintained it.

The function is revision 0010's, edited here, not copied.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_FUNCTION = "ALTER FUNCTION pgqueue.drr_dispatch(integer, text, double precision) "
_KEEP_GENERIC = _FUNCTION + "SET plan_cache_mode = force_generic_plan"
_NO_SEQSCAN = _FUNCTION + "SET enable_seqscan = off"
_BY_RUN_AT = "ORDER BY j.run_at, j.id"
_BY_INDEX_KEY = "ORDER BY j.tenant_id, j.priority, j.run_at, j.id"
_BATCH = "    RETURN QUERY EXECUTE $batch$"
_SEQSCAN_BACK_ON = (
    "    -- Planned per call, with sequential scans allowed again (revision 0011): the\n"
    "    -- triggers of this statement read small tables.\n"
    "    PERFORM set_config('enable_seqscan', 'on', true);\n"
)


def _revision_0010() -> ModuleType:
    path = Path(__file__).with_name("0010_claim_plan.py")
    spec = importlib.util.spec_from_file_location("pgqueue_revision_0010", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _previous() -> str:
    """``drr_dispatch`` as revision 0010 creates it."""
    r0010 = _revision_0010()
    text: str = r0010._with_dynamic_batch_write(r0010._original())
    return text


def _by_tenant(body: str) -> str:
    """``body`` with its fetches ordered by the tenant-head index key and sequential scans
    turned back on just before the batch write."""
    if body.count(_BY_RUN_AT) != 6 or body.count(_BATCH) != 1:
        raise RuntimeError("revision 0011: 0010's drr_dispatch is not the expected text")
    body = body.replace(_BY_RUN_AT, _BY_INDEX_KEY)
    return body.replace(_BATCH, _SEQSCAN_BACK_ON + _BATCH)


def upgrade() -> None:
    op.execute(_by_tenant(_previous()))
    op.execute(_KEEP_GENERIC)
    op.execute(_NO_SEQSCAN)
    op.execute("DROP INDEX pgqueue.jobs_queued_priority_idx")


def downgrade() -> None:
    op.execute(
        "CREATE INDEX jobs_queued_priority_idx ON pgqueue.jobs (priority, id)"
        " WHERE state = 'queued'"
    )
    op.execute(_previous())  # CREATE OR REPLACE drops the function's settings
    op.execute(_KEEP_GENERIC)
