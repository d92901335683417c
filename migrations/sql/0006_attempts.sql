-- Attempts that survive their claim transaction.
--
-- A worker runs a job's handler inside the transaction that claimed it, so a
-- crash, a failed COMMIT or a killed session rolls back everything that
-- transaction wrote, including any record that the attempt happened. Before a
-- claimed batch runs, the worker records here, in a transaction of its own,
-- that these attempts started. The claim transaction deletes the rows when it
-- records the outcome, so they commit or vanish together. A row whose job is
-- pending and not locked by any claim is an attempt that began and never
-- recorded an outcome (queue.Client's recovery claim finds it). A process
-- that dies takes every attempt it was running with it, so the job at fault
-- is found by re-running: once more as usual (isolation 1), then with nothing
-- else running in its process (isolation 2); only a loss in isolation 2 is
-- counted as a failed attempt.
--
-- Unlogged: no WAL for rows that live a few milliseconds. A worker process
-- that dies, a lost connection or a failed COMMIT leave them in place; only
-- crash recovery of the server itself empties the table, and then the
-- attempts in flight at the crash run again uncounted.
CREATE UNLOGGED TABLE {{schema}}.attempts (
    job_id     bigint      PRIMARY KEY,
    queue      text        NOT NULL,
    -- The attempt number that started (the job's attempts + 1 at claim).
    attempt    integer     NOT NULL,
    -- How many jobs shared the claim transaction.
    batch      integer     NOT NULL,
    -- 0: ran as usual; 1: re-run after a loss; 2: re-run alone in its process.
    isolation  smallint    NOT NULL DEFAULT 0,
    client_id  text        NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX attempts_queue_idx ON {{schema}}.attempts (queue, started_at);
-- Every claimed batch inserts and deletes its rows: vacuum often.
ALTER TABLE {{schema}}.attempts SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);

-- wake_needed, hardened (replaces migration 0004's):
--  * search_path pinned: nothing a role creates in another schema runs here.
--  * The queue's advisory lock is only tried, never waited for: a role that
--    holds the key (by mistake or on purpose) cannot stall enqueues. Not
--    getting it means a worker may be between its idle mark and its last look,
--    so the producer notifies, which keeps the no-lost-wake-up argument.
--  * The key is salted with a random value kept in wake_salt, readable only by
--    roles granted pgwake's tables: other roles cannot predict it.
--  * A REPEATABLE READ or SERIALIZABLE producer reads the waiters table through
--    a snapshot that may predate a worker's idle mark, so it always notifies.
CREATE TABLE {{schema}}.wake_salt (
    salt bigint NOT NULL
);
INSERT INTO {{schema}}.wake_salt (salt)
SELECT ('x' || pg_catalog.substr(pg_catalog.md5(pg_catalog.random()::text || pg_catalog.clock_timestamp()::text), 1, 16))::bit(64)::bigint;

CREATE OR REPLACE FUNCTION {{schema}}.wake_needed(q text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        RETURN true;
    END IF;
    IF NOT pg_catalog.pg_try_advisory_xact_lock_shared(
            pg_catalog.hashtextextended(q, (SELECT s.salt FROM {{schema}}.wake_salt s))) THEN
        RETURN true;
    END IF;
    RETURN EXISTS (
        SELECT 1 FROM {{schema}}.waiters w
        WHERE w.queue OPERATOR(pg_catalog.=) q AND w.idle
          AND w.heartbeat_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '90 seconds'));
END
$$;

-- wake_lock_key is the key a worker's idle barrier takes exclusively.
CREATE FUNCTION {{schema}}.wake_lock_key(q text) RETURNS bigint
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_catalog.hashtextextended(q, (SELECT s.salt FROM {{schema}}.wake_salt s)) $$;
