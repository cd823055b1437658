-- Tenant administration.

-- name: tenant_upsert :one
INSERT INTO pgqueue.tenants AS t (tenant_id, plan, quantum, daily_token_budget)
VALUES (%(tenant_id)s, coalesce(%(plan)s, 'free'), %(quantum)s, %(daily_token_budget)s)
ON CONFLICT (tenant_id) DO UPDATE
SET plan = coalesce(%(plan)s, t.plan),
    quantum = coalesce(%(quantum)s, t.quantum),
    daily_token_budget = coalesce(%(daily_token_budget)s, t.daily_token_budget),
    updated_at = now()
RETURNING t.tenant_id, t.plan, t.quantum, t.daily_token_budget

-- name: tenant_list :many
SELECT t.tenant_id, t.plan, t.quantum, t.daily_token_budget,
       (SELECT count(*) FROM pgqueue.jobs j
        WHERE j.tenant_id = t.tenant_id AND j.state = 'queued') AS queued,
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
