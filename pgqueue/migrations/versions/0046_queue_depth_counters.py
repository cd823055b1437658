"""``pgqueue.queue_depth`` never reads finished jobs (issue 28): its ``state IN ('queued',
'running')`` matched no partial index, so every read (the exporter's, every 30 s) scanned the
whole jobs table. Queued now comes from the exact counters (``queue_counts``), due from them
less the queued jobs not due yet, running and the oldest queued job's age through the partial
indexes. Same columns, types and meaning; the text is 100_views.sql's.

Revision ID: 0046
Revises: 0045
"""

from __future__ import annotations

from alembic import op

revision = "0046"
down_revision = "0045"
branch_labels = None
depends_on = None

QUEUE_DEPTH = """\
CREATE OR REPLACE VIEW pgqueue.queue_depth AS
SELECT t.tier,
       coalesce(c.queued, 0)::bigint AS queued,
       coalesce(c.queued, 0)::bigint - coalesce(l.later, 0) AS due,
       coalesce(r.running, 0) AS running,
       o.oldest_queued_seconds
FROM unnest(enum_range(NULL::pgqueue.tier)) AS t(tier)
LEFT JOIN (
    SELECT qc.tier, sum(qc.queued) AS queued
    FROM pgqueue.queue_counts qc
    WHERE qc.tenant_id IS NULL
    GROUP BY qc.tier
) c ON c.tier = t.tier
LEFT JOIN (
    SELECT j.priority, count(*) AS later
    FROM pgqueue.jobs j
    WHERE j.state = 'queued' AND j.run_at > now()
    GROUP BY j.priority
) l ON l.priority = t.tier
LEFT JOIN (
    SELECT j.priority, count(*) AS running
    FROM pgqueue.jobs j
    WHERE j.state = 'running'
    GROUP BY j.priority
) r ON r.priority = t.tier
LEFT JOIN (
    SELECT j.priority,
           extract(epoch FROM now() - min(j.enqueued_at))::double precision
               AS oldest_queued_seconds
    FROM pgqueue.jobs j
    WHERE j.state = 'queued'
    GROUP BY j.priority
) o ON o.priority = t.tier
ORDER BY t.tier;
"""

QUEUE_DEPTH_BEFORE = """\
CREATE OR REPLACE VIEW pgqueue.queue_depth AS
SELECT t.tier,
       coalesce(q.queued, 0) AS queued,
       coalesce(q.due, 0) AS due,
       coalesce(q.running, 0) AS running,
       q.oldest_queued_seconds
FROM unnest(enum_range(NULL::pgqueue.tier)) AS t(tier)
LEFT JOIN (
    SELECT j.priority,
           count(*) FILTER (WHERE j.state = 'queued') AS queued,
           count(*) FILTER (WHERE j.state = 'queued' AND j.run_at <= now()) AS due,
           count(*) FILTER (WHERE j.state = 'running') AS running,
           extract(epoch FROM now() - min(j.enqueued_at) FILTER (WHERE j.state = 'queued'))
               ::double precision AS oldest_queued_seconds
    FROM pgqueue.jobs j
    WHERE j.state IN ('queued', 'running')
    GROUP BY j.priority
) q ON q.priority = t.tier
ORDER BY t.tier;
"""


def upgrade() -> None:
    op.execute(QUEUE_DEPTH)


def downgrade() -> None:
    op.execute(QUEUE_DEPTH_BEFORE)
