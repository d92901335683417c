-- The live event feed's NOTIFY (migration 0015), decided at commit and
-- sent at most once per 25 ms.
-- {{schema}} is replaced by the quoted schema name, {{events_notify_guc}}
-- by the string literal 'pgwake.events_notify_<schema>'.
--
-- Migration 0015 sent one NOTIFY per transaction writing events while a
-- dashboard ran; each NOTIFY takes PostgreSQL's global notify lock from just
-- before the commit record until the commit ends, so the commits of
-- concurrent producers queued behind each other (enqueue 1.47x slower with
-- a dashboard open, docs/ui.md). Now a transaction that writes events
-- decides at its commit: it notifies only when no notification was decided
-- in the last 25 ms. A watcher therefore reads the event log again some time
-- after each notification and keeps doing so while it finds new events (the
-- ui feed reads 50 ms after its last notified read): a transaction that
-- committed without notifying did so within 25 ms after one that did.
--
-- The time of the last decision to notify is kept in a sequence, as epoch
-- milliseconds: setval and reading last_value are not transactional and
-- take no lock that outlives them. Two commits that read it at once may
-- both notify (harmless: the feed reads once per 25 ms anyway). A stamp in
-- the future (clock stepped back) suppresses nothing. If the transaction
-- that set the stamp fails after deciding (a later deferred constraint, a
-- serialization failure), the commits of the next 25 ms that skipped wait
-- for the next notification or the watcher's own periodic look.
CREATE SEQUENCE {{schema}}.event_notify_stamp AS bigint MINVALUE 0 START 0 NO CYCLE;

-- Runs at commit as the schema's owner (so that no role needs, or gets, a
-- privilege on the stamp: none can setval it to silence the feed). It is a
-- trigger function: nobody can call it directly, and without EXECUTE no
-- other role can attach it to a table of theirs.
CREATE FUNCTION {{schema}}.notify_event_watchers_at_commit() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ms   bigint;
    last_ms  bigint;
    since_ms bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {{schema}}.event_watchers w
                   WHERE w.seen_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '60 seconds')) THEN
        RETURN NULL;
    END IF;
    now_ms := pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000)::bigint;
    SELECT s.last_value INTO last_ms FROM {{schema}}.event_notify_stamp s;
    since_ms := now_ms OPERATOR(pg_catalog.-) last_ms;
    IF (since_ms OPERATOR(pg_catalog.>=) 0) AND (since_ms OPERATOR(pg_catalog.<) 25) THEN
        RETURN NULL; -- another commit notified less than 25 ms ago
    END IF;
    PERFORM pg_catalog.setval('{{schema}}.event_notify_stamp'::pg_catalog.regclass, now_ms);
    PERFORM pg_catalog.pg_notify(TG_TABLE_SCHEMA OPERATOR(pg_catalog.||) '_events', '');
    RETURN NULL;
END
$$;

REVOKE EXECUTE ON FUNCTION {{schema}}.notify_event_watchers_at_commit() FROM PUBLIC;

-- 0015's statement trigger notified from inside the transaction, however
-- long it still had to run; it goes.
DROP TRIGGER events_notify_watchers ON {{schema}}.events;
DROP FUNCTION {{schema}}.notify_event_watchers();

-- Deferred to the commit, and queued once per transaction: the WHEN runs
-- for every inserted row (two built-in calls, no function of ours) and is
-- true only for the first of the transaction, marking it in a
-- transaction-local setting. A savepoint rolled back takes back both the
-- mark and the queued call, so the next insert queues it again. A session
-- that runs SET CONSTRAINTS ALL IMMEDIATE gets the decision at its first
-- insert instead; one that sets the setting itself silences its own
-- transactions' notifications, nobody else's.
CREATE CONSTRAINT TRIGGER events_notify_watchers AFTER INSERT ON {{schema}}.events
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (coalesce(pg_catalog.current_setting({{events_notify_guc}}, true), '') OPERATOR(pg_catalog.<>) 'queued'
          AND pg_catalog.set_config({{events_notify_guc}}, 'queued', true) OPERATOR(pg_catalog.=) 'queued')
    EXECUTE FUNCTION {{schema}}.notify_event_watchers_at_commit();
