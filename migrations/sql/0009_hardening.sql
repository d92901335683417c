-- Rows a worker can survive.
--
-- Any role granted INSERT and UPDATE on jobs (docs/grants.sql) could write
-- rows that no worker could finish: attempts = 2147483647 (every outcome's
-- attempts + 1 overflowed, so the claim rolled back and the job ran again at
-- once, for ever), a pending job with no attempt left, run_after = 'infinity'
-- or '-infinity' (claims and `pgwake stats` failed on the epoch arithmetic).
-- These constraints refuse such rows at the statement that writes them.
--
--  * jobs_attempts_check: 0 <= attempts <= max_attempts, and a pending job
--    has an attempt left (attempts < max_attempts). Every write pgwake makes
--    keeps this: a failed attempt leaves a job pending only while attempts
--    remain, and Retry raises max_attempts to attempts + 1. So attempts + 1
--    never overflows for a job a worker can claim.
--  * jobs_finite_times_check: run_after and created_at are finite.
--  * jobs_lease_check: a running (leased) job has a finite lease, so a
--    worker rescues it when the lease expires (a NULL or infinite lease kept
--    it running, and its unique key held, for ever).
--
-- Priority needs no constraint: its column is smallint, exactly the range
-- queue.NewJob.Priority accepts.
--
-- Existing rows that break the rules are repaired first: a pending or running
-- job is failed (its error says why); a finished one keeps its state and gets
-- its numbers and times clamped. The constraints are added NOT VALID (no scan
-- under the ACCESS EXCLUSIVE lock ALTER TABLE takes); migrations.Up validates
-- them after this migration commits, in a transaction of their own that
-- takes only SHARE UPDATE EXCLUSIVE, so enqueues and claims go on meanwhile.
WITH j AS (
    UPDATE {{schema}}.jobs SET
        state = 'failed', finished_at = pg_catalog.clock_timestamp(),
        last_error = 'pgwake migration 0009: the row broke a rule workers rely on (0 <= attempts < max_attempts, finite run_after and created_at, a running job has a finite lease); failed instead of run',
        lease_expires_at = NULL, leased_by = NULL,
        attempts = LEAST(GREATEST(attempts, 0), max_attempts),
        run_after = CASE WHEN pg_catalog.isfinite(run_after) THEN run_after ELSE pg_catalog.now() END,
        created_at = CASE WHEN pg_catalog.isfinite(created_at) THEN created_at ELSE pg_catalog.now() END
    WHERE state IN ('pending', 'running')
      AND (attempts < 0 OR attempts > max_attempts OR (state = 'pending' AND attempts >= max_attempts)
           OR NOT pg_catalog.isfinite(run_after) OR NOT pg_catalog.isfinite(created_at)
           OR (state = 'running' AND (lease_expires_at IS NULL OR NOT pg_catalog.isfinite(lease_expires_at))))
    RETURNING id, queue, kind, attempts, last_error
)
INSERT INTO {{schema}}.events (job_id, type, queue, kind, attempt, data)
SELECT id, 'failed', queue, kind, attempts, pg_catalog.jsonb_build_object('error', last_error) FROM j ORDER BY id;

UPDATE {{schema}}.jobs SET
    attempts = LEAST(GREATEST(attempts, 0), max_attempts),
    run_after = CASE WHEN pg_catalog.isfinite(run_after) THEN run_after ELSE pg_catalog.now() END,
    created_at = CASE WHEN pg_catalog.isfinite(created_at) THEN created_at ELSE pg_catalog.now() END
WHERE state NOT IN ('pending', 'running')
  AND (attempts < 0 OR attempts > max_attempts OR NOT pg_catalog.isfinite(run_after) OR NOT pg_catalog.isfinite(created_at));

ALTER TABLE {{schema}}.jobs
    ADD CONSTRAINT jobs_attempts_check
        CHECK (attempts >= 0 AND attempts <= max_attempts AND (state <> 'pending' OR attempts < max_attempts)) NOT VALID,
    ADD CONSTRAINT jobs_finite_times_check
        CHECK (pg_catalog.isfinite(run_after) AND pg_catalog.isfinite(created_at)) NOT VALID,
    ADD CONSTRAINT jobs_lease_check
        CHECK (state <> 'running' OR (lease_expires_at IS NOT NULL AND pg_catalog.isfinite(lease_expires_at))) NOT VALID;
