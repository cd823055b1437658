"""A claim starts with fewer statements: the inbox is folded and each tier's state read in one.

Every claim drained the DRR inbox (one statement), asked which tiers have due waiting pairs
(another), then loaded each tier's round head and, for a tier whose round was empty, looked
for a due waiting pair: up to eight statements before the first dispatch, each ~0.1 ms on the
benchmark machine. Now one statement drains the inbox and returns, per tier, whether due pairs
wait (those it has just folded in included: the statement cannot see its own writes, so they
come from its ``RETURNING``) and whether the round has members. A tier with neither is not
eligible without any further statement. This shortens the idle wake-up (a claim for one new
job skips the probes of the two idle tiers) and saves a statement in every claim.

``drr_dispatch`` is revision 0011's (itself revision 0002's, edited), edited here, not copied.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from alembic import op

from pgqueue.db.sqltext import revision_module

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_DECLARE = "    absorb boolean[] := '{f,f,f}';\n"
_DECLARE_FILLED = (
    _DECLARE + "    filled boolean[] := '{t,t,t}';       -- the round has members (as loaded)\n"
)
_START = """        WITH drained AS (
            DELETE FROM pgqueue.drr_inbox RETURNING tier, tenant_id
        )
        INSERT INTO pgqueue.deficits AS d (tenant_id, tier, refill_offset)
        SELECT DISTINCT x.tenant_id, x.tier, pgqueue.refill_offset(x.tenant_id) FROM drained x
        ON CONFLICT (tenant_id, tier) DO UPDATE SET due_at = '-infinity'
        WHERE d.pos IS NULL;

        -- Tiers with waiting pairs that are due: they join the round at the tier's next dispatch.
        SELECT ARRAY[EXISTS (SELECT 1 FROM pgqueue.deficits d WHERE d.tier = 'critical'
                               AND d.pos IS NULL AND d.due_at <= now()),
                     EXISTS (SELECT 1 FROM pgqueue.deficits d WHERE d.tier = 'standard'
                               AND d.pos IS NULL AND d.due_at <= now()),
                     EXISTS (SELECT 1 FROM pgqueue.deficits d WHERE d.tier = 'batch'
                               AND d.pos IS NULL AND d.due_at <= now())]
        INTO absorb;
"""
_START_IN_ONE = """        -- One statement (revision 0014): fold the inbox in, then per tier whether due pairs wait
        -- (they join the round at the tier's next dispatch) and whether the round has members.
        -- The EXISTS read the snapshot from before the upsert: the pairs it folded in (new, or
        -- waiting and now due) come from its RETURNING.
        WITH drained AS (
            DELETE FROM pgqueue.drr_inbox RETURNING tier, tenant_id
        ), folded AS (
            INSERT INTO pgqueue.deficits AS d (tenant_id, tier, refill_offset)
            SELECT DISTINCT x.tenant_id, x.tier, pgqueue.refill_offset(x.tenant_id) FROM drained x
            ON CONFLICT (tenant_id, tier) DO UPDATE SET due_at = '-infinity'
            WHERE d.pos IS NULL
            RETURNING d.tier
        )
        SELECT array_agg(EXISTS (SELECT 1 FROM pgqueue.deficits d
                                 WHERE d.tier = t.tier AND d.pos IS NULL AND d.due_at <= now())
                         OR EXISTS (SELECT 1 FROM folded f WHERE f.tier = t.tier)
                         ORDER BY t.ord),
               array_agg(EXISTS (SELECT 1 FROM pgqueue.deficits d
                                 WHERE d.tier = t.tier AND d.pos IS NOT NULL)
                         ORDER BY t.ord)
        INTO absorb, filled
        FROM unnest(tiers) WITH ORDINALITY AS t(tier, ord);
"""
_RECHECK = "                off := (i - 1) * stride;\n"
_RECHECK_SKIP = (
    _RECHECK
    + "                -- An empty round and no due pair waiting (as loaded): not eligible.\n"
    + "                CONTINUE WHEN NOT filled[i] AND NOT absorb[i] AND ht[i] IS NULL;\n"
)
_AFTER_RECHECK = "            EXIT WHEN taken >= max_jobs;\n"
_AFTER_RECHECK_RESET = (
    "            filled := '{t,t,t}';  -- later rechecks see a round that may have changed\n"
    + _AFTER_RECHECK
)


def _revision_0011() -> ModuleType:
    return revision_module(Path(__file__).with_name("0011_claim_by_tenant.py"))


def _one_statement_start(body: str) -> str:
    for anchor in (_DECLARE, _START, _RECHECK, _AFTER_RECHECK):
        if body.count(anchor) != 1:
            raise RuntimeError(f"revision 0014: drr_dispatch lacks {anchor.strip()[:40]!r}")
    body = body.replace(_DECLARE, _DECLARE_FILLED)
    body = body.replace(_START, _START_IN_ONE)
    body = body.replace(_RECHECK, _RECHECK_SKIP)
    return body.replace(_AFTER_RECHECK, _AFTER_RECHECK_RESET)


def upgrade() -> None:
    r0011 = _revision_0011()
    op.execute(_one_statement_start(r0011.created()))
    for statement in r0011.SETTINGS:  # CREATE OR REPLACE dropped the function's settings
        op.execute(statement)


def downgrade() -> None:
    r0011 = _revision_0011()
    op.execute(r0011.created())
    for statement in r0011.SETTINGS:
        op.execute(statement)
