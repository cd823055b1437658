"""Pruning of the scheduler's idle flow rows (issue 28 follow-up): ``pgqueue.flows`` kept a row
per lane, tier and tenant ever backlogged, so a deployment with many transient tenants grew it
forever. ``pgqueue.flows_prune`` (new file ``075_prune.sql``) deletes the rows of tenants that
left: not cut by the horizon, last stamped job no longer queued, last key reached by the
cursor; one lane and tier at a time under ``pgqueue.fold``'s try-lock. Such a tenant joins
afresh at its next job either way, so the claim order is unchanged (docs/drr.md). Workers call
it on their rescuer's round (named statement ``flow_prune``), ``pgqueue prune`` on demand.

Revision ID: 0047
Revises: 0046
"""

from __future__ import annotations

from alembic import op

revision = "0047"
down_revision = "0046"
branch_labels = None
depends_on = None

FLOWS_PRUNE = """\
CREATE OR REPLACE FUNCTION pgqueue.flows_prune(p_limit integer)
RETURNS bigint
LANGUAGE plpgsql
SET jit TO 'off'
AS $$
DECLARE
    lt record;
    cr bigint;
    cp numeric;
    cs bigint;
    n bigint;
    total bigint := 0;
BEGIN
    FOR lt IN SELECT l.lane, l.tier FROM pgqueue.lane_tiers l ORDER BY l.lane, l.tier LOOP
        EXIT WHEN total >= p_limit;
        SELECT c.key_round, c.key_place, c.key_seq INTO cr, cp, cs
        FROM pgqueue.cursors c WHERE c.lane = lt.lane AND c.tier = lt.tier
        ORDER BY c.key_round DESC, c.key_place DESC, c.key_seq DESC LIMIT 1;
        CONTINUE WHEN cr IS NULL OR NOT EXISTS (
            SELECT FROM pgqueue.flows x
            WHERE x.lane = lt.lane AND x.tier = lt.tier AND NOT x.cut
              AND (x.last_round, x.place, x.last_seq) <= (cr, cp, cs));
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtextextended(lt.lane,
                                  array_position(enum_range(NULL::pgqueue.tier), lt.tier)));
        DELETE FROM pgqueue.flows f WHERE f.ctid IN (
            SELECT x.ctid FROM pgqueue.flows x
            WHERE x.lane = lt.lane AND x.tier = lt.tier AND NOT x.cut
              AND (x.last_round, x.place, x.last_seq) <= (cr, cp, cs)
              AND NOT EXISTS (
                  SELECT FROM pgqueue.jobs j
                  WHERE j.lane = lt.lane AND j.priority = lt.tier AND j.state = 'queued'
                    AND (j.key_round, j.key_place, j.key_seq)
                        = (x.last_round, x.place, x.last_seq))
            LIMIT p_limit - total);
        GET DIAGNOSTICS n = ROW_COUNT;
        total := total + n;
    END LOOP;
    RETURN total;
END
$$;
"""


def upgrade() -> None:
    op.execute(FLOWS_PRUNE)


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS pgqueue.flows_prune(integer)")
