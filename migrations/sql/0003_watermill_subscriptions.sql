-- Watermill Pub/Sub (package events/pubsub): the consumer groups registered
-- per topic. Publish enqueues one job per registered group of the topic, on
-- the group's queue. A row is written by Subscribe / SubscribeInitialize and
-- removed only by RemoveGroup (or by hand).

CREATE TABLE {{schema}}.watermill_subscriptions (
    topic          text        NOT NULL,
    consumer_group text        NOT NULL,
    queue          text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, consumer_group),
    -- Queue names carry a 64-bit hash of (topic, group): a collision is
    -- refused here instead of mixing two groups' messages.
    UNIQUE (queue)
);
