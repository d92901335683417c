// Package bench measures job queues on PostgreSQL: pgwake, and through the
// System interface any peer (River and watermill-sql in the bench/peers
// module). It is the logic behind `pgwake bench` and the peers program.
//
// Every mode runs one System on a fresh, empty queue and verifies that each
// job was handled exactly once: handlers report the sequence number carried in
// the job's payload, and the result counts duplicates and missing jobs.
//
// Modes:
//
//   - drain: N jobs pre-inserted in bulk, then workers start; jobs/s until
//     every job is handled and (where the system can tell) finished.
//   - latency: one job per transaction at a steady rate (default 200/s for
//     10 s); enqueue-commit to handler start, p50/p90/p99/max. Both times are
//     taken in this process with the same monotonic clock: the producer's
//     just after its commit returns, the handler's at its first line.
//   - idle: the latency mode at one job every 500 ms.
//   - delayed: 200 jobs with run_after spread over 10 s, inserted in one
//     batch while workers run; lateness of handler start against run_after.
//   - enqueue: P concurrent producers (default 16), one job per transaction,
//     no workers; alternated with a plain one-row INSERT into a table of the
//     same columns (the baseline), reported as a ratio.
//   - scale: drain of a small backlog, of a large backlog, and of the small
//     backlog with many finished jobs left in the table.
//
// Results are printed as a table, or as one JSON object per mode and system.
// With several systems Run also prints pgwake/peer ratios, a latency chart
// and the targets, met or not.
//
// The public package github.com/pgwake/pgwake/bench/harness re-exports what
// the separate peers module needs; it carries no compatibility promise.
package bench
