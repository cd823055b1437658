-- The shared provider rate limiter (migration 0004), from the worker's side.

-- name: ratelimit_observe :exec
-- After an answer: learn limits, lower levels to what the provider reports, refund what was
-- reserved but not used, and update the input estimate ratio.
SELECT pgqueue.ratelimit_observe(
    %(model)s,
    %(requests_limit)s, %(requests_remaining)s,
    %(input_limit)s, %(input_remaining)s,
    %(output_limit)s, %(output_remaining)s,
    %(estimated_input)s, %(actual_input)s,
    %(reserved_output)s, %(actual_output)s)

-- name: ratelimit_release :exec
-- A request taken by the claim and not sent (its job deferred): give back what was taken.
SELECT pgqueue.ratelimit_release(%(model)s, %(estimated_input)s, %(reserved_output)s)

-- name: ratelimit_cooldown :one
-- A 429/529: no worker sends to the model before now + seconds.
SELECT pgqueue.ratelimit_cooldown(%(model)s, %(seconds)s) AS cooldown_until

-- name: ratelimit_list :many
SELECT model, requests_per_minute, input_tokens_per_minute, output_tokens_per_minute,
       requests_available, input_tokens_available, output_tokens_available, cooling_down,
       cooldown_until, input_estimate_ratio, limits_from_headers
FROM pgqueue.rate_limit_state
ORDER BY model

-- name: ratelimit_set :one
-- Configure a model's limits (per minute); levels start full. Headers from the provider
-- override these limits later (they are the truth for the account).
INSERT INTO pgqueue.rate_limits AS l (model, requests_per_minute, input_tokens_per_minute,
    output_tokens_per_minute, requests_available, input_tokens_available,
    output_tokens_available)
VALUES (%(model)s, %(rpm)s, %(itpm)s, %(otpm)s, %(rpm)s, %(itpm)s, %(otpm)s)
ON CONFLICT (model) DO UPDATE
SET requests_per_minute = EXCLUDED.requests_per_minute,
    input_tokens_per_minute = EXCLUDED.input_tokens_per_minute,
    output_tokens_per_minute = EXCLUDED.output_tokens_per_minute,
    requests_available = least(l.requests_available, EXCLUDED.requests_per_minute),
    input_tokens_available = least(l.input_tokens_available, EXCLUDED.input_tokens_per_minute),
    output_tokens_available = least(l.output_tokens_available,
                                    EXCLUDED.output_tokens_per_minute),
    limits_from_headers = false
RETURNING model, requests_per_minute, input_tokens_per_minute, output_tokens_per_minute
