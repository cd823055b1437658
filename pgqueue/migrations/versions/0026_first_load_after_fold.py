"""A claim that folds new work in still loads its rounds with the first load.

Every enqueue writes a ``drr_inbox`` row, and a claim that finds the inbox non-empty folds it
into ``pgqueue.deficits`` first. Since revision 0020 such a claim skipped the first load (the
round heads of every tier, and the pairs after them, in one statement) and loaded each tier's
round head with a statement of its own, then one more per turn that ended: the first load was
meant for a worker draining a backlog, the fold for an idle worker claiming the few jobs just
enqueued. Under a steady stream of enqueues, though, nearly every claim folds, so the busy
workers of a busy queue never used the first load (found measuring this session's revision
0025, docs/bench.md).

Now the claim's first pass loads the rounds with the first load whether or not it folded the
inbox. The first load reads, per tier, whether due waiting pairs are there (the pairs the fold
made due among them), so nothing it decides changes; only a pass after the work-conserving
safety net (``repaired``) or with turns' moves still to write keeps the per-tier loads.

``drr_dispatch`` is revision 0025's, edited here, not copied.

Revision ID: 0026
Revises: 0025
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from alembic import op

from pgqueue.db.sqltext import replace_anchor, revision_module

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

_GUARD = "        IF NOT inbox_folded THEN\n"
_GUARD_FIRST_PASS = (
    "        -- (and after a fold, on the claim's first pass: revision 0026)\n"
    "        IF NOT inbox_folded OR (cardinality(rot_ts) = 0 AND NOT repaired) THEN\n"
)


def _revision_0025() -> ModuleType:
    return revision_module(Path(__file__).with_name("0025_deeper_round_prefetch.py"))


def _revision_0017() -> ModuleType:
    return revision_module(Path(__file__).with_name("0017_claim_counts.py"))


def dispatch() -> str:
    """``drr_dispatch`` as this revision creates it."""
    body: str = _revision_0025().dispatch()
    return replace_anchor(body, _GUARD, _GUARD_FIRST_PASS, what="revision 0026: drr_dispatch")


def upgrade() -> None:
    op.execute(dispatch())
    for statement in _revision_0017().dispatch_settings():  # CREATE OR REPLACE dropped them
        op.execute(statement)


def downgrade() -> None:
    op.execute(_revision_0025().dispatch())
    for statement in _revision_0017().dispatch_settings():
        op.execute(statement)
