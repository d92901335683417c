-- pgwake least-privilege grants, one role per job (tested by
-- internal/reliability TestLeastPrivilege* and TestRoles*; what each role can
-- and cannot do is in docs/security.md).
--
-- Run as the owner of pgwake's schema (the role that ran `pgwake migrate`),
-- after the migrations, replacing:
--   {{schema}}         pgwake's schema (default pgwake)
--   {{producer_role}}  enqueues: queue.Client.Enqueue*, `pgwake enqueue`,
--                      events/pubsub publishers
--   {{worker_role}}    runs workers: queue.Client.Run, `pgwake worker`,
--                      events/pubsub subscribers; its handlers may enqueue
--   {{operator_role}}  the CLI's reports and repairs: `pgwake stats`,
--                      `jobs list/show/retry/cancel/prune`,
--                      `events replay/verify/prune`
--   {{stream_role}}    the event stream (`pgwake events tail/forward`):
--                      created LOGIN REPLICATION; see docs/security.md for
--                      what REPLICATION lets it read
--   {{sql_producer_role}} enqueues through the SQL API only (docs/sql.md):
--                      EXECUTE on its enqueue functions, no table privilege
-- No role is a superuser, owns anything or may run DDL. One role may take
-- several parts (replace several placeholders by it); it then holds the union.
--
-- Columns are granted one by one where a role needs only some: a producer
-- sets only what NewJob sets (not state, attempts, last_error or created_at)
-- and reads only what enqueue returns (not payloads or errors); a worker
-- updates only the columns of an attempt's outcome.

-- Producers.
GRANT USAGE ON SCHEMA {{schema}} TO {{producer_role}};
GRANT INSERT (queue, kind, payload, priority, run_after, max_attempts, unique_key) ON {{schema}}.jobs TO {{producer_role}};
-- What enqueue returns, and the holder of a unique key.
GRANT SELECT (id, queue, kind, run_after, unique_key, state) ON {{schema}}.jobs TO {{producer_role}};
-- The 'enqueued' event, written in the enqueue's statement.
GRANT INSERT (job_id, type, queue, kind, attempt, data) ON {{schema}}.events TO {{producer_role}};
GRANT USAGE ON SEQUENCE {{schema}}.jobs_id_seq, {{schema}}.events_id_seq TO {{producer_role}};
-- wake_needed (SECURITY INVOKER) reads the salt of its lock key and looks
-- for an idle worker; producers only read the waiters table.
GRANT SELECT ON {{schema}}.wake_salt, {{schema}}.waiters TO {{producer_role}};
GRANT EXECUTE ON FUNCTION {{schema}}.wake_needed(text) TO {{producer_role}};
-- Watermill Pub/Sub publishers fan out to the consumer groups' queues.
GRANT SELECT ON {{schema}}.watermill_subscriptions TO {{producer_role}};

-- Workers.
GRANT USAGE ON SCHEMA {{schema}} TO {{worker_role}};
-- DELETE: workers delete finished jobs past their retention (queue.Retention).
GRANT SELECT, DELETE ON {{schema}}.jobs TO {{worker_role}};
GRANT INSERT (queue, kind, payload, priority, run_after, max_attempts, unique_key) ON {{schema}}.jobs TO {{worker_role}};
GRANT UPDATE (state, attempts, last_error, run_after, finished_at, lease_expires_at, leased_by) ON {{schema}}.jobs TO {{worker_role}};
GRANT INSERT (job_id, type, queue, kind, attempt, data) ON {{schema}}.events TO {{worker_role}};
GRANT USAGE ON SEQUENCE {{schema}}.jobs_id_seq, {{schema}}.events_id_seq TO {{worker_role}};
-- Idle marks and heartbeats; attempt records (docs/semantics.md), written
-- before a batch's handlers run, deleted with the outcome.
GRANT SELECT, INSERT, UPDATE, DELETE ON {{schema}}.waiters, {{schema}}.attempts TO {{worker_role}};
-- The wake lock's salt: only roles that can read it can take the lock.
GRANT SELECT ON {{schema}}.wake_salt TO {{worker_role}};
GRANT EXECUTE ON FUNCTION {{schema}}.wake_needed(text), {{schema}}.wake_lock_key(text) TO {{worker_role}};
-- Watermill Pub/Sub subscribers register their consumer group.
GRANT SELECT, INSERT, DELETE ON {{schema}}.watermill_subscriptions TO {{worker_role}};
-- Periodic schedules (queue.Config.Periodic, worker --periodic): each
-- running worker registers its schedules and moves their last slot; every
-- worker reads which queues are paused.
GRANT SELECT, INSERT, UPDATE ON {{schema}}.periodic TO {{worker_role}};
GRANT SELECT ON {{schema}}.paused_queues TO {{worker_role}};
-- Start checks that the schema has every migration this version needs
-- (without it: a warning at every start, and no check).
GRANT SELECT ON {{schema}}.schema_migrations TO {{worker_role}};
-- Retention deletes unique keys whose period has passed (docs/unique.md);
-- UPDATE on one column for its FOR UPDATE SKIP LOCKED, which writes nothing.
GRANT SELECT, DELETE, UPDATE (held_until) ON {{schema}}.unique_periods TO {{worker_role}};

-- Operators.
GRANT USAGE ON SCHEMA {{schema}} TO {{operator_role}};
-- retry, cancel; prune (finished jobs).
GRANT SELECT, DELETE ON {{schema}}.jobs TO {{operator_role}};
GRANT UPDATE (state, run_after, finished_at, max_attempts, lease_expires_at) ON {{schema}}.jobs TO {{operator_role}};
-- The 'retried' and 'cancelled' events; replay, verify, prune.
GRANT SELECT, DELETE ON {{schema}}.events TO {{operator_role}};
-- prune records the highest id it deleted; `pgwake ui` reads it (migration 0025,
-- which gives the same to roles granted DELETE / SELECT on events before it:
-- TestEventsPrunedKeepsEventGrants).
GRANT SELECT, INSERT, UPDATE ON {{schema}}.events_pruned TO {{operator_role}};
GRANT INSERT (job_id, type, queue, kind, attempt, data) ON {{schema}}.events TO {{operator_role}};
GRANT USAGE ON SEQUENCE {{schema}}.events_id_seq TO {{operator_role}};
-- Cancel deletes the attempt records of the jobs it cancels.
GRANT SELECT, DELETE ON {{schema}}.attempts TO {{operator_role}};
-- `pgwake queues pause|resume|list`, the state in `pgwake stats`,
-- `pgwake periodic list`.
GRANT SELECT, INSERT, DELETE ON {{schema}}.paused_queues TO {{operator_role}};
GRANT SELECT ON {{schema}}.periodic TO {{operator_role}};
-- `pgwake jobs prune` deletes expired unique periods too.
GRANT SELECT, DELETE, UPDATE (held_until) ON {{schema}}.unique_periods TO {{operator_role}};
-- `pgwake ui` registers itself as a watcher of the event log (a heartbeat
-- row) so that transactions writing events NOTIFY it. The trigger that
-- looks for watchers (migration 0017) runs as the schema's owner: roles
-- that only write events need nothing on event_watchers.
GRANT SELECT, INSERT, UPDATE, DELETE ON {{schema}}.event_watchers TO {{operator_role}};

-- Event stream. The publication is created once by the table owner
-- (events.EnsurePublication, or
-- `CREATE PUBLICATION <schema>_events FOR TABLE <schema>.events WITH (publish = 'insert')`);
-- the stream role then only needs REPLICATION (given at CREATE ROLE) and:
GRANT USAGE ON SCHEMA {{schema}} TO {{stream_role}};
GRANT SELECT ON {{schema}}.events TO {{stream_role}};

-- The SQL API (migration 0008, docs/sql.md). Its functions run as their
-- owner (SECURITY DEFINER, search_path pinned). The Go client enqueues,
-- cancels and retries through it. The SQL-only
-- producer needs no table, sequence or other function privilege: it cannot
-- read, cancel or retry jobs. It can pass its own payload_limit to
-- enqueue_one and enqueue_jobs (NULL: no size limit), and a unique key's
-- enqueue tells it the id of the job holding the key (docs/sql.md,
-- "Privileges").
GRANT USAGE ON SCHEMA {{schema}} TO {{sql_producer_role}};
-- (Migration 0014 recreated the enqueue functions with the unique scope,
-- hold and period parameters, copying the grants they had. Migration 0021
-- added enqueue_one, which the Go client and enqueue() call for one job
-- without a unique key, granting it to every role that could then call
-- enqueue_jobs.)
GRANT EXECUTE ON FUNCTION
    {{schema}}.enqueue(text, jsonb, text, timestamptz, interval, integer, integer, text, text, text, interval, jsonb),
    {{schema}}.enqueue_many(jsonb),
    {{schema}}.enqueue_jobs(text[], jsonb[], text[], timestamptz[], interval[], integer[], integer[], text[], integer, text[], text[], interval[], jsonb[]),
    {{schema}}.enqueue_one(text, jsonb, text, timestamptz, interval, integer, integer, jsonb, integer)
TO {{producer_role}}, {{worker_role}}, {{sql_producer_role}};
-- Workers cancel through it too (CancelTx from a handler, the skipped jobs
-- of a batch).
GRANT EXECUTE ON FUNCTION
    {{schema}}.cancel_jobs(bigint[]),
    {{schema}}.cancel(bigint)
TO {{worker_role}}, {{operator_role}};
GRANT EXECUTE ON FUNCTION {{schema}}.retry(bigint) TO {{operator_role}};
-- The Watermill publisher (migration 0016) publishes through one function
-- that reads the topic's consumer groups and enqueues: producers, and
-- workers whose subscribers publish to a poison topic. (Migration 0018
-- replaced its body, same signature: the grant stays.)
GRANT EXECUTE ON FUNCTION
    {{schema}}.watermill_publish(text, text, text, jsonb[], timestamptz[], integer, integer)
TO {{producer_role}}, {{worker_role}};
