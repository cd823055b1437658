"""Enqueue's boundary: a job's ``run_at`` must be a time Postgres and Python can both hold, and
a bad job of a SQL batch is named by its position.

- ``pgqueue.enqueue(..., run_at => 'infinity')`` stored a job that could never be due,
  ``'-infinity'`` one that sorted before every other job of its tenant, and a time past the
  year 9999 one that psycopg cannot read back (Python's ``datetime`` ends there). Python
  callers cannot send any of these; SQL callers could. The ``CHECK`` constraint
  ``jobs_run_at_range`` (years 0001 to 9999, a day's margin for time zones) refuses them on
  every write path (SQL enqueue, admin updates). Rows already stored out of that range are
  repaired first: a past one (``-infinity``) becomes due now, a future one (``infinity``)
  is parked at the last day allowed. The constraint is added ``NOT VALID``, without the
  validating scan: alembic runs a revision in one transaction, so a ``VALIDATE`` would keep
  ``pgqueue.jobs`` locked against every read and write for a whole scan of the table. New
  writes are checked either way; ``ALTER TABLE pgqueue.jobs VALIDATE CONSTRAINT
  jobs_run_at_range`` run on its own later does not block writers.
- ``pgqueue.enqueue_many`` / ``try_enqueue_batch`` raised the first bad job's error without
  saying which job it was; the message now starts ``job #<n> of the batch (counting from 1)``
  (SQL array positions); its SQLSTATE is kept. The Python client validates a batch before
  sending it and names a bad job by its 0-based index (``job <index>:``) itself.

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

#: Years 0001 to 9999 with a day's margin for time zones (Python's datetime range).
_REPAIR = """
UPDATE pgqueue.jobs
SET run_at = CASE WHEN run_at < now() THEN now() ELSE '9999-12-29 00:00:00+00'::timestamptz END
WHERE NOT (run_at >= '0001-01-02 00:00:00+00' AND run_at < '9999-12-30 00:00:00+00')
"""
_ADD_CHECK = """
ALTER TABLE pgqueue.jobs ADD CONSTRAINT jobs_run_at_range
    CHECK (run_at >= '0001-01-02 00:00:00+00' AND run_at < '9999-12-30 00:00:00+00') NOT VALID
"""
_DROP_CHECK = "ALTER TABLE pgqueue.jobs DROP CONSTRAINT IF EXISTS jobs_run_at_range"
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
                RAISE EXCEPTION 'job #% of the batch (counting from 1): %', r.ord, err_message
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
    op.execute(_REPAIR)
    op.execute(_ADD_CHECK)
    op.execute(_named_errors(function_definition(_BATCH_SQL, "try_enqueue_batch")))


def downgrade() -> None:
    op.execute(function_definition(_BATCH_SQL, "try_enqueue_batch"))
    op.execute(_DROP_CHECK)
