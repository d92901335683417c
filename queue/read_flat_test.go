package queue

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
)

// QueueStats reads about as many buffers at 300,000 pending jobs as at
// 30,000 (10 queues, 3 priorities, a quarter scheduled ahead, plus failed
// and succeeded jobs): its counts stop at the exact limit, the rest comes
// from index ranges. The statement it replaced (pgwake stats until
// migration 0015) read every pending row: its buffers grew with the table.
//
// Not parallel: a claim transaction of another test left open keeps VACUUM
// from marking pages all-visible, and the index-only scans then read the
// heap (16,903 buffers instead of 791 measured that way).
func TestQueueStatsCostIsFlat(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewPool(t, nil)
	measure := func(n int) int64 {
		schema, jobs := flatSchema(t, pool)
		_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO `+jobs+` (queue, kind, priority, run_after)
			SELECT 'q' || (i %% 10), 'k', (i %% 3)::smallint,
				CASE WHEN i %% 4 = 0 THEN now() + interval '1 hour' ELSE now() - interval '1 minute' END
			FROM generate_series(1, %d) i`, n))
		require.NoError(t, err)
		_, err = pool.Exec(ctx, fmt.Sprintf(`INSERT INTO `+jobs+` (queue, kind, state, finished_at, last_error)
			SELECT 'q' || (i %% 10), 'k', CASE WHEN i %% 2 = 0 THEN 'failed' ELSE 'succeeded' END,
				now() - (i %% 120) * interval '1 second', 'boom'
			FROM generate_series(1, %d) i`, n/2))
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `VACUUM ANALYZE `+jobs)
		require.NoError(t, err)
		s := newStatements(schema)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer rollback(tx)
		buffers, rows := explainBuffers(t, tx, s.read.stats, `1001`)
		require.Equal(t, int64(10), rows)
		return buffers
	}
	small, large := measure(30000), measure(300000)
	t.Logf("QueueStats buffers: %d at 30,000 pending, %d at 300,000", small, large)
	require.Less(t, float64(large), 1.5*float64(small)+50, "cost grows with the table")
}

// legacyStatsSQL is `pgwake stats` before the read API: it read every
// pending row and pg_locks. The baseline of BenchmarkQueueStats.
func legacyStatsSQL(jobs string) string {
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

// BenchmarkQueueStats: QueueStats (default exact limit) against the
// statement it replaced, on 1,000,000 pending jobs (10 queues) and 500,000
// finished ones (PGWAKE_BENCH_STATS_ROWS sets the pending count).
//
//	go test -run '^$' -bench BenchmarkQueueStats -benchtime 20x -count 3 ./queue/
func BenchmarkQueueStats(b *testing.B) {
	ctx := context.Background()
	n := 1000000
	if v := os.Getenv("PGWAKE_BENCH_STATS_ROWS"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(b, err)
	}
	pool := pgtest.NewPool(b, nil)
	schema := pgtest.SchemaOn(b, pool)
	_, err := migrations.Up(ctx, pool, schema)
	require.NoError(b, err)
	jobs := sqlident.Quote(schema, "jobs")
	_, err = pool.Exec(ctx, fmt.Sprintf(`INSERT INTO `+jobs+` (queue, kind, run_after)
		SELECT 'q' || (i %% 10), 'k', now() - interval '1 minute' FROM generate_series(1, %d) i`, n))
	require.NoError(b, err)
	_, err = pool.Exec(ctx, fmt.Sprintf(`INSERT INTO `+jobs+` (queue, kind, state, finished_at)
		SELECT 'q' || (i %% 10), 'k', CASE WHEN i %% 10 = 0 THEN 'failed' ELSE 'succeeded' END, now() - interval '1 hour'
		FROM generate_series(1, %d) i`, n/2))
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE `+jobs)
	require.NoError(b, err)
	c, err := New(pool, Config{Schema: schema})
	require.NoError(b, err)
	legacy := legacyStatsSQL(jobs)
	b.Run("read_api", func(b *testing.B) {
		for b.Loop() {
			_, err := c.QueueStats(ctx, QueueStatsParams{})
			require.NoError(b, err)
		}
	})
	b.Run("legacy", func(b *testing.B) {
		for b.Loop() {
			rows, err := pool.Query(ctx, legacy)
			require.NoError(b, err)
			rows.Close()
			require.NoError(b, rows.Err())
		}
	})
}

// BenchmarkQueueStatsRecentSuccesses: QueueStats with and without
// SkipSucceeded (which the dashboard's counter reads use, counting the
// successes from the event log itself) on a minute of 200 jobs/s: 12,000
// jobs succeeded in the last 30 s, 50 pending, 3 queues.
//
//	go test -run '^$' -bench BenchmarkQueueStatsRecentSuccesses -benchtime 200x -count 5 ./queue/
func BenchmarkQueueStatsRecentSuccesses(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.NewPool(b, nil)
	schema := pgtest.SchemaOn(b, pool)
	_, err := migrations.Up(ctx, pool, schema)
	require.NoError(b, err)
	jobs := sqlident.Quote(schema, "jobs")
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, state, attempts, finished_at)
		SELECT 'q' || (i % 3), 'k', 'succeeded', 1, now() - (i % 30000) * interval '1 ms' FROM generate_series(1, 12000) i`)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind) SELECT 'q' || (i % 3), 'k' FROM generate_series(1, 50) i`)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE `+jobs)
	require.NoError(b, err)
	c, err := New(pool, Config{Schema: schema})
	require.NoError(b, err)
	for _, skip := range []bool{false, true} {
		b.Run(map[bool]string{false: "counted", true: "skipped"}[skip], func(b *testing.B) {
			for b.Loop() {
				_, err := c.QueueStats(ctx, QueueStatsParams{SkipSucceeded: skip})
				require.NoError(b, err)
			}
		})
	}
}

// BenchmarkEnqueueEventWatchers: the cost the event watchers' trigger
// (migrations 0015, 0017) adds to a single-job enqueue (one events insert):
// without the trigger (dropped), with it and no watcher, and with a watcher
// registered (a NOTIFY at commit, at most one per 25 ms), in one run, from
// concurrent producers.
//
//	go test -run '^$' -bench BenchmarkEnqueueEventWatchers -benchtime 3000x -count 3 ./queue/
func BenchmarkEnqueueEventWatchers(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.Pool(b)
	for _, mode := range []string{"no_trigger", "no_watcher", "watcher"} {
		b.Run(mode, func(b *testing.B) {
			schema := pgtest.SchemaOn(b, pool)
			_, err := migrations.Up(ctx, pool, schema)
			require.NoError(b, err)
			c, err := New(pool, Config{Schema: schema})
			require.NoError(b, err)
			switch mode {
			case "no_trigger":
				_, err = pool.Exec(ctx, `DROP TRIGGER events_notify_watchers ON `+sqlident.Quote(schema, "events"))
				require.NoError(b, err)
			case "watcher":
				require.NoError(b, c.WatchEvents(ctx, "bench"))
			}
			job := NewJob{Queue: "bench", Kind: "bench"}
			b.SetParallelism(4) // 8 producers on 2 cores: commits contend
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.Enqueue(ctx, job); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
