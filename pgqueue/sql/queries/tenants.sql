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
