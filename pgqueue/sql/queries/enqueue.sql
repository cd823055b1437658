-- Enqueue: thin wrappers over the SQL functions, so SQL callers and Python share one path.

-- name: job_enqueue :one
SELECT pgqueue.enqueue(
    tenant_id => %(tenant_id)s,
    origin => %(origin)s,
    payload => %(payload)s,
    sla_seconds => %(sla_seconds)s,
    kind => %(kind)s,
    max_attempts => %(max_attempts)s,
    run_at => %(run_at)s
) AS id

-- name: job_enqueue_many :many
SELECT id FROM pgqueue.enqueue_many(
    tenant_ids => %(tenant_ids)s,
    origins => %(origins)s,
    payloads => %(payloads)s::jsonb[],
    sla_seconds => %(sla_seconds)s::double precision[],
    kinds => %(kinds)s::text[]
) AS id
