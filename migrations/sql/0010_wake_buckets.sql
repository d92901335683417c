-- The wake-up locks in a bounded number of keys: a queue's key is one of 256
-- buckets (the queue name's hash, low 8 bits), salted as before. An enqueue
-- statement holds at most 256 advisory locks, however many distinct queues
-- it writes: one lock per queue made an EnqueueMany over 25,000 queues fail
-- with "out of shared memory" (the server's lock table). Queues that share
-- a bucket share the lock: a worker's idle barrier may then wait for a
-- producer of another queue, which costs it a 25 ms recheck, never a
-- wake-up.
CREATE OR REPLACE FUNCTION {{schema}}.wake_lock_key(q text) RETURNS bigint
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT (SELECT s.salt FROM {{schema}}.wake_salt s)
    OPERATOR(pg_catalog.#) (pg_catalog.hashtextextended(q, 0::bigint) OPERATOR(pg_catalog.&) 255::bigint)
$$;

CREATE OR REPLACE FUNCTION {{schema}}.wake_needed(q text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        RETURN true;
    END IF;
    IF NOT pg_catalog.pg_try_advisory_xact_lock_shared((SELECT s.salt FROM {{schema}}.wake_salt s)
            OPERATOR(pg_catalog.#) (pg_catalog.hashtextextended(q, 0::bigint) OPERATOR(pg_catalog.&) 255::bigint)) THEN
        RETURN true;
    END IF;
    RETURN EXISTS (
        SELECT 1 FROM {{schema}}.waiters w
        WHERE w.queue OPERATOR(pg_catalog.=) q AND w.idle
          AND w.heartbeat_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '90 seconds'));
END
$$;
