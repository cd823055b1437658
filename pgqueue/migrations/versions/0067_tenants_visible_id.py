"""A tenant id that shows nothing is refused by the tenants table itself (found by a
fresh-machine trial: ``pgqueue.tenant_set`` and ``pgqueue.ensure_tenant`` stored ids of U+200B,
U+2060, a tab or spaces, which no command can then name, while every enqueue refused them since
revision 0066): the CHECK ``tenants_tenant_id_visible``, NOT VALID (rows stored before stay), with
the class of ``pgqueue.validation.INVISIBLE_CLASS``. The text is 010_tables.sql's.

Revision ID: 0067
Revises: 0066
"""

from __future__ import annotations

from alembic import op

revision = "0067"
down_revision = "0066"
branch_labels = None
depends_on = None

CONSTRAINT = r"""DO $do$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_constraint WHERE conname = 'tenants_tenant_id_visible'
                   AND conrelid = 'pgqueue.tenants'::regclass) THEN
ALTER TABLE pgqueue.tenants
    ADD CONSTRAINT tenants_tenant_id_visible CHECK (tenant_id !~ (
        '^[\u0001-\u0020\u007f-\u00a0\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f'
        || '\u0890-\u0891\u08e2\u115f-\u1160\u1680\u17b4-\u17b5\u180b-\u180f'
        || '\u2000-\u200f\u2028-\u202f\u205f-\u206f\u3000\u3164\ufe00-\ufe0f'
        || '\ufeff\uffa0\ufff0-\ufffb\U000110bd\U000110cd\U00013430-\U00013438'
        || '\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]+$')) NOT VALID;
    END IF;
END
$do$"""


def upgrade() -> None:
    op.execute(CONSTRAINT)


def downgrade() -> None:
    op.execute("ALTER TABLE pgqueue.tenants DROP CONSTRAINT IF EXISTS tenants_tenant_id_visible")
