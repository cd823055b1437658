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

-- name: ratelimit_cooldown :one
-- A 429/529: no worker sends to the model before now + seconds.
SELECT pgqueue.ratelimit_cooldown(%(model)s, %(seconds)s) AS cooldown_until
