package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/internal/termsafe"
	"github.com/pgwake/pgwake/queue"
)

func init() {
	register(command{
		name:    "stats",
		summary: "show per-queue counts: pending, scheduled, running, failed, done in the last minute",
		usage: `Usage: pgwake stats [--json] [--watch [--interval D]] [flags]

Per queue:
  pending    due jobs waiting for a worker
  scheduled  pending jobs not due yet (delayed, or waiting for a retry)
  running    jobs claimed right now (their claim transaction is open)
  failed     jobs whose attempts ran out (see pgwake jobs retry)
  done/1m    jobs that succeeded in the last minute
  oldest     age of the oldest due job still waiting
  state      active, or paused (pgwake queues pause)
Queues with no pending, failed or recently finished job are not listed,
unless paused.

Each count is exact up to --exact-limit jobs per queue (default 10000);
above it, it is the planner's estimate from the table's statistics, shown
as ~N (in --json, named in "estimated"). The cost grows with the limit and
the number of queues, not with the number of jobs. "running" is leased jobs
plus held attempts in flight (their attempt records).

With --json, prints one document:
  {"queues":[{"queue":"default","pending":0,"scheduled":0,"running":0,"failed":0,
   "succeeded_last_minute":0,"oldest_pending_age_seconds":0,"paused":false,
   "estimated":["pending"]}]}
("estimated" is left out when every count is exact.)
With --watch, prints again every --interval until interrupted.

Example:
  pgwake stats --watch --interval 1s`,
		run: runStats,
	})
}

// statsDoc is the --json document.
type statsDoc struct {
	Queues []queue.QueueStat `json:"queues"`
}

// collectStats is the read API's QueueStats on schema.
func collectStats(ctx context.Context, pool *pgxpool.Pool, schema string, exactLimit int) ([]queue.QueueStat, error) {
	client, err := queue.New(pool, queue.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	st, err := client.QueueStats(ctx, queue.QueueStatsParams{ExactLimit: exactLimit})
	if err != nil {
		return nil, explainSchemaError(fmt.Errorf("read stats: %w", err), schema)
	}
	return st, nil
}

func runStats(ctx context.Context, env *cliEnv, args []string) error {
	fs := env.flags()
	asJSON := fs.Bool("json", false, "print one JSON document instead of a table")
	watch := fs.Bool("watch", false, "print again every --interval until interrupted")
	interval := fs.Duration("interval", 2*time.Second, "refresh interval for --watch")
	exact := fs.Int("exact-limit", queue.DefaultExactLimit, "count each number exactly up to this many jobs per queue; above it, show the planner's estimate (-1: count everything)")
	if err := env.parseNoArgs(fs, args); err != nil {
		return err
	}
	if *exact < -1 {
		return usagef("--exact-limit %d: use -1 (no limit) or a count", *exact)
	}
	if *interval < 100*time.Millisecond {
		return usagef("--interval %s is below 100ms", *interval)
	}
	pool, err := env.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	for {
		st, err := collectStats(ctx, pool, env.schema, *exact)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if *asJSON {
			if err := json.NewEncoder(termsafe.JSON(env.stdout)).Encode(statsDoc{Queues: st}); err != nil {
				return err
			}
		} else {
			if *watch {
				fmt.Fprintf(env.stdout, "%s\n", time.Now().Format("15:04:05"))
			}
			if err := printStatsTable(env.stdout, st); err != nil {
				return err
			}
		}
		if !*watch {
			return nil
		}
		if !*asJSON {
			fmt.Fprintln(env.stdout)
		}
		t := time.NewTimer(*interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

func printStatsTable(w io.Writer, st []queue.QueueStat) error {
	if len(st) == 0 {
		_, err := fmt.Fprintln(w, "no jobs pending, failed or finished in the last minute")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tPENDING\tSCHEDULED\tRUNNING\tFAILED\tDONE/1m\tOLDEST\tSTATE")
	for _, s := range st {
		oldest := "-"
		if s.Pending > 0 {
			oldest = roundDuration(time.Duration(s.OldestPendingAgeSec * float64(time.Second))).String()
		}
		state := "active"
		if s.Paused {
			state = "paused"
		}
		n := func(name string, v int64) string {
			if slices.Contains(s.Estimated, name) {
				return "~" + strconv.FormatInt(v, 10)
			}
			return strconv.FormatInt(v, 10)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", termsafe.Text(s.Queue, false), n("pending", s.Pending), n("scheduled", s.Scheduled),
			s.Running, n("failed", s.Failed), n("succeeded_last_minute", s.SucceededLastMinute), oldest, state)
	}
	return tw.Flush()
}
