"""With ``pgqueue.require_known_tenant`` on, an unknown tenant is refused before admission.

The single enqueue (``try_enqueue``) and the job-by-job batch (``try_enqueue_many``, which
``try_enqueue_batch`` falls back to when a cap refuses part of a batch) asked admission
control first and registered (or refused) the tenant after. On a full tier, a job of a tenant
that was never registered therefore got the tier's verdict: under ``drop`` it counted as
dropped, and a counter row was written for a tenant that does not exist (any string made a
permanent row); under ``reject`` the caller got ``QueueFull``, a "retry later", for input that
can never be stored (found by a fresh tester). Now both refuse it first with ``PQ007``
(``UnknownTenant``), writing nothing; without the setting nothing changes.

``pgqueue.tenants_required()`` reads the setting (as Postgres reads a boolean: ``ON``, ``yes``
and ``True`` are on too; they read as off before); ``ensure_tenant`` uses it too. The three
functions are their revisions' text (0001, 0019, 0006), edited here, not copied.

Revision ID: 0030
Revises: 0029
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from alembic import op

from pgqueue.db.sqltext import function_definition, replace_anchor, revision_module

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

_HERE = Path(__file__).parent

TENANTS_REQUIRED = """\
CREATE OR REPLACE FUNCTION pgqueue.tenants_required()
RETURNS boolean
LANGUAGE sql
STABLE PARALLEL SAFE
AS $$
    -- Whether jobs of tenants not in pgqueue.tenants are refused (PQ007) rather than their
    -- tenants registered: the pgqueue.require_known_tenant setting, read as Postgres reads a
    -- boolean (on, true, yes, 1, t, y; any case, spaces around). Found by a tester: 'ON',
    -- 'yes' and 'True ' read as off.
    SELECT lower(btrim(coalesce(current_setting('pgqueue.require_known_tenant', true), '')))
           IN ('on', 'true', 'yes', '1', 't', 'y')
$$;
"""

_SETTING = """\
    IF coalesce(current_setting('pgqueue.require_known_tenant', true), '') IN ('on', 'true', '1')
    THEN
"""
_SETTING_READ = """\
    IF pgqueue.tenants_required() THEN
"""

_SINGLE_ADMISSION = """\
    IF tier_cap IS NOT NULL OR tenant_cap IS NOT NULL THEN
        v := pgqueue.admission_check(t, try_enqueue.tenant_id, 1);
"""
_SINGLE_REFUSE_FIRST = """\
    IF NOT known AND pgqueue.tenants_required() THEN
        -- refused before admission has a say (revision 0030): raises PQ007 unless the
        -- tenant was registered since the lookup
        PERFORM pgqueue.ensure_tenant(try_enqueue.tenant_id);
    END IF;
    IF tier_cap IS NOT NULL OR tenant_cap IS NOT NULL THEN
        v := pgqueue.admission_check(t, try_enqueue.tenant_id, 1);
"""

_MANY_FULL = """\
    IF EXISTS (SELECT 1 FROM unnest(batch) b WHERE NOT b.admitted AND b.policy <> 'drop') THEN
"""
_MANY_REFUSE_FIRST = """\
    IF pgqueue.tenants_required() THEN
        -- An unknown tenant is refused before admission has a say (revision 0030): the first
        -- in input order raises PQ007; ensure_tenant registers nothing when tenants are
        -- required.
        PERFORM pgqueue.ensure_tenant(d.tenant_id)
        FROM (SELECT b.tenant_id, min(b.ord) AS first FROM unnest(batch) b GROUP BY 1) d
        ORDER BY d.first;
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(batch) b WHERE NOT b.admitted AND b.policy <> 'drop') THEN
"""


def _ensure_tenant_before() -> str:
    return function_definition(_HERE / "0001_initial.sql", "ensure_tenant")


def _try_enqueue_before() -> str:
    r0019: ModuleType = revision_module(_HERE / "0019_single_enqueue.py")
    text: str = r0019.try_enqueue()
    return text


def _try_enqueue_many_before() -> str:
    return function_definition(_HERE / "0006_admission.sql", "try_enqueue_many")


def ensure_tenant() -> str:
    """``ensure_tenant`` as this revision creates it."""
    return replace_anchor(
        _ensure_tenant_before(), _SETTING, _SETTING_READ, what="revision 0030: ensure_tenant"
    )


def try_enqueue() -> str:
    """``try_enqueue`` as this revision creates it."""
    return replace_anchor(
        _try_enqueue_before(),
        _SINGLE_ADMISSION,
        _SINGLE_REFUSE_FIRST,
        what="revision 0030: try_enqueue",
    )


def try_enqueue_many() -> str:
    """``try_enqueue_many`` as this revision creates it."""
    return replace_anchor(
        _try_enqueue_many_before(),
        _MANY_FULL,
        _MANY_REFUSE_FIRST,
        what="revision 0030: try_enqueue_many",
    )


def upgrade() -> None:
    op.execute(TENANTS_REQUIRED)
    op.execute(ensure_tenant())
    op.execute(try_enqueue())
    op.execute(try_enqueue_many())


def downgrade() -> None:
    op.execute(_try_enqueue_many_before())
    op.execute(_try_enqueue_before())
    op.execute(_ensure_tenant_before())
    op.execute("DROP FUNCTION pgqueue.tenants_required()")
