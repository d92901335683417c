// Package queue is pgwake's job queue: transactional enqueue with a wake-up
// NOTIFY, workers woken by LISTEN that claim with FOR UPDATE SKIP LOCKED,
// retries with exponential backoff, and a poll fallback.
//
// A job exists exactly when the transaction that enqueued it commits:
// EnqueueTx inserts the job, appends its "enqueued" event and sends the
// wake-up in the caller's transaction.
//
// A worker claims a job in a transaction that stays open while the handler
// runs and hands that transaction to the handler. The handler's writes commit
// atomically with the job's completion; if the process dies, PostgreSQL rolls
// everything back and the job is claimable again. There is no "running" state
// to get stuck in, so no rescuer is needed.
//
// A failed attempt (error, panic, timeout, unknown kind) rolls back the
// handler's writes, then records the attempt: attempts+1, the error
// (truncated), run_after = now + Backoff(attempt) and a retry_scheduled event,
// or state failed with a failed event after the last attempt.
//
// Every state change appends a row to the events table in the same
// transaction.
package queue
