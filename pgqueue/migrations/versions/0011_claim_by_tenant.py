"""The claim's per-turn fetches are planned as probes of the tenant's queue, whatever the
queue looked like when the session planned them.

``pgqueue.drr_dispatch`` keeps generic plans, made at a session's first claim. When that first
claim ran while statistics described a small ``pgqueue.jobs`` (a new install, a benchmark: the
table analyzed when it held a few jobs), the per-turn fetch of a tenant's due jobs was planned
as a sequential scan of ``pgqueue.jobs`` (or a scan of the tier's whole queue by
``jobs_queued_priority_idx``) with the tenant as a filter, and kept for the session: every DRR
turn then read every queued job. One run read 48 million index entries to claim 10,000 jobs.

This revision re-creates ``drr_dispatch`` from revision 0002's text, edited here (not copied):

- its statements are planned with ``enable_seqscan = off`` (a function setting), so a plan
  made on a small queue is still a probe of a tenant's queue by index;
- every fetch of a tenant's jobs is ordered by ``(tenant_id, priority, run_at, id)``, the key
  of ``jobs_queued_tenant_head_idx`` (the same order: tenant and tier are fixed), so that index
  also gives the order, not only the rows;
- the batch write is a cached plan again instead of revision 0010's ``EXECUTE``: with
  sequential scans off it is a primary-key probe whatever the queue looked like, and planning
  it at every claim cost ~2.5 ms of the ~3.5 ms an empty claim took on the benchmark machine;
- ``jit = off``: ``enable_seqscan = off`` adds its penalty to the cost of the statements that
  have no index to use (the update of the three ``tier_state`` rows), and past
  ``jit_above_cost`` Postgres compiled the batch write at every call (~250 ms per claim).

And it drops ``jobs_queued_priority_idx`` (queued jobs by tier): the claim was its only user,
the one plan it offered was the bad one, and every enqueue maintained it.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from alembic import op

from pgqueue.db.sqltext import function_definition, revision_module

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_FUNCTION = "ALTER FUNCTION pgqueue.drr_dispatch(integer, text, double precision) "
_KEEP_GENERIC = _FUNCTION + "SET plan_cache_mode = force_generic_plan"
_NO_SEQSCAN = _FUNCTION + "SET enable_seqscan = off"
_NO_JIT = _FUNCTION + "SET jit = off"
_DRR_SQL = Path(__file__).with_name("0002_drr.sql")
_BY_RUN_AT = "ORDER BY j.run_at, j.id"
_BY_INDEX_KEY = "ORDER BY j.tenant_id, j.priority, j.run_at, j.id"


def _revision_0010() -> ModuleType:
    return revision_module(Path(__file__).with_name("0010_claim_plan.py"))


def _previous() -> str:
    """``drr_dispatch`` as revision 0010 creates it."""
    r0010 = _revision_0010()
    text: str = r0010._with_dynamic_batch_write(r0010._original())
    return text


def _by_tenant(body: str) -> str:
    """``body`` (revision 0002's function) with its fetches ordered by the tenant-head index key."""
    if body.count(_BY_RUN_AT) != 6:
        raise RuntimeError("revision 0011: 0002's drr_dispatch is not the expected text")
    return body.replace(_BY_RUN_AT, _BY_INDEX_KEY)


#: The function's settings, applied after every CREATE OR REPLACE (which drops them).
SETTINGS = (_KEEP_GENERIC, _NO_SEQSCAN, _NO_JIT)


def created() -> str:
    """``drr_dispatch`` as this revision creates it (revision 0014 edits it further)."""
    return _by_tenant(function_definition(_DRR_SQL, "drr_dispatch"))


def upgrade() -> None:
    op.execute(created())
    for statement in SETTINGS:
        op.execute(statement)
    op.execute("DROP INDEX pgqueue.jobs_queued_priority_idx")


def downgrade() -> None:
    op.execute(
        "CREATE INDEX jobs_queued_priority_idx ON pgqueue.jobs (priority, id)"
        " WHERE state = 'queued'"
    )
    op.execute(_previous())  # CREATE OR REPLACE drops the function's settings
    op.execute(_KEEP_GENERIC)
