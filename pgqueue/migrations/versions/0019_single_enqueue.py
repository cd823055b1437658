"""One job in fewer statements: ``try_enqueue`` does the insert trigger's work for its row.

For a job without a dedupe key, of a registered tenant, with no admission cap on its tier or
tenant, in READ COMMITTED, ``pgqueue.try_enqueue`` (and so ``pgqueue.enqueue`` and the Python
``enqueue``) now inserts the job, its DRR inbox entry and its two counter updates and sends the
NOTIFY in one statement, and locks the tenant with the demotion and admission lookup, instead
of leaving that to ``jobs_after_insert`` (five statements over a transition table, built for
batches). The trigger gets a ``WHEN`` that skips it while the transaction-local setting
``pgqueue.insert_bookkept`` names the current transaction and trigger depth, which only that
statement sets (a value set in the session never matches; an insert a user's row trigger makes
during that statement runs one level deeper and keeps the trigger). Server CPU per
single enqueue on the benchmark's job: ~340 µs before, ~280 µs after (``docs/bench.md``).

Every other case, and every other insert into ``pgqueue.jobs``, is unchanged.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

from pgqueue.db.sqltext import function_definition

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_SQL = Path(__file__).with_suffix(".sql")
_TRIGGER = """
DROP TRIGGER jobs_after_insert ON pgqueue.jobs;
CREATE TRIGGER jobs_after_insert
    AFTER INSERT ON pgqueue.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgqueue.jobs_after_insert();
"""


def upgrade() -> None:
    op.execute(_SQL.read_text(encoding="utf-8"))


def downgrade() -> None:
    op.execute(_TRIGGER)
    op.execute(
        function_definition(Path(__file__).with_name("0008_fast_enqueue.sql"), "try_enqueue")
    )
