package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/internal/demo"
	"github.com/pgwake/pgwake/internal/pgcluster"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
)

func init() {
	register(command{
		name:    "demo",
		summary: "run a mixed workload end to end on a throwaway PostgreSQL and summarise it",
		usage: `Usage: pgwake demo [--jobs N] [--rate R] [--metrics-addr ADDR] [flags]

Shows pgwake working, start to finish, in about 15-30 seconds:
  1. With no database URL (--database-url, PGWAKE_DATABASE_URL, DATABASE_URL)
     it starts a throwaway PostgreSQL from the local server binaries (as OS
     user postgres when run as root) and removes it on exit, Ctrl-C included.
     With a URL it works in a fresh schema pgwake_demo_<random> and drops it.
  2. Migrates, starts workers on queues "default" and "critical" and the
     metrics endpoint (/metrics, /healthz).
  3. Enqueues --jobs jobs at about --rate per second: quick jobs, slower
     reports, jobs delayed by 1-5 s, flaky jobs that fail once or twice and
     are retried (backoff 250 ms, doubling), and broken jobs that fail all
     3 attempts. Every successful handler also inserts a row in the claim
     transaction, to show exactly-once effects.
  4. Shows a progress bar, then a summary: jobs/s, latency from due time to
     handler start (p50/p90/p99/max and a histogram), retries, failures,
     claims by what woke the worker (NOTIFY or the poll fallback), and the
     effect rows counted against succeeded jobs.

Example:
  make demo
  pgwake demo --jobs 5000 --rate 1000`,
		run: runDemo,
	})
}

// demoSchemaPrefix names the fresh schema a demo against a given database
// works in (dropped at the end).
const demoSchemaPrefix = "pgwake_demo_"

type demoOptions struct {
	jobs        int
	rate        float64
	metricsAddr string
	concurrency int
	timeout     time.Duration
}

func runDemo(ctx context.Context, env *cliEnv, args []string) error {
	o, err := parseDemoFlags(env, args)
	if err != nil {
		return err
	}
	schema := demoSchemaPrefix + randomSuffix()
	pool, cleanup, err := demoDatabase(ctx, env, schema, int32(o.concurrency+o.concurrency/2+4))
	defer cleanup()
	if err != nil {
		return err
	}
	if _, err := migrations.Up(ctx, pool, schema); err != nil {
		return err
	}
	reg := newRegistry()
	if !metricsOff(o.metricsAddr) {
		ms, err := listenMetrics(o.metricsAddr, reg, pool, env.log)
		if err != nil {
			fmt.Fprintf(env.stdout, "pgwake demo: %v (continuing without metrics)\n", err)
		} else {
			go ms.serve(env.log)
			defer ms.shutdown()
			fmt.Fprintf(env.stdout, "pgwake demo: metrics at http://%s/metrics while the demo runs\n", ms.addr)
		}
	}
	err = demo.Run(ctx, demo.Config{
		Pool: pool, Schema: schema,
		Jobs: o.jobs, Rate: o.rate, Concurrency: o.concurrency, Timeout: o.timeout,
		Out: env.stdout, Logger: env.log, Registry: reg,
	})
	if errors.Is(err, demo.ErrInterrupted) {
		return interruptedError(err.Error())
	}
	return err
}

// parseDemoFlags parses and checks the demo's flags.
func parseDemoFlags(env *cliEnv, args []string) (demoOptions, error) {
	fs := env.flags()
	var o demoOptions
	fs.IntVar(&o.jobs, "jobs", 1500, "how many jobs to enqueue")
	fs.Float64Var(&o.rate, "rate", 100, "jobs enqueued per second")
	fs.IntVar(&o.concurrency, "concurrency", 8, "workers for queue default (critical gets half)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", defaultMetricsAddr, "address for /metrics and /healthz while the demo runs; \"off\" to disable")
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "give up if the jobs have not all finished by then")
	// The demo logs only errors unless asked: the progress bar is the output.
	if os.Getenv(envLogLevel) == "" {
		args = append([]string{"--log-level", "error"}, args...)
	}
	if err := env.parseNoArgs(fs, args); err != nil {
		return o, err
	}
	if o.jobs < 1 || o.jobs > 1_000_000 {
		return o, usagef("--jobs %d is outside 1..1000000", o.jobs)
	}
	if o.rate <= 0 || math.IsInf(o.rate, 0) || math.IsNaN(o.rate) {
		return o, usagef("--rate must be positive")
	}
	if o.concurrency < 2 || o.concurrency > 1000 {
		return o, usagef("--concurrency %d is outside 2..1000", o.concurrency)
	}
	return o, nil
}

// demoDatabase opens a pool of maxConns on the database given, or on a
// throwaway cluster it starts. cleanup (never nil, to be called even on an
// error) drops the schema from a given database, or removes the cluster.
func demoDatabase(ctx context.Context, env *cliEnv, schema string, maxConns int32) (pool *pgxpool.Pool, cleanup func(), err error) {
	out := env.stdout
	mutate := func(c *pgxpool.Config) { c.MaxConns = maxConns }
	if u, err := env.resolveURL(); err == nil {
		fmt.Fprintf(out, "pgwake demo: using %s, schema %s (dropped at the end)\n", redactURL(u), schema)
		if pool, err = openPool(ctx, u, mutate); err != nil {
			return nil, func() {}, err
		}
		return pool, func() { dropDemoSchema(env, pool, schema) }, nil
	}
	binDir, err := pgcluster.FindBinDir()
	if err != nil {
		return nil, func() {}, fmt.Errorf("no database URL given (--database-url, PGWAKE_DATABASE_URL) and %w", err)
	}
	fmt.Fprintf(out, "pgwake demo: starting a throwaway PostgreSQL (binaries %s) ...\n", binDir)
	start := time.Now()
	cl, err := pgcluster.Start(ctx, pgcluster.Options{BinDir: binDir})
	if err != nil {
		if ctx.Err() != nil {
			return nil, func() {}, errors.New("interrupted")
		}
		return nil, func() {}, fmt.Errorf("start a throwaway PostgreSQL: %w", err)
	}
	env.onHardStop(func() { _ = cl.Stop() })
	stop := func() {
		if err := cl.Stop(); err != nil {
			fmt.Fprintf(env.stderr, "pgwake demo: removing the throwaway cluster: %v\n", err)
		} else {
			fmt.Fprintln(out, "pgwake demo: throwaway PostgreSQL stopped and removed")
		}
	}
	fmt.Fprintf(out, "pgwake demo: PostgreSQL ready on 127.0.0.1:%d in %s (removed on exit)\n", cl.Port, roundDuration(time.Since(start)))
	if pool, err = openPool(ctx, cl.URL, mutate); err != nil {
		return nil, stop, err
	}
	return pool, func() { pool.Close(); stop() }, nil
}

// dropDemoSchema drops the demo's schema from a given database and closes
// pool.
func dropDemoSchema(env *cliEnv, pool *pgxpool.Pool, schema string) {
	dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Sessions still ending (the listener, a worker's last statements) can
	// make the drop a deadlock victim: try again.
	var err error
	for try := 0; try < 5; try++ {
		if _, err = pool.Exec(dctx, `DROP SCHEMA IF EXISTS `+sqlident.Quote(schema)+` CASCADE`); err == nil || !isDeadlock(err) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		fmt.Fprintf(env.stderr, "pgwake demo: could not drop schema %s: %v\n", schema, err)
	}
	pool.Close()
}

func randomSuffix() string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 8)
	for i := range b {
		b[i] = letters[rand.IntN(len(letters))]
	}
	return string(b)
}

// isDeadlock reports whether err is PostgreSQL's deadlock_detected.
func isDeadlock(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "40P01"
}
