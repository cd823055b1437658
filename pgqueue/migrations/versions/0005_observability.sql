-- pgqueue schema, revision 0005: public views for dashboards and `pgqueue status`.

-- Jobs waiting and running per tier (every tier listed, zeros included), the oldest queued
-- job's age in seconds, and how many queued jobs are due now.
CREATE VIEW pgqueue.queue_depth AS
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

-- The latency SLOs per tier, in seconds of enqueue-to-finish at p99 (the article's figures):
-- critical 2 s, standard 6 s, batch 120 s. GUCs pgqueue.slo_p99_<tier>_seconds override.
CREATE FUNCTION pgqueue.slo_p99_seconds(tier pgqueue.tier)
RETURNS double precision
LANGUAGE sql STABLE
AS $$
    SELECT pgqueue.setting('slo_p99_' || tier::text || '_seconds',
                           CASE tier WHEN 'critical' THEN 2 WHEN 'standard' THEN 6 ELSE 120 END)
$$;

-- p50 / p95 / p99 of enqueue-to-finish latency (seconds) of jobs that finished in the window,
-- per tier, against the SLO; meets_slo is NULL when nothing finished.
CREATE FUNCTION pgqueue.latency_slo_in(slo_window interval)
RETURNS TABLE (tier pgqueue.tier, finished bigint, succeeded bigint, failed bigint,
               p50_seconds double precision, p95_seconds double precision,
               p99_seconds double precision, slo_p99_seconds double precision,
               meets_slo boolean)
LANGUAGE sql STABLE
AS $$
    SELECT t.tier, coalesce(l.finished, 0), coalesce(l.succeeded, 0), coalesce(l.failed, 0),
           l.p50, l.p95, l.p99, pgqueue.slo_p99_seconds(t.tier),
           CASE WHEN l.p99 IS NULL THEN NULL ELSE l.p99 <= pgqueue.slo_p99_seconds(t.tier) END
    FROM unnest(enum_range(NULL::pgqueue.tier)) AS t(tier)
    LEFT JOIN (
        SELECT j.priority,
               count(*) AS finished,
               count(*) FILTER (WHERE j.state = 'succeeded') AS succeeded,
               count(*) FILTER (WHERE j.state = 'failed') AS failed,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM j.finished_at - j.enqueued_at)) AS p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM j.finished_at - j.enqueued_at)) AS p95,
               percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM j.finished_at - j.enqueued_at)) AS p99
        FROM pgqueue.jobs j
        WHERE j.state IN ('succeeded', 'failed') AND j.finished_at >= now() - slo_window
        GROUP BY j.priority
    ) l ON l.priority = t.tier
    ORDER BY t.tier
$$;

CREATE VIEW pgqueue.latency_slo AS
SELECT w.window_name, w.slo_window, s.*
FROM (VALUES ('5m', interval '5 minutes'), ('1h', interval '1 hour'),
             ('24h', interval '24 hours')) AS w(window_name, slo_window)
CROSS JOIN LATERAL pgqueue.latency_slo_in(w.slo_window) s;
