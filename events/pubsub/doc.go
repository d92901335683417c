// Package pubsub is pgwake as a Watermill Pub/Sub: a message.Publisher and a
// message.Subscriber backed by the pgwake queue (package queue), woken by
// LISTEN/NOTIFY instead of polling.
//
// Publishing enqueues one job per message and per consumer group of the
// topic, in one statement: Publisher.PublishTx (or Publisher.WithTx) does it
// in the caller's pgx.Tx, which is the outbox pattern without a relay. The
// message UUID, metadata and payload (arbitrary bytes) are kept exactly.
//
// Subscribing runs a queue worker for the topic's queue: a claim with FOR
// UPDATE SKIP LOCKED, in a transaction that stays open until the message is
// acknowledged. Ack completes the job and commits whatever the handler wrote
// through TxFromContext(msg.Context()); Nack rolls that back and makes the
// message redeliverable after SubscriberConfig.RetryPolicy (default
// NackBackoff), or on its last attempt sends it to
// SubscriberConfig.PoisonTopic. SubscriberConfig.Leased holds no transaction
// while a message is out. A message with Watermill's delay metadata is
// delivered when due.
//
// Topics and consumer groups map to queue names by QueueName; see
// docs/watermill.md for the rule, the consumer-group semantics and the
// delivery guarantees (at-least-once; order only for one subscriber without
// Nacks). The tables and the publish function come from package migrations
// (0003, 0016).
//
// The core queue package does not import this one.
package pubsub
