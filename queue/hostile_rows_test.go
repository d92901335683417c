package queue_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

// scrape renders the registry as /metrics does and returns its size and the
// series it holds.
func (e *env) scrape() (size int, series map[string]bool) {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	require.NoError(e.t, err)
	var buf bytes.Buffer
	for _, mf := range mfs {
		_, err := expfmt.MetricFamilyToText(&buf, mf)
		require.NoError(e.t, err)
	}
	series = map[string]bool{}
	for _, line := range strings.Split(buf.String(), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			series[line[:strings.LastIndexByte(line, ' ')]] = true
		}
	}
	return buf.Len(), series
}

// TestInventedKindsAndQueuesDoNotGrowMetrics: producers enqueue 2,000 kinds
// with no handler and 200 queues nobody works; the worker fails the jobs of
// the worked queue. Those kinds and queues are counted as "other": the scrape
// has the same series as before and stays within a small constant of its
// size (counter values grow by a few digits). Not parallel: its 2,200 jobs
// would starve the timing of tests that run beside it (leases of 300 ms).
func TestInventedKindsAndQueuesDoNotGrowMetrics(t *testing.T) {
	ok := queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil })
	e := newEnv(t, queue.Config{
		Queues:   map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		Handlers: map[string]queue.Handler{"k": ok},
		Logger:   zap.NewNop(),
	})
	ctx := context.Background()
	e.run()
	// One of each: a registered kind, an invented one, a queue nobody here works.
	_, err := e.c.EnqueueMany(ctx, []queue.NewJob{{Kind: "k"}, {Kind: "invented", MaxAttempts: 1}, {Queue: "elsewhere", Kind: "x"}})
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "first jobs finished", func() bool { return e.count(`queue = 'default' AND state IN ('succeeded', 'failed')`) == 2 })
	waitFor(t, 5*time.Second, "outcomes counted", func() bool {
		return e.metric("pgwake_worker_jobs_total", nil) == 2
	})
	require.Equal(t, 1.0, e.metric("pgwake_worker_jobs_total", map[string]string{"kind": "other", "outcome": "failed"}))
	require.Equal(t, 1.0, e.metric("pgwake_queue_depth", map[string]string{"queue": "other", "state": "available"}))
	size, series := e.scrape()

	var jobs []queue.NewJob
	for i := range 2000 {
		jobs = append(jobs, queue.NewJob{Kind: fmt.Sprintf("zz-invented-%d-%x", i, rand.Uint64()), MaxAttempts: 1})
	}
	for i := range 200 {
		jobs = append(jobs, queue.NewJob{Queue: fmt.Sprintf("zz-nobody-%d", i), Kind: fmt.Sprintf("kind-%d", i)})
	}
	_, err = e.c.EnqueueMany(ctx, jobs)
	require.NoError(t, err)
	waitFor(t, 2*time.Minute, "invented kinds failed", func() bool { return e.count(`queue = 'default' AND state = 'failed'`) == 2001 })
	waitFor(t, 5*time.Second, "outcomes counted", func() bool {
		return e.metric("pgwake_worker_jobs_total", map[string]string{"kind": "other"}) == 2001
	})
	require.Equal(t, 2202.0, e.metric("pgwake_queue_enqueued_total", map[string]string{"kind": "other"}))
	require.Equal(t, 201.0, e.metric("pgwake_queue_depth", map[string]string{"queue": "other", "state": "available"}))
	after, afterSeries := e.scrape()
	for s := range afterSeries {
		require.False(t, strings.Contains(s, "zz-"), "series of an invented kind or queue: %s", s)
	}
	// A few fixed series may appear with the load (claim sources, a wake-up
	// counted by the listener); none per kind or queue.
	require.LessOrEqual(t, len(afterSeries), len(series)+8)
	require.LessOrEqual(t, after, size+1024, "scrape grew from %d to %d bytes", size, after)
}

// TestInvalidUTF8KindFailsItsJob: in a SQL_ASCII database any bytes can be
// a kind. A job whose kind is not valid UTF-8 fails its attempt (no handler)
// and the worker goes on: no panic in the metrics, the next job runs.
func TestInvalidUTF8KindFailsItsJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := fmt.Sprintf("ascii_%08x", rand.Uint32())
	_, err := pgtest.Pool(t).Exec(ctx, `CREATE DATABASE `+db+` ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0`)
	require.NoError(t, err)
	u, err := url.Parse(pgtest.URL())
	require.NoError(t, err)
	u.Path = "/" + db
	pool := pgtest.PoolOn(t, u.String(), func(c *pgxpool.Config) { c.MaxConns = 8 })
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pgtest.Pool(t).Exec(ctx, `DROP DATABASE IF EXISTS `+db+` WITH (FORCE)`)
	})
	_, err = migrations.Up(ctx, pool, "")
	require.NoError(t, err)
	ran := make(chan int64, 1)
	e := newEnvOn(t, pool, migrations.DefaultSchema, queue.Config{
		AllowSmallPool: true,
		Queues:         map[string]queue.QueueConfig{"default": {}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(_ context.Context, _ pgx.Tx, j *queue.Job) error {
			ran <- j.ID
			return nil
		})},
	})
	var bad int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO pgwake.jobs (queue, kind, max_attempts) VALUES ('default', E'\xff\xfe', 1) RETURNING id`).Scan(&bad))
	e.run()
	good, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	select {
	case id := <-ran:
		require.Equal(t, good.ID, id)
	case <-time.After(30 * time.Second):
		t.Fatal("the job after the bad row did not run")
	}
	waitFor(t, 30*time.Second, "bad row failed", func() bool { return e.count(`id = $1 AND state = 'failed'`, bad) == 1 })
	var lastErr string
	require.NoError(t, pool.QueryRow(ctx, `SELECT last_error FROM pgwake.jobs WHERE id = $1`, bad).Scan(&lastErr))
	require.Contains(t, lastErr, "no handler")
	waitFor(t, 5*time.Second, "outcome counted", func() bool {
		return e.metric("pgwake_worker_jobs_total", map[string]string{"kind": "other", "outcome": "failed"}) == 1
	})
}
