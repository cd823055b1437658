-- Enqueue: thin wrappers over the SQL functions, so SQL callers and Python share one path.
-- Python calls the try_ variants: a full tier comes back as a row (outcome 'full'), not as an
-- error, so the caller's transaction stays usable; pgqueue.enqueue raises PQ010 instead. A
-- batch goes to try_enqueue_batch with every payload in ONE JSON array text (parsed once as
-- jsonb), not as a jsonb[] of texts; the other arrays go in binary (%(x)b: no escaping).

-- name: job_try_enqueue :one
SELECT t.id, t.outcome, t.tier::text AS tier, t.policy, t.scope, t.depth, t.cap
FROM pgqueue.try_enqueue(
    tenant_id => %(tenant_id)s,
    origin => %(origin)s,
    payload => %(payload)s::jsonb,
    sla_seconds => %(sla_seconds)s,
    kind => %(kind)s,
    max_attempts => %(max_attempts)s,
    run_at => %(run_at)s,
    dedupe_key => %(dedupe_key)s
) AS t

-- name: job_try_enqueue_batch :one
-- One row: the ids in input order (NULL for a job dropped), and the jobs not enqueued
-- (outcome 'dropped' or 'full', with what admission control said) as a JSON array, NULL when
-- every job was enqueued. A row per job cost the client ~0.8 us per job to read (eight
-- columns, 1,000 dict rows), one int8 array ~0.1. `others` goes as text, parsed by pgqueue:
-- the caller's connection may load jsonb its own way (as text, or into its own objects).
SELECT array_agg(t.id ORDER BY t.ord) AS ids,
       (jsonb_agg(jsonb_build_object('ord', t.ord, 'outcome', t.outcome,
                                     'tier', t.tier::text, 'policy', t.policy,
                                     'scope', t.scope, 'depth', t.depth, 'cap', t.cap)
                  ORDER BY t.ord) FILTER (WHERE t.outcome <> 'enqueued'))::text AS others
FROM pgqueue.try_enqueue_batch(
    tenant_ids => %(tenant_ids)b::text[],
    origins => %(origins)b::text[],
    payloads => %(payloads)s::jsonb,
    sla_seconds => %(sla_seconds)b::double precision[],
    kinds => %(kinds)b::text[]
) AS t
