package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/internal/sqlident"
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

"running" is exact and takes no lock: a pending row whose xmax is the
transaction id of a transaction still open (pg_locks) is held by a claim.
The query scans the pending jobs once and reads pg_locks once.

With --json, prints one document:
  {"queues":[{"queue":"default","pending":0,"scheduled":0,"running":0,"failed":0,
   "succeeded_last_minute":0,"oldest_pending_age_seconds":0,"paused":false}]}
With --watch, prints again every --interval until interrupted.

Example:
  pgwake stats --watch --interval 1s`,
		run: runStats,
	})
}

// queueStats is one queue's line of `pgwake stats`.
type queueStats struct {
	Queue               string  `json:"queue"`
	Pending             int64   `json:"pending"`
	Scheduled           int64   `json:"scheduled"`
	Running             int64   `json:"running"`
	Failed              int64   `json:"failed"`
	SucceededLastMinute int64   `json:"succeeded_last_minute"`
	OldestPendingAgeSec float64 `json:"oldest_pending_age_seconds"`
	Paused              bool    `json:"paused"`
}

// statsDoc is the --json document.
type statsDoc struct {
	Queues []queueStats `json:"queues"`
}

// statsSQL counts per queue. "running" is a leased job (state running), or a
// pending row locked by an open transaction (a held-mode claim): its xmax names a transaction that still holds the lock on its
// own transaction id (every transaction with an id holds one). When a claim
// transaction has already updated the row (the job is finishing), xmax is a
// multixact instead and the job is briefly counted as pending.
func statsSQL(schema string) string {
	jobs := sqlident.Quote(schema, "jobs")
	return `
WITH open_xacts AS MATERIALIZED (
	SELECT DISTINCT transactionid AS xid FROM pg_locks
	WHERE locktype = 'transactionid' AND transactionid IS NOT NULL
), pend AS (
	SELECT j.queue, j.run_after, j.run_after <= now() AS due, x.xid IS NOT NULL AS running
	FROM ` + jobs + ` j LEFT JOIN open_xacts x ON x.xid = j.xmax
	WHERE j.state = 'pending'
), agg AS (
	SELECT queue,
		count(*) FILTER (WHERE due AND NOT running) AS pending,
		count(*) FILTER (WHERE NOT due AND NOT running) AS scheduled,
		count(*) FILTER (WHERE running) AS running,
		0::bigint AS failed, 0::bigint AS succeeded,
		extract(epoch FROM now() - min(run_after) FILTER (WHERE due AND NOT running))::float8 AS oldest
	FROM pend GROUP BY queue
	UNION ALL
	SELECT queue, 0, 0, count(*), 0, 0, NULL FROM ` + jobs + ` WHERE state = 'running' GROUP BY queue
	UNION ALL
	SELECT queue, 0, 0, 0, count(*), 0, NULL FROM ` + jobs + ` WHERE state = 'failed' GROUP BY queue
	UNION ALL
	SELECT queue, 0, 0, 0, 0, count(*), NULL FROM ` + jobs + `
	WHERE state = 'succeeded' AND finished_at > now() - interval '1 minute' GROUP BY queue
)
SELECT queue, sum(pending)::bigint, sum(scheduled)::bigint, sum(running)::bigint,
	sum(failed)::bigint, sum(succeeded)::bigint, coalesce(max(oldest), 0)::float8
FROM agg GROUP BY queue ORDER BY queue`
}

func collectStats(ctx context.Context, pool *pgxpool.Pool, schema string) ([]queueStats, error) {
	rows, err := pool.Query(ctx, statsSQL(schema))
	if err != nil {
		return nil, explainSchemaError(fmt.Errorf("read stats: %w", err), schema)
	}
	defer rows.Close()
	out := []queueStats{}
	for rows.Next() {
		var s queueStats
		if err := rows.Scan(&s.Queue, &s.Pending, &s.Scheduled, &s.Running, &s.Failed, &s.SucceededLastMinute, &s.OldestPendingAgeSec); err != nil {
			return nil, fmt.Errorf("read stats: %w", err)
		}
		s.OldestPendingAgeSec = max(s.OldestPendingAgeSec, 0)
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, explainSchemaError(fmt.Errorf("read stats: %w", err), schema)
	}
	out, err = markPaused(ctx, pool, schema, out)
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Queue < out[j].Queue })
	return out, nil
}

func runStats(ctx context.Context, env *cliEnv, args []string) error {
	fs := env.flags()
	asJSON := fs.Bool("json", false, "print one JSON document instead of a table")
	watch := fs.Bool("watch", false, "print again every --interval until interrupted")
	interval := fs.Duration("interval", 2*time.Second, "refresh interval for --watch")
	if err := env.parseNoArgs(fs, args); err != nil {
		return err
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
		st, err := collectStats(ctx, pool, env.schema)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if *asJSON {
			if err := json.NewEncoder(env.stdout).Encode(statsDoc{Queues: st}); err != nil {
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

func printStatsTable(w io.Writer, st []queueStats) error {
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
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", printable(s.Queue, false), s.Pending, s.Scheduled, s.Running, s.Failed, s.SucceededLastMinute, oldest, state)
	}
	return tw.Flush()
}
