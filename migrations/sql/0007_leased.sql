-- Leased mode (queue.Config.LeasedKinds): the claim commits at once, state
-- 'running' with the attempt counted and a lease; the handler runs with no
-- transaction held; a heartbeat extends the lease; a lease that expires
-- (the worker died or stalled) is rescued by any live worker and retried.
ALTER TABLE {{schema}}.jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE {{schema}}.jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'cancelled'));
ALTER TABLE {{schema}}.jobs
    ADD COLUMN lease_expires_at timestamptz,
    ADD COLUMN leased_by        text;

-- Rescue: expired leases, oldest first. Running jobs are few.
CREATE INDEX jobs_lease_idx ON {{schema}}.jobs (lease_expires_at) WHERE state = 'running';

-- A unique key is held while its job is pending or running.
DROP INDEX {{schema}}.jobs_unique_key_idx;
CREATE UNIQUE INDEX jobs_unique_key_idx ON {{schema}}.jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('pending', 'running');
