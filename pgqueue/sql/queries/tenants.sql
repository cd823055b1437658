-- Tenant administration.

-- name: tenant_upsert :one
-- Create a tenant or change its plan, quantum or daily budget; NULL keeps a value
-- (pgqueue.tenant_set, revision 0034).
SELECT t.tenant_id, t.plan, t.quantum, t.daily_token_budget
FROM pgqueue.tenant_set(%(tenant_id)s, %(plan)s, %(quantum)s, %(daily_token_budget)s) t

-- name: tenant_list :many
SELECT t.tenant_id, t.plan, t.quantum, t.daily_token_budget,
       -- the exact counters (admission's; one probe per tier): no index holds every queued
       -- job by tenant, as the stamp would write an entry in it (revision 0060)
       (SELECT coalesce(sum(c.queued), 0)::bigint FROM pgqueue.queue_counts c
        WHERE c.tier = ANY (enum_range(NULL::pgqueue.tier))
          AND c.tenant_id = t.tenant_id) AS queued,
       EXISTS (SELECT 1 FROM pgqueue.demotions d
               WHERE d.tenant_id = t.tenant_id AND d.expires_at > now()) AS demoted
FROM pgqueue.tenants t
ORDER BY t.tenant_id
LIMIT %(limit)s

-- name: session_scope_default :exec
-- The session's tenant scope (pgqueue.tenant_id) becomes this tenant unless one is set
-- already: `pgqueue cancel --tenant T` run as a producer, whose cancels need the scope.
SELECT set_config('pgqueue.tenant_id', %(tenant_id)s, false)
WHERE coalesce(current_setting('pgqueue.tenant_id', true), '') = ''
