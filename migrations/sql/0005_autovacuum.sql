-- Completed jobs leave dead entries at the head of jobs_claim_idx until
-- vacuum removes them, and every claim steps over them. PostgreSQL's default
-- (vacuum after 20% of the table changed) lets hundreds of thousands pile up
-- in a large table; vacuum the jobs table after 1% (plus 1,000 rows), without
-- throttling. The events table is append-only: only insert-driven vacuums
-- (visibility map, freezing) matter there.
ALTER TABLE {{schema}}.jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02
);
