-- pgqueue schema, revision 0009: autovacuum settings for a queue.
--
-- Every job leaves dead row versions behind (queued -> running -> finished), and the claim's
-- partial indexes keep an entry for each until VACUUM removes it. With the default settings
-- autovacuum waits until 20 % of pgqueue.jobs is dead (about 200k versions when 1M finished
-- jobs are kept), and a claim meanwhile walks those entries: bench/bloat.py measured claim +
-- complete 2.30x slower after 1M finished jobs never vacuumed, 1.04x once vacuumed. So vacuum
-- pgqueue.jobs after 2 % (plus 1,000 rows) is dead (analyze after 2 % changed; a vacuum for
-- inserts after 5 % inserted), and the small tables that the
-- claim rewrites on every call (counters, deficits, tier state, inbox, limiter) after 500
-- dead rows whatever their size. docs/operations.md has the numbers.
ALTER TABLE pgqueue.jobs SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);
ALTER TABLE pgqueue.queue_counts SET (autovacuum_vacuum_scale_factor = 0,
                                      autovacuum_vacuum_threshold = 500);
ALTER TABLE pgqueue.deficits SET (autovacuum_vacuum_scale_factor = 0,
                                  autovacuum_vacuum_threshold = 500);
ALTER TABLE pgqueue.tier_state SET (autovacuum_vacuum_scale_factor = 0,
                                    autovacuum_vacuum_threshold = 500);
ALTER TABLE pgqueue.drr_inbox SET (autovacuum_vacuum_scale_factor = 0,
                                   autovacuum_vacuum_threshold = 500);
ALTER TABLE pgqueue.rate_limits SET (autovacuum_vacuum_scale_factor = 0,
                                     autovacuum_vacuum_threshold = 500);
