-- Periodic jobs and paused queues.
-- {{schema}} is replaced by the quoted schema name.

-- One row per periodic schedule (queue.Config.Periodic, by name). last_slot
-- is the latest slot accounted for: enqueued (its job may still be waiting
-- for its run_after) or skipped. Every client that runs the schedule
-- advances it with a conditional UPDATE (WHERE last_slot is what it read) in
-- the transaction that enqueues the slot's job, so each slot gets exactly
-- one job however many processes run the schedule. spec, kind and queue
-- are informational (pgwake periodic list), written by the running clients.
CREATE TABLE {{schema}}.periodic (
    name       text        PRIMARY KEY,
    spec       text        NOT NULL,
    kind       text        NOT NULL,
    queue      text        NOT NULL,
    last_slot  timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- A queue is paused while it has a row here: workers claim none of its jobs;
-- enqueues still go in. Workers learn of a change from a NOTIFY on the wake
-- channel, or from their poll.
CREATE TABLE {{schema}}.paused_queues (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);
