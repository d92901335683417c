package main

import (
	"context"
	"errors"
	"flag"

	"github.com/pgwake/pgwake/internal/bench"
)

func init() {
	register(command{
		name:    "bench",
		summary: "measure pgwake: drain, latency, idle, delayed, enqueue and scale",
		usage: `Usage: pgwake bench [--modes LIST] [--json] [--runs N] [size flags] [flags]

Runs pgwake's benchmark modes and prints a table (or, with --json, one JSON
object per mode with mode, system, jobs, jobs_per_sec, p50_ms, p90_ms,
p99_ms, max_ms, duplicates, missing and mode-specific extras). Every mode
checks that each job was handled exactly once.

  drain    N jobs pre-inserted with EnqueueMany, then workers start: jobs/s
  latency  one job per transaction at --rate for --duration: enqueue commit
           to handler start, p50/p90/p99/max
  idle     one job every --idle-interval: the same latency
  delayed  --delayed-jobs jobs with run_after spread over --delayed-spread:
           lateness of handler start against run_after
  enqueue  --producers concurrent producers, one job per transaction, no
           workers, against a plain one-row INSERT baseline in the same run
  scale    drain of --scale-small vs --scale-large pending jobs, and of
           --scale-small with --scale-finished finished jobs in the table

pgwake runs with queue.Config defaults; only the queue ("bench",
MaxWorkers --workers) and a no-op handler are set. Each mode works in a
fresh schema pgwake_bench_<n> that it drops afterwards. With no database URL
(--database-url, PGWAKE_DATABASE_URL, DATABASE_URL) it starts a throwaway
PostgreSQL with fsync on and removes it at the end.

River and watermill-sql run the same modes from the separate module in
bench/peers: cd bench/peers && go run . (see docs/benchmarks.md).

Example:
  pgwake bench
  pgwake bench --modes latency,idle --runs 3
  pgwake bench --modes scale --scale-large 1000000 --scale-finished 1000000 --json`,
		run: runBench,
	})
}

func runBench(ctx context.Context, env *cliEnv, args []string) error {
	fs := env.flags()
	var (
		modes string
		opts  bench.Options
		s     bench.Sizes
	)
	d := bench.DefaultSizes()
	fs.StringVar(&modes, "modes", "all", "comma-separated modes: drain, latency, idle, delayed, enqueue, scale, or all")
	fs.BoolVar(&opts.JSON, "json", false, "print one JSON object per mode instead of a table")
	fs.IntVar(&opts.Runs, "runs", 1, "repeat every mode this many times and report the medians")
	fs.IntVar(&opts.Workers, "workers", 10, "jobs run at once (the bench queue's MaxWorkers; pgwake's default is 10)")
	fs.StringVar(&opts.SVG, "svg", "", "also write the latency chart as SVG to this file")
	fs.IntVar(&s.DrainJobs, "jobs", d.DrainJobs, "drain: jobs pre-inserted")
	fs.Float64Var(&s.Rate, "rate", d.Rate, "latency: jobs per second")
	fs.DurationVar(&s.LatencyDuration, "duration", d.LatencyDuration, "latency: how long to produce")
	fs.DurationVar(&s.IdleInterval, "idle-interval", d.IdleInterval, "idle: time between jobs")
	fs.DurationVar(&s.IdleDuration, "idle-duration", d.IdleDuration, "idle: how long to produce")
	fs.IntVar(&s.DelayedJobs, "delayed-jobs", d.DelayedJobs, "delayed: how many jobs")
	fs.DurationVar(&s.DelayedSpread, "delayed-spread", d.DelayedSpread, "delayed: span of their run_after times")
	fs.IntVar(&s.Producers, "producers", d.Producers, "enqueue: concurrent producers")
	fs.DurationVar(&s.EnqueueDuration, "enqueue-duration", d.EnqueueDuration, "enqueue: total time, half on the baseline")
	fs.IntVar(&s.ScaleSmall, "scale-small", d.ScaleSmall, "scale: the small backlog")
	fs.IntVar(&s.ScaleLarge, "scale-large", d.ScaleLarge, "scale: the large backlog (the issue's target names 1000000)")
	fs.IntVar(&s.ScaleFinished, "scale-finished", d.ScaleFinished, "scale: finished jobs left in the table for the third case (0 skips it)")
	fs.IntVar(&s.BatchSize, "batch", d.BatchSize, "jobs per EnqueueMany call when pre-inserting")
	fs.DurationVar(&s.IdleTimeout, "idle-timeout", d.IdleTimeout, "give up when no job has started for this long")
	if err := env.parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	// Zero means "default" in bench.Options and Sizes; on the command line
	// it is a mistake (except --scale-finished 0: skip that case).
	var zero string
	fs.Visit(func(f *flag.Flag) {
		if v := f.Value.String(); zero == "" && f.Name != "scale-finished" && (v == "0" || v == "0s") {
			zero = f.Name
		}
	})
	if zero != "" {
		return usagef("--%s must be positive", zero)
	}
	ms, err := bench.ParseModes(modes)
	if err != nil {
		return usagef("--modes: %v", err)
	}
	if s.ScaleFinished == 0 {
		s.ScaleFinished = -1 // flag 0 means "skip"; Sizes 0 means "default"
	}
	opts.Modes, opts.Sizes = ms, s
	opts.Out, opts.Log = env.stdout, env.stderr
	opts.OnCluster = env.onHardStop
	if u, err := env.resolveURL(); err == nil {
		opts.DatabaseURL = u
	}
	_, err = bench.Run(ctx, opts, &bench.Pgwake{})
	var bad = []error{bench.ErrInvalidOptions, bench.ErrInvalidSizes, bench.ErrUnknownMode}
	for _, b := range bad {
		if errors.Is(err, b) {
			return usagef("%v", err)
		}
	}
	return err
}
