"""The batches lane per tenant: the view ``pgqueue.batch_lane_service`` (requests, results by
type, tokens of the succeeded requests per tenant; issue 30, docs/batches.md).

Revision ID: 0037
Revises: 0036
"""

from __future__ import annotations

from alembic import op

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None

BATCH_LANE_SERVICE = """\
DROP VIEW IF EXISTS pgqueue.batch_lane_service;
CREATE VIEW pgqueue.batch_lane_service AS
SELECT bj.tenant_id, count(*) AS requests,
       count(*) FILTER (WHERE bj.outcome IS NULL) AS pending,
       count(*) FILTER (WHERE bj.outcome = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE bj.outcome = 'errored') AS errored,
       count(*) FILTER (WHERE bj.outcome = 'expired') AS expired,
       count(*) FILTER (WHERE bj.outcome = 'canceled') AS canceled,
       coalesce(sum(j.input_tokens) FILTER (WHERE bj.outcome = 'succeeded'), 0)::bigint
           AS input_tokens,
       coalesce(sum(j.output_tokens) FILTER (WHERE bj.outcome = 'succeeded'), 0)::bigint
           AS output_tokens
FROM pgqueue.batch_jobs bj
LEFT JOIN pgqueue.jobs j ON j.id = bj.job_id AND j.tenant_id = bj.tenant_id
GROUP BY bj.tenant_id;
"""


def upgrade() -> None:
    op.execute(BATCH_LANE_SERVICE)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS pgqueue.batch_lane_service")
