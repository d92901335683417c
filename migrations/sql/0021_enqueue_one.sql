-- The enqueue floor (issue 12), third step: one job, one scalar call.
--
-- enqueue_one inserts one job without a unique key, with its 'enqueued'
-- event and its wake-up: the rows, events, errors and wake-up protocol of
-- enqueue_jobs' one-job path (migration 0020), without what a call of
-- arrays costs. enqueue_jobs is a set-returning call of thirteen arrays:
-- the arrays are decoded and checked for equal lengths, every field is read
-- by subscript, and its OUT row goes through a tuplestore to the calling
-- SELECT. On the server alone (pgbench, 4 clients, synchronous_commit off,
-- so the figure is CPU), one job took 109-123 us of the cluster's CPU
-- through enqueue_jobs and 82-88 us through this function's body. The Go
-- client's Enqueue of one job without a unique key calls it, and so does
-- the SQL API's enqueue() for such a job; enqueue_jobs keeps its arrays for
-- more jobs and unique keys, unchanged.
--
-- Same checks (valid_job, so the same errors), same SECURITY DEFINER and
-- pinned search_path, same event watchers mark (migration 0019) and the
-- same wake-up check as enqueue_jobs' one-job path: not READ COMMITTED:
-- notify; else try the queue's wake key shared (held until the transaction
-- ends); if taken, look for an idle waiter, in a statement of its own so
-- that its snapshot is taken after the lock (migration 0020).
-- {{schema}} is the quoted schema name, {{wake_channel}} its NOTIFY
-- channel, {{events_notify_guc}} the name of the setting as a literal.
CREATE FUNCTION {{schema}}.enqueue_one(
    kind          text,
    payload       jsonb       DEFAULT NULL,
    queue         text        DEFAULT NULL,
    run_after     timestamptz DEFAULT NULL,
    delay         interval    DEFAULT NULL,
    priority      integer     DEFAULT NULL,
    max_attempts  integer     DEFAULT NULL,
    metadata      jsonb       DEFAULT NULL,
    payload_limit integer     DEFAULT 1048576
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    one_id        bigint;
    one_queue     text;
    one_run_after timestamptz;
    one_key       bigint;
    notify        boolean;
BEGIN
    WITH ins AS (
        INSERT INTO {{schema}}.jobs AS j (queue, kind, payload, priority, run_after, max_attempts, metadata)
        SELECT coalesce(enqueue_one.queue, 'default'), enqueue_one.kind, coalesce(enqueue_one.payload, '{}'::jsonb),
            coalesce(enqueue_one.priority, 0)::smallint,
            coalesce(enqueue_one.run_after, pg_catalog.now() + coalesce(enqueue_one.delay, interval '0')),
            coalesce(enqueue_one.max_attempts, 5), enqueue_one.metadata
        WHERE {{schema}}.valid_job(1, enqueue_one.kind, enqueue_one.payload, enqueue_one.queue, enqueue_one.run_after,
                enqueue_one.delay, enqueue_one.priority, enqueue_one.max_attempts, NULL, enqueue_one.payload_limit)
            -- No event watcher: mark the transaction so that the events
            -- trigger queues no commit-time call (migration 0019).
            AND (EXISTS (SELECT 1 FROM {{schema}}.event_watchers w
                    WHERE w.seen_at > pg_catalog.now() - interval '60 seconds')
                OR pg_catalog.set_config({{events_notify_guc}}, 'queued', true) IS NOT NULL)
        RETURNING j.id, j.queue, j.kind, j.run_after
    ), ev AS (
        INSERT INTO {{schema}}.events (job_id, type, queue, kind, attempt, data)
        SELECT x.id, 'enqueued', x.queue, x.kind, 0, pg_catalog.jsonb_build_object('run_after', x.run_after) FROM ins x
    )
    SELECT x.id, x.queue, x.run_after,
        (SELECT s.salt FROM {{schema}}.wake_salt s) # (pg_catalog.hashtextextended(x.queue, 0::bigint) & 255::bigint)
    INTO one_id, one_queue, one_run_after, one_key FROM ins x;
    -- wake_needed(one_queue), inline, as in enqueue_jobs (migration 0020).
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        notify := true;
    ELSIF NOT pg_catalog.pg_try_advisory_xact_lock_shared(one_key) THEN
        notify := true;
    ELSE
        notify := EXISTS (SELECT 1 FROM {{schema}}.waiters w
            WHERE w.queue = one_queue AND w.idle AND w.heartbeat_at > pg_catalog.now() - interval '90 seconds');
    END IF;
    IF notify THEN
        PERFORM pg_catalog.pg_notify({{wake_channel}}, one_queue || CASE WHEN one_run_after > pg_catalog.clock_timestamp()
            THEN '|' || pg_catalog.ceil(EXTRACT(epoch FROM one_run_after - pg_catalog.clock_timestamp()) * 1000::numeric)::bigint::text
            ELSE '' END);
    END IF;
    RETURN one_id;
END
$$;

REVOKE EXECUTE ON FUNCTION
    {{schema}}.enqueue_one(text, jsonb, text, timestamptz, interval, integer, integer, jsonb, integer)
FROM PUBLIC;

-- Whoever may call enqueue_jobs (the Go client's producers and workers, the
-- SQL API's producers: docs/grants.sql) may call enqueue_one, which the Go
-- client now calls instead for one job: grants made before this migration
-- keep working.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT a.grantee::regrole::text AS grantee
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid = '{{schema}}.enqueue_jobs(text[], jsonb[], text[], timestamptz[], interval[], integer[], integer[], text[], integer, text[], text[], interval[], jsonb[])'::regprocedure
          AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION {{schema}}.enqueue_one(text, jsonb, text, timestamptz, interval, integer, integer, jsonb, integer) TO %s',
            g.grantee);
    END LOOP;
END
$$;

-- The SQL API's enqueue() of a job without a unique key goes through
-- enqueue_one (one call instead of two, and no arrays); with a key, through
-- enqueue_jobs as before. Same signature, defaults and results.
CREATE OR REPLACE FUNCTION {{schema}}.enqueue(
    kind          text,
    payload       jsonb       DEFAULT '{}',
    queue         text        DEFAULT 'default',
    run_after     timestamptz DEFAULT NULL,
    delay         interval    DEFAULT NULL,
    priority      integer     DEFAULT 0,
    max_attempts  integer     DEFAULT 5,
    unique_key    text        DEFAULT NULL,
    unique_scope  text        DEFAULT NULL,
    unique_hold   text        DEFAULT NULL,
    unique_period interval    DEFAULT NULL,
    metadata      jsonb       DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- plpgsql, not sql: its plans are cached for the session.
    IF coalesce(unique_key, '') = '' AND unique_scope IS NULL AND unique_hold IS NULL AND unique_period IS NULL THEN
        RETURN {{schema}}.enqueue_one(kind, payload, queue, run_after, delay, priority, max_attempts, metadata);
    END IF;
    RETURN ({{schema}}.enqueue_jobs(ARRAY[kind], ARRAY[payload], ARRAY[queue], ARRAY[run_after], ARRAY[delay],
        ARRAY[priority], ARRAY[max_attempts], ARRAY[unique_key], 1048576,
        ARRAY[unique_scope], ARRAY[unique_hold], ARRAY[unique_period], ARRAY[metadata])).ids[1];
END
$$;
