// Package events makes pgwake's event log useful outside the database.
//
// Every job state change appends a row to <schema>.events in the same
// transaction as the change (package queue does that). This package:
//
//   - defines the typed Event and its versioned JSON encoding, a public
//     contract documented in docs/events.md (Encode, Decode);
//   - streams the log out of PostgreSQL by logical replication (Stream): a
//     publication on the events table, a named persistent slot (pgoutput),
//     decoding of inserts, and acknowledgement of a WAL position only after
//     every event up to it was published to a Watermill message.Publisher.
//     Delivery is at-least-once, in commit order; each message carries the
//     event id and the commit LSN so consumers can drop duplicates;
//   - reads the log from the table (Read, Backfill) so a late consumer can
//     backfill and switch to the live stream without an undetectable gap or
//     duplicate;
//   - rebuilds the jobs' state from the log and compares it with the jobs
//     table (Verify);
//   - offers the operations side: slot listing and lag (Slots), DropSlot,
//     retention (DeleteBefore) and Prometheus metrics.
//
// The core queue package does not import this one: a user who only wants a
// queue does not pull in pglogrepl or Watermill.
package events
