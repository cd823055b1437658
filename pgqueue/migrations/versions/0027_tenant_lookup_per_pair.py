"""A claim's first load looks each pair's tenant up by its key, whatever the number of tenants.

Revision 0020's first load reads the round's first pairs of each tier (revision 0025: as many
as the tier's part of the claim needs) and joins each to its row of ``pgqueue.tenants`` for
its quantum. ``drr_dispatch`` always runs generic plans (``plan_cache_mode`` is set on it,
revision 0011), where the number of pairs read is a parameter (``LIMIT depth[tier]``). Once
the statistics of ``pgqueue.deficits`` count the rounds' pairs (after an ``ANALYZE``, which
autovacuum runs), the planner took that parameter for many rows and chose a merge join: the
pairs sorted by tenant, against a walk of ``tenants_pkey`` from its first entry to the last
pair's tenant. At 1,000 tenants that walk read 470–880 tenant rows per tier in every claim of
10 (``auto_explain``, three tiers), and a claim + completion of 10 cost 10.40 M instructions
against 7.00 M at 10 tenants (callgrind, ``bench/claim_instructions.py --tenants``).

Now the tenant is looked up in a subquery of its own per pair (kept apart with ``OFFSET 0``, so
that the planner cannot turn it back into a join): one probe of ``tenants_pkey`` per pair read.
What the claim decides is unchanged: a pair whose tenant has no row still gets the base
quantum (``plan_quantum(NULL, NULL, base)``).

``drr_dispatch`` is revision 0026's, edited here, not copied.

Revision ID: 0027
Revises: 0026
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from alembic import op

from pgqueue.db.sqltext import replace_anchor, revision_module

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

_JOIN = """\
                                LEFT JOIN pgqueue.tenants tn ON tn.tenant_id = h.tenant_id
                                CROSS JOIN LATERAL (
"""
_PROBE = """\
                                -- one probe per pair, not a merge join over every tenant
                                -- (revision 0027)
                                LEFT JOIN LATERAL (
                                    SELECT tq.plan, tq.quantum FROM pgqueue.tenants tq
                                    WHERE tq.tenant_id = h.tenant_id
                                    OFFSET 0) tn ON true
                                CROSS JOIN LATERAL (
"""


def _revision_0026() -> ModuleType:
    return revision_module(Path(__file__).with_name("0026_first_load_after_fold.py"))


def _revision_0017() -> ModuleType:
    return revision_module(Path(__file__).with_name("0017_claim_counts.py"))


def dispatch() -> str:
    """``drr_dispatch`` as this revision creates it."""
    body: str = _revision_0026().dispatch()
    return replace_anchor(body, _JOIN, _PROBE, what="revision 0027: drr_dispatch")


def upgrade() -> None:
    op.execute(dispatch())
    for statement in _revision_0017().dispatch_settings():  # CREATE OR REPLACE dropped them
        op.execute(statement)


def downgrade() -> None:
    op.execute(_revision_0026().dispatch())
    for statement in _revision_0017().dispatch_settings():
        op.execute(statement)
