"""The jobs-to-tenants reference is checked once per statement instead of once per row.

The foreign key ran a lookup per inserted job, about half of an insert's cost; the insert
trigger of revision 0012 now checks the statement's distinct tenants at once (and locks them
FOR KEY SHARE, as the foreign key did), and a trigger on ``pgqueue.tenants`` keeps referenced
tenants. ``jobs_after_insert`` is revision 0012's function with the check added here (edited,
not copied).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

from pgqueue.db.sqltext import function_definition

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_SQL = Path(__file__).with_suffix(".sql")
_TRIGGERS_SQL = Path(__file__).with_name("0012_one_trigger_per_write.sql")
_DECLARE = "DECLARE\n    tiers pgqueue.tier[];\n"
_BEGIN = "    touched text;\nBEGIN\n"
_TENANT_CHECK = """    -- What the foreign key to pgqueue.tenants did, once per statement (revision 0013): every
    -- tenant exists, and stays (FOR KEY SHARE) until this transaction ends.
    -- One statement: each distinct tenant locked by a probe; the first one missing, if any.
    SELECT n.tenant_id INTO unknown
    FROM (SELECT DISTINCT r.tenant_id FROM new_rows r) AS n
    LEFT JOIN LATERAL (SELECT true AS known FROM pgqueue.tenants t
                       WHERE t.tenant_id = n.tenant_id FOR KEY SHARE) AS k ON true
    WHERE k.known IS NULL
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'unknown tenant %: register it first (pgqueue.ensure_tenant)',
            quote_literal(unknown) USING ERRCODE = 'foreign_key_violation';
    END IF;
"""


def _insert_trigger_before() -> str:
    return function_definition(_TRIGGERS_SQL, "jobs_after_insert")


def _with_tenant_check(body: str) -> str:
    if body.count(_DECLARE) != 1 or body.count(_BEGIN) != 1:
        raise RuntimeError("revision 0013: 0012's jobs_after_insert is not the expected text")
    body = body.replace(_DECLARE, _DECLARE + "    unknown text;\n")
    return body.replace(_BEGIN, _BEGIN + _TENANT_CHECK)


def upgrade() -> None:
    op.execute(_with_tenant_check(_insert_trigger_before()))
    op.execute(_SQL.read_text(encoding="utf-8"))


def downgrade() -> None:
    op.execute("DROP TRIGGER tenants_truncate_guard ON pgqueue.tenants")
    op.execute("DROP FUNCTION pgqueue.tenants_truncate_guard()")
    op.execute("DROP TRIGGER jobs_tenant_known ON pgqueue.jobs")
    op.execute("DROP FUNCTION pgqueue.jobs_tenant_known()")
    op.execute("DROP TRIGGER tenants_keep_referenced ON pgqueue.tenants")
    op.execute("DROP FUNCTION pgqueue.tenants_keep_referenced()")
    op.execute(_insert_trigger_before())
    op.execute(
        "ALTER TABLE pgqueue.jobs ADD CONSTRAINT jobs_tenant_id_fkey"
        " FOREIGN KEY (tenant_id) REFERENCES pgqueue.tenants (tenant_id)"
    )
