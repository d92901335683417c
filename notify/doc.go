// Package notify runs one dedicated LISTEN connection per process and fans
// notifications out to subscribers by channel.
//
// The connection is opened directly (not taken from a pool, so it works behind
// PgBouncer when given a direct URL). When it drops, the Listener reconnects
// with exponential backoff and jitter, LISTENs on every subscribed channel
// again and then sends every subscriber a Resync event: notifications may have
// been missed while it was down, so a subscriber should look at the database
// at once. When idle it pings, so a dead connection is noticed even when no
// notification is due.
//
// Notifications are hints. A subscriber must stay correct if one is lost; it
// only gets slower.
package notify
