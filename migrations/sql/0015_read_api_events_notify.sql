-- The read API (queue.Client.QueueStats) and the live event feed of the
-- dashboard (pgwake ui).
-- {{schema}} is replaced by the quoted schema name.

-- Queue and state together: the planner's estimate of one queue's jobs in
-- one state (QueueStats above its exact limit) uses their joint frequencies
-- instead of multiplying the two columns' as if they were independent.
CREATE STATISTICS {{schema}}.jobs_queue_state_stats (mcv, dependencies)
    ON queue, state FROM {{schema}}.jobs;

-- A process that shows events live (pgwake ui) keeps a row here with a
-- heartbeat. While any heartbeat is recent, every transaction that writes
-- events sends one NOTIFY on the channel "<schema>_events" (empty payload,
-- so one per transaction however many events it writes); the watcher then
-- reads the event log after its last id. With no watcher, writing events
-- costs one look at this (empty) table per statement and sends nothing: a
-- NOTIFY serialises commits on a global lock, which is why producers do
-- not send one per enqueue (migration 0004).
CREATE TABLE {{schema}}.event_watchers (
    id      text        PRIMARY KEY,
    seen_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE FUNCTION {{schema}}.notify_event_watchers() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{schema}}.event_watchers w
               WHERE w.seen_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '60 seconds')) THEN
        PERFORM pg_catalog.pg_notify(TG_TABLE_SCHEMA OPERATOR(pg_catalog.||) '_events', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER events_notify_watchers AFTER INSERT ON {{schema}}.events
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.notify_event_watchers();
