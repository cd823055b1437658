-- Revision 0009 downgrade: Postgres' default autovacuum settings again.
ALTER TABLE pgqueue.jobs RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
                                autovacuum_vacuum_insert_scale_factor,
                                autovacuum_analyze_scale_factor);
ALTER TABLE pgqueue.queue_counts RESET (autovacuum_vacuum_scale_factor,
                                        autovacuum_vacuum_threshold);
ALTER TABLE pgqueue.deficits RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);
ALTER TABLE pgqueue.tier_state RESET (autovacuum_vacuum_scale_factor,
                                      autovacuum_vacuum_threshold);
ALTER TABLE pgqueue.drr_inbox RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);
ALTER TABLE pgqueue.rate_limits RESET (autovacuum_vacuum_scale_factor,
                                       autovacuum_vacuum_threshold);
