"""Cancelling jobs: ``pgqueue.cancel(job_id, tenant_id, reason)`` for one job, and
``pgqueue.cancel_queued(tenant_id, tier, reason)`` for a tenant's whole backlog.

A queued job is cancelled at once and never claimed. A running job is cancelled too: its lease
is withdrawn, so the worker's outcome write is fenced off, and the worker stops the handler at
its next heartbeat. A finished job is left as it is, and its state is returned.
``cancel_queued`` cancels every queued job of a tenant (of one tier, if given) and leaves
running ones alone. Producers reach both like ``enqueue`` (``pgqueue grant`` makes them
SECURITY DEFINER), for the tenant their session's ``pgqueue.tenant_id`` names, which a role
that may not write ``pgqueue.jobs`` itself must set (``pgqueue.session_writes_jobs``). Before this revision, the
only way to cancel was an ``UPDATE`` of ``pgqueue.jobs`` by hand.

Revision ID: 0024
Revises: 0023
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

_SQL = Path(__file__).with_suffix(".sql")


def upgrade() -> None:
    op.execute(_SQL.read_text(encoding="utf-8"))


def downgrade() -> None:
    op.execute("DROP FUNCTION pgqueue.cancel_queued(text, pgqueue.tier, text)")
    op.execute("DROP FUNCTION pgqueue.cancel(bigint, text, text)")
    op.execute("DROP FUNCTION pgqueue.session_writes_jobs()")
