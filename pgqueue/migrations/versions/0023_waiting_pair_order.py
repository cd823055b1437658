"""The claim probes a tier's waiting pairs in a defined order, not the rows' physical order.

With a tier's round empty, the eligibility check looks at the waiting pairs that are due
(``pos IS NULL AND due_at <= now()``) one at a time, with ``LIMIT 1`` and no ``ORDER BY``: the
first row the index scan met. After an inbox fold every new pair has ``due_at = '-infinity'``,
so the pick followed the order in which the fold wrote them. It matters: a pair whose jobs are
all in the future leaves when it is probed (and waits for its ``run_at``), but joins the round
with the others when a due pair is probed first, so two databases with the same contents could
dispatch a job in a different place (found by a fresh tester). The probe now takes them in
``(due_at, refill_offset, tenant_id COLLATE "C")`` order, the order in which due waiting pairs
join the round, through an index with those columns (``deficits_waiting_idx``, rebuilt), so it
stays one index probe however many pairs a fold brought.

``drr_dispatch`` is revision 0022's, edited here, not copied.

Revision ID: 0023
Revises: 0022
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from alembic import op

from pgqueue.db.sqltext import replace_anchor, revision_module

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

_PROBE = (
    "                        WHERE d.tier = tr AND d.pos IS NULL AND d.due_at <= now()\n"
    "                        LIMIT 1;\n"
)
_PROBE_ORDERED = (
    "                        WHERE d.tier = tr AND d.pos IS NULL AND d.due_at <= now()\n"
    "                        -- the order due waiting pairs join the round in (revision 0023)\n"
    '                        ORDER BY d.due_at, d.refill_offset, d.tenant_id COLLATE "C"\n'
    "                        LIMIT 1;\n"
)
_INDEX = "CREATE INDEX deficits_waiting_idx ON pgqueue.deficits ({}) WHERE pos IS NULL"


def _revision_0022() -> ModuleType:
    return revision_module(Path(__file__).with_name("0022_round_skip.py"))


def _revision_0017() -> ModuleType:
    return revision_module(Path(__file__).with_name("0017_claim_counts.py"))


def dispatch() -> str:
    """``drr_dispatch`` as this revision creates it."""
    body: str = _revision_0022().dispatch()
    return replace_anchor(body, _PROBE, _PROBE_ORDERED, what="revision 0023: drr_dispatch")


def upgrade() -> None:
    op.execute("DROP INDEX pgqueue.deficits_waiting_idx")
    op.execute(_INDEX.format('tier, due_at, refill_offset, tenant_id COLLATE "C"'))
    op.execute(dispatch())
    for statement in _revision_0017().dispatch_settings():  # CREATE OR REPLACE dropped them
        op.execute(statement)


def downgrade() -> None:
    op.execute(_revision_0022().dispatch())
    for statement in _revision_0017().dispatch_settings():
        op.execute(statement)
    op.execute("DROP INDEX pgqueue.deficits_waiting_idx")
    op.execute(_INDEX.format("tier, due_at"))
