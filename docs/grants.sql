-- pgwake least-privilege grants (tested by internal/reliability TestLeastPrivilege*).
--
-- Run as the owner of pgwake's schema (the role that ran `pgwake migrate`),
-- after the migrations, replacing:
--   {{schema}}       pgwake's schema (default pgwake)
--   {{app_role}}     the role of workers and producers: LOGIN, nothing else
--   {{stream_role}}  the role of the event stream: LOGIN REPLICATION
--   {{producer_role}} a role that only enqueues, through the SQL API
--                    (docs/sql.md): EXECUTE on its functions, no table privilege
-- No role is a superuser, owns anything or may run DDL.

-- Workers and producers (package queue, `pgwake worker`, `pgwake enqueue`).
GRANT USAGE ON SCHEMA {{schema}} TO {{app_role}};
-- DELETE: workers delete finished jobs past their retention (queue.Retention).
GRANT SELECT, INSERT, UPDATE, DELETE ON {{schema}}.jobs TO {{app_role}};
GRANT INSERT ON {{schema}}.events TO {{app_role}};
GRANT SELECT, INSERT, UPDATE, DELETE ON {{schema}}.waiters TO {{app_role}};
GRANT USAGE ON SEQUENCE {{schema}}.jobs_id_seq, {{schema}}.events_id_seq TO {{app_role}};
-- Attempt records (see docs/semantics.md): written before a batch's
-- handlers run, deleted with the outcome.
GRANT SELECT, INSERT, UPDATE, DELETE ON {{schema}}.attempts TO {{app_role}};
-- The wake lock's salt: only roles that can read it can take the lock.
GRANT SELECT ON {{schema}}.wake_salt TO {{app_role}};
GRANT EXECUTE ON FUNCTION {{schema}}.wake_needed(text), {{schema}}.wake_lock_key(text) TO {{app_role}};
-- The SQL API (migration 0008): the Go client enqueues, cancels and retries
-- through it.
GRANT EXECUTE ON FUNCTION
    {{schema}}.enqueue_jobs(text[], jsonb[], text[], timestamptz[], interval[], integer[], integer[], text[], integer),
    {{schema}}.enqueue(text, jsonb, text, timestamptz, interval, integer, integer, text),
    {{schema}}.enqueue_many(jsonb),
    {{schema}}.cancel_jobs(bigint[]),
    {{schema}}.cancel(bigint),
    {{schema}}.retry(bigint)
TO {{app_role}};
-- Watermill Pub/Sub (package events/pubsub) on top of the queue.
GRANT SELECT, INSERT, DELETE ON {{schema}}.watermill_subscriptions TO {{app_role}};

-- Event stream (package events, `pgwake events`). The publication is
-- created once by the table owner (events.EnsurePublication, or
-- `CREATE PUBLICATION <schema>_events FOR TABLE <schema>.events WITH (publish = 'insert')`);
-- the stream role then only needs REPLICATION (given at CREATE ROLE) and:
GRANT USAGE ON SCHEMA {{schema}} TO {{stream_role}};
GRANT SELECT ON {{schema}}.events TO {{stream_role}};

-- Producers in any language (docs/sql.md): the enqueue functions run as their
-- owner (SECURITY DEFINER, search_path pinned), so this role needs no table,
-- sequence or other function privilege. It cannot read, cancel or retry jobs.
GRANT USAGE ON SCHEMA {{schema}} TO {{producer_role}};
GRANT EXECUTE ON FUNCTION
    {{schema}}.enqueue(text, jsonb, text, timestamptz, interval, integer, integer, text),
    {{schema}}.enqueue_many(jsonb),
    {{schema}}.enqueue_jobs(text[], jsonb[], text[], timestamptz[], interval[], integer[], integer[], text[], integer)
TO {{producer_role}};
