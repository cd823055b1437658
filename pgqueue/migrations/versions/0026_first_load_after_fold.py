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
safety net (``repaired``) or with turns' moves still to write keeps the per-tier loads. On the
first pass the fold is a plain upsert: what its statement also read per tier (due waiting pairs,
round members) the first load reads again.

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


_COMMENT = """\
        -- says, per tier, whether the round has members and whether due pairs wait. After a
        -- fold (new work came in: an idle worker's claim, usually of a few jobs) the per-tier
        -- loads do it all, as before: cheaper there.
"""
_COMMENT_NOW = """\
        -- says, per tier, whether the round has members and whether due pairs wait. It runs on
        -- the claim's first pass, after a fold too (revision 0026).
"""

_FOLD = """\
        IF inbox_folded THEN
            -- One statement (revision 0014): fold the inbox in, then per tier whether due pairs wait
"""
_FOLD_FIRST_PASS = """\
        IF inbox_folded AND cardinality(rot_ts) = 0 AND NOT repaired THEN
            -- Fold the inbox in; the first load below finds out per tier whether due pairs
            -- wait and whether the round has members (revision 0026).
            WITH drained AS (
                DELETE FROM pgqueue.drr_inbox RETURNING tier, tenant_id
            )
            INSERT INTO pgqueue.deficits AS d (tenant_id, tier, refill_offset)
            SELECT DISTINCT x.tenant_id, x.tier, pgqueue.refill_offset(x.tenant_id)
            FROM drained x
            ON CONFLICT (tenant_id, tier) DO UPDATE SET due_at = '-infinity'
            WHERE d.pos IS NULL;
        ELSIF inbox_folded THEN
            -- One statement (revision 0014): fold the inbox in, then per tier whether due pairs wait
"""


def _revision_0025() -> ModuleType:
    return revision_module(Path(__file__).with_name("0025_deeper_round_prefetch.py"))


def _revision_0017() -> ModuleType:
    return revision_module(Path(__file__).with_name("0017_claim_counts.py"))


def dispatch() -> str:
    """``drr_dispatch`` as this revision creates it."""
    body: str = _revision_0025().dispatch()
    for anchor, replacement in (
        (_GUARD, _GUARD_FIRST_PASS),
        (_COMMENT, _COMMENT_NOW),
        (_FOLD, _FOLD_FIRST_PASS),
    ):
        body = replace_anchor(body, anchor, replacement, what="revision 0026: drr_dispatch")
    return body


def upgrade() -> None:
    op.execute(dispatch())
    for statement in _revision_0017().dispatch_settings():  # CREATE OR REPLACE dropped them
        op.execute(statement)


def downgrade() -> None:
    op.execute(_revision_0025().dispatch())
    for statement in _revision_0017().dispatch_settings():
        op.execute(statement)
