-- Wake-ups only when someone waits for them.
--
-- PostgreSQL serialises the commits of transactions that NOTIFY on one global
-- lock, so a NOTIFY in every enqueue caps producers far below what plain
-- inserts reach. A worker that has gone to sleep on a queue says so here;
-- producers NOTIFY only when wake_needed() finds such a worker.
--
-- Unlogged: no WAL, no fsync on writes, and emptied by crash recovery (the
-- workers' heartbeats re-create their rows, and the poll fallback covers the
-- gap).
CREATE UNLOGGED TABLE {{schema}}.waiters (
    queue        text        NOT NULL,
    client_id    text        NOT NULL,
    idle         boolean     NOT NULL DEFAULT true,
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, client_id)
);

-- wake_needed is called by every enqueue for each queue it touches. It holds a
-- shared advisory lock on the queue until the producer's transaction ends, then
-- looks for a sleeping worker with a fresh snapshot (VOLATILE plpgsql takes one
-- per statement). A worker going to sleep marks itself idle, commits, then takes
-- the same lock exclusively for an instant: that waits out every producer that
-- might have looked before the mark, and the worker checks the queue once more.
-- So each job is either seen by that last check or announced by a NOTIFY.
CREATE FUNCTION {{schema}}.wake_needed(q text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('{{schema}}.' || q, 0));
    RETURN EXISTS (
        SELECT 1 FROM {{schema}}.waiters
        WHERE queue = q AND idle AND heartbeat_at > now() - interval '90 seconds');
END
$$;
