"""Enqueue's boundary: a job's ``run_at`` must be a finite time, and a bad job of a SQL batch
is named by its position.

- ``pgqueue.enqueue(..., run_at => 'infinity')`` stored a job that could never be due (and
  ``'-infinity'`` one that sorted before every other job of its tenant). Python cannot send
  either (``datetime`` has no infinity), so only SQL callers could. A ``CHECK`` constraint
  refuses both on every write path (SQL enqueue, admin updates), added ``NOT VALID`` and then
  validated, so that the validating scan does not block writers.
- ``pgqueue.enqueue_many`` / ``try_enqueue_batch`` raised the first bad job's error without
  saying which job it was; the message now starts ``job #<n> of the batch`` (``n`` counts from
  1, as SQL array subscripts do); its SQLSTATE is kept. The Python client
  validates a batch before sending it and names the job by its 0-based index itself.

``try_enqueue_batch`` is revision 0008's, edited here, not copied.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

from pgqueue.db.sqltext import function_definition

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_ADD_CHECK = (
    "ALTER TABLE pgqueue.jobs ADD CONSTRAINT jobs_run_at_finite CHECK (isfinite(run_at)) NOT VALID"
)
_VALIDATE = "ALTER TABLE pgqueue.jobs VALIDATE CONSTRAINT jobs_run_at_finite"
_DROP_CHECK = "ALTER TABLE pgqueue.jobs DROP CONSTRAINT IF EXISTS jobs_run_at_finite"
_BATCH_SQL = Path(__file__).with_name("0008_fast_enqueue.sql")

_DECLARE = "    fits boolean := true;\n"
_DECLARE_ERR = _DECLARE + "    err_state text;\n    err_message text;\n"
_SELECT_BAD = "            SELECT i.tenant_id, i.origin, i.payload, i.sla, i.kind\n"
_SELECT_BAD_ORD = "            SELECT i.tenant_id, i.origin, i.payload, i.sla, i.kind, i.ord\n"
_VALIDATE_ONE = """            PERFORM pgqueue.validate_job(r.tenant_id, r.origin, r.payload, r.sla,
                                         coalesce(r.kind, 'anthropic.messages'), NULL);
"""
_VALIDATE_ONE_NAMED = """            BEGIN  -- only on the error path: a valid batch never enters this block
                PERFORM pgqueue.validate_job(r.tenant_id, r.origin, r.payload, r.sla,
                                             coalesce(r.kind, 'anthropic.messages'), NULL);
            EXCEPTION WHEN OTHERS THEN
                -- (validate_job's errors carry no detail or hint)
                GET STACKED DIAGNOSTICS err_state = RETURNED_SQLSTATE, err_message = MESSAGE_TEXT;
                RAISE EXCEPTION 'job #% of the batch: %', r.ord, err_message
                    USING ERRCODE = err_state;
            END;
"""


def _named_errors(body: str) -> str:
    """``body`` (revision 0008's ``try_enqueue_batch``) naming the bad job in its error."""
    for anchor in (_DECLARE, _SELECT_BAD, _VALIDATE_ONE):
        if body.count(anchor) != 1:
            raise RuntimeError(f"revision 0015: try_enqueue_batch lacks {anchor.strip()[:40]!r}")
    body = body.replace(_DECLARE, _DECLARE_ERR)
    body = body.replace(_SELECT_BAD, _SELECT_BAD_ORD)
    return body.replace(_VALIDATE_ONE, _VALIDATE_ONE_NAMED)


def upgrade() -> None:
    op.execute(_ADD_CHECK)
    op.execute(_VALIDATE)
    op.execute(_named_errors(function_definition(_BATCH_SQL, "try_enqueue_batch")))


def downgrade() -> None:
    op.execute(function_definition(_BATCH_SQL, "try_enqueue_batch"))
    op.execute(_DROP_CHECK)
