"""Two trims of the claim that follows a wake-up (a new tenant, or one back from idle).

- ``pgqueue.refill_offset`` was declared IMMUTABLE around ``convert_to``, which is only
  STABLE, so Postgres could not inline it: every claim that folded a new (tier, tenant) pair
  into the round ran it as a SQL function of its own, parsed and planned in that claim. Declared
  STABLE (what its body is), it is inlined into the fold. Same values.
- When the fold finds a tier's round empty, the first eligibility check of that tier no longer
  runs the round-head statement, which could only find nothing; it goes straight to the due
  waiting pairs.

Measured on the benchmark machine (one idle ``pgqueue work``, a job committed every 20–60 ms,
medians of 120): claim start → dispatch 2.16–2.20 ms → 1.74–1.76 ms.

``drr_dispatch`` is revision 0017's, edited here, not copied.

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from alembic import op

from pgqueue.db.sqltext import replace_anchor, revision_module

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_REFILL = "ALTER FUNCTION pgqueue.refill_offset(text) {}"
_HEAD_LOAD = "                    IF ht[i] IS NULL THEN\n"
_HEAD_LOAD_IF_MEMBERS = (
    "                    -- (an empty round as folded has no head to load: revision 0018)\n"
    "                    IF ht[i] IS NULL AND filled[i] THEN\n"
)


def _revision_0017() -> ModuleType:
    return revision_module(Path(__file__).with_name("0017_claim_counts.py"))


def dispatch() -> str:
    """``drr_dispatch`` as this revision creates it."""
    body: str = _revision_0017().dispatch()
    return replace_anchor(
        body, _HEAD_LOAD, _HEAD_LOAD_IF_MEMBERS, what="revision 0018: drr_dispatch"
    )


def upgrade() -> None:
    op.execute(_REFILL.format("STABLE"))
    op.execute(dispatch())
    for statement in _revision_0017().dispatch_settings():  # CREATE OR REPLACE dropped them
        op.execute(statement)


def downgrade() -> None:
    r0017 = _revision_0017()
    op.execute(r0017.dispatch())
    for statement in r0017.dispatch_settings():
        op.execute(statement)
    op.execute(_REFILL.format("IMMUTABLE"))
