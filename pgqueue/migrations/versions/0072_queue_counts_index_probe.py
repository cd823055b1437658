"""``pgqueue.queue_counts_add`` runs with ``enable_seqscan`` off: its generic plans read the
one-page counter table by Seq Scan and updated by Seq Scan instead of TID, testing every dead
version of its rows, which another claimer's snapshot keeps from pruning (212 to 384 tuple
versions a job with two connections). ``bench/claim_instructions_peer.py --conns 2``: -1.5 %
instructions per claimed and completed job at one connection, -2.9 % at two.

Revision ID: 0072
Revises: 0071
"""

from __future__ import annotations

from alembic import op

revision = "0072"
down_revision = "0071"
branch_labels = None
depends_on = None

FUNCTION = r"""CREATE OR REPLACE FUNCTION pgqueue.queue_counts_add(
    p_tiers pgqueue.tier[],
    p_tenants text[],
    p_queued bigint[]
)
RETURNS void
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    i integer;
BEGIN
    IF coalesce(cardinality(p_tiers), 0) = 0 THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
        SELECT u.tier, u.tenant_id, u.queued FROM unnest(p_tiers, p_tenants, p_queued)
                                                  AS u(tier, tenant_id, queued);
        RETURN;
    END IF;
    -- One UPDATE per key (revision 0016), on a row of the key no other transaction holds.
    FOR i IN 1 .. cardinality(p_tiers) LOOP
        IF p_tenants[i] IS NULL THEN  -- the tier's total
            UPDATE pgqueue.queue_counts c SET queued = c.queued + p_queued[i]
            WHERE c.ctid = (SELECT x.ctid FROM pgqueue.queue_counts x
                            WHERE x.tier = p_tiers[i] AND x.tenant_id IS NULL
                            AND NOT x.claim_stripe
                            LIMIT 1 FOR UPDATE SKIP LOCKED);
        ELSE
            UPDATE pgqueue.queue_counts c SET queued = c.queued + p_queued[i]
            WHERE c.ctid = (SELECT x.ctid FROM pgqueue.queue_counts x
                            WHERE x.tier = p_tiers[i] AND x.tenant_id = p_tenants[i]
                            AND NOT x.claim_stripe
                            LIMIT 1 FOR UPDATE SKIP LOCKED);
        END IF;
        -- No row (all held, or the one locked changed after the snapshot): a new row.
        IF NOT FOUND THEN
            INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
            VALUES (p_tiers[i], p_tenants[i], p_queued[i]);
        END IF;
    END LOOP;
END
$$;
"""

FUNCTION_BEFORE = r"""CREATE OR REPLACE FUNCTION pgqueue.queue_counts_add(
    p_tiers pgqueue.tier[],
    p_tenants text[],
    p_queued bigint[]
)
RETURNS void
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    i integer;
BEGIN
    IF coalesce(cardinality(p_tiers), 0) = 0 THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
        SELECT u.tier, u.tenant_id, u.queued FROM unnest(p_tiers, p_tenants, p_queued)
                                                  AS u(tier, tenant_id, queued);
        RETURN;
    END IF;
    -- One UPDATE per key (revision 0016), on a row of the key no other transaction holds.
    FOR i IN 1 .. cardinality(p_tiers) LOOP
        IF p_tenants[i] IS NULL THEN  -- the tier's total
            UPDATE pgqueue.queue_counts c SET queued = c.queued + p_queued[i]
            WHERE c.ctid = (SELECT x.ctid FROM pgqueue.queue_counts x
                            WHERE x.tier = p_tiers[i] AND x.tenant_id IS NULL
                            AND NOT x.claim_stripe
                            LIMIT 1 FOR UPDATE SKIP LOCKED);
        ELSE
            UPDATE pgqueue.queue_counts c SET queued = c.queued + p_queued[i]
            WHERE c.ctid = (SELECT x.ctid FROM pgqueue.queue_counts x
                            WHERE x.tier = p_tiers[i] AND x.tenant_id = p_tenants[i]
                            AND NOT x.claim_stripe
                            LIMIT 1 FOR UPDATE SKIP LOCKED);
        END IF;
        -- No row (all held, or the one locked changed after the snapshot): a new row.
        IF NOT FOUND THEN
            INSERT INTO pgqueue.queue_counts (tier, tenant_id, queued)
            VALUES (p_tiers[i], p_tenants[i], p_queued[i]);
        END IF;
    END LOOP;
END
$$;
"""


def upgrade() -> None:
    op.execute(FUNCTION)


def downgrade() -> None:
    op.execute(FUNCTION_BEFORE)
