package main

import (
	"context"
	"errors"

	"github.com/pgwake/pgwake/internal/bench"
	"github.com/pgwake/pgwake/internal/bench/streambench"
)

func init() {
	register(command{
		name:    "bench",
		summary: "measure pgwake: drain, latency, idle, delayed, enqueue, scale, scheduled, housekeeping and queues",
		usage: `Usage: pgwake bench [--modes LIST] [--json] [--runs N] [size flags] [flags]

Runs pgwake's benchmark modes and prints a table (or, with --json, one JSON
object per mode with mode, system, jobs, jobs_per_sec, p50_ms, p90_ms,
p99_ms, max_ms, duplicates, missing and mode-specific extras). Every mode
checks that each job was handled exactly once.

  drain    N jobs pre-inserted with EnqueueMany, then workers start: jobs/s
  latency  one job per transaction at --rate for --duration from
           --latency-producers concurrent producers (default
           max(4, ceil(rate/250))): enqueue commit to handler start,
           p50/p90/p99/max
  idle     one job every --idle-interval: the same latency
  delayed  --delayed-jobs jobs with run_after spread over --delayed-spread:
           lateness of handler start against run_after
  enqueue  --producers concurrent producers, one job per transaction, no
           workers, against a plain one-row INSERT baseline in the same run;
           run twice: pgwake (the Go client) and pgwake-sql (SELECT
           <schema>.enqueue(...) through pgx, the SQL API of docs/sql.md)
  scale    drain of --scale-small vs --scale-large pending jobs, and of
           --scale-small with --scale-finished finished jobs in the table
  concurrent --concurrent-jobs jobs whose handlers each sleep
           --concurrent-sleep, all allowed at once, on a pool of
           --concurrent-pool connections: jobs/s and the fraction of the
           ideal (jobs / sleep per second)
  stream   (only when named; needs NATS JetStream at --nats-url) a drain of
           --stream-jobs jobs while the event stream forwards to JetStream:
           commit-to-broker p50/p90/p99/max, the queue's events/s, max slot
           lag, then the forwarder's events/s on a backlog of the same
           events (forward_events_per_sec, capacity_ratio)
  scheduled
           latency (--rate, --duration) on an empty queue, then with
           --scheduled-jobs jobs scheduled 1h-7d ahead in the same queue,
           then with those and --scheduled-failed failed jobs kept by
           retention (finished 1-6 days ago): p99_ratio (target <= 1.2)
  housekeeping
           retention (under statement_timeout 50ms) and events prune, time
           per batch with --housekeeping-small and --housekeeping-large
           finished jobs and events kept, --housekeeping-expired deleted:
           retention_ratio and prune_ratio (target <= 1.5); jobs/s is
           retention's deleted jobs per second

pgwake runs with queue.Config defaults; only the queue ("bench",
MaxWorkers --workers) and a no-op handler are set. pgwake-leased is the
same in leased mode (Config.LeasedKinds); it runs drain, latency, idle,
delayed and concurrent (held mode, which holds a connection per running
job, skips concurrent). Each mode works in a
fresh schema pgwake_bench_<n> that it drops afterwards. With no database URL
(--database-url, PGWAKE_DATABASE_URL, DATABASE_URL) it starts a throwaway
PostgreSQL with fsync on and removes it at the end.

River and watermill-sql run the same modes from the separate module in
bench/peers: cd bench/peers && go run . (see docs/benchmarks.md).

Example:
  pgwake bench
  pgwake bench --modes latency,idle --runs 3
  pgwake bench --modes stream --runs 3
  pgwake bench --modes scale --scale-large 1000000 --scale-finished 1000000 --json
  pgwake bench --modes scheduled,housekeeping --runs 3`,
		run: runBench,
	})
}

func runBench(ctx context.Context, env *cliEnv, args []string) error {
	fs := env.flags()
	options := bench.Flags(fs)
	natsURL := fs.String("nats-url", "nats://127.0.0.1:4222", "stream: the NATS JetStream server the event stream forwards to")
	if err := env.parseNoArgs(fs, args); err != nil {
		return err
	}
	opts, err := options()
	if err != nil {
		return usagef("%v", err)
	}
	opts.Out, opts.Log = env.stdout, env.stderr
	opts.OnCluster = env.onHardStop
	opts.Stream = streambench.Mode(*natsURL)
	if u, err := env.resolveURL(); err == nil {
		opts.DatabaseURL = u
	}
	// The enqueue mode also runs pgwake-sql: the same jobs through the SQL
	// API's enqueue function (docs/sql.md).
	_, err = bench.Run(ctx, opts, &bench.Pgwake{}, &bench.Pgwake{Leased: true}, &bench.Pgwake{SQL: true})
	if errors.Is(err, bench.ErrInvalidOptions) {
		return usagef("%v", err)
	}
	return err
}
