package queue_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

// Go benchmarks of the enqueue and claim paths, on the test database
// (pgtest: fsync off unless TEST_DATABASE_URL says otherwise, so these
// measure pgwake's own cost per job rather than the disk). `pgwake bench`
// measures the whole system with fsync on; see docs/benchmarks.md.

func benchClient(b *testing.B, cfg queue.Config) *queue.Client {
	b.Helper()
	pool := pgtest.Pool(b)
	cfg.Schema = pgtest.Schema(b)
	if _, err := migrations.Up(context.Background(), pool, cfg.Schema); err != nil {
		b.Fatal(err)
	}
	c, err := queue.New(pool, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

var benchPayload = json.RawMessage(`{"seq":1}`)

func BenchmarkEnqueue(b *testing.B) {
	c := benchClient(b, queue.Config{})
	ctx := context.Background()
	job := queue.NewJob{Queue: "bench", Kind: "bench", Payload: benchPayload}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Enqueue(ctx, job); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEnqueueUniqueKey compares keyed enqueues with unkeyed ones in
// the same process and the same moments: each op is one unkeyed Enqueue on
// a schema of its own and one keyed Enqueue on another (alternating which
// goes first), timed apart. It reports each one's mean (unkeyed-ns,
// keyed-ns) and keyed/unkeyed, the figure docs/unique.md quotes; pairing
// the two keeps a shared machine's drift out of the ratio. Each keyed op
// has a new key (so it writes a job), except in "duplicate", where every
// op after the first finds its key held and writes nothing.
func BenchmarkEnqueueUniqueKey(b *testing.B) {
	cases := []struct {
		name string
		job  func(key string) queue.NewJob
	}{
		{"kind_scope", func(k string) queue.NewJob { return queue.NewJob{UniqueKey: k} }},
		{"queue_scope", func(k string) queue.NewJob { return queue.NewJob{UniqueKey: k, UniqueScope: queue.UniqueByQueue} }},
		{"hold_pending", func(k string) queue.NewJob { return queue.NewJob{UniqueKey: k, UniqueHold: queue.UniqueHoldPending} }},
		{"hold_succeeded", func(k string) queue.NewJob { return queue.NewJob{UniqueKey: k, UniqueHold: queue.UniqueHoldSucceeded} }},
		{"period", func(k string) queue.NewJob { return queue.NewJob{UniqueKey: k, UniquePeriod: time.Hour} }},
		{"duplicate", func(string) queue.NewJob { return queue.NewJob{UniqueKey: "held"} }},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			plain, keyed := benchClient(b, queue.Config{}), benchClient(b, queue.Config{})
			ctx := context.Background()
			enqueue := func(c *queue.Client, job queue.NewJob) time.Duration {
				job.Queue, job.Kind, job.Payload = "bench", "bench", benchPayload
				t0 := time.Now()
				if _, err := c.Enqueue(ctx, job); err != nil {
					b.Fatal(err)
				}
				return time.Since(t0)
			}
			var tPlain, tKeyed time.Duration
			i := 0
			for b.Loop() {
				i++
				job := tc.job("key-" + strconv.Itoa(i))
				if i%2 == 0 {
					tPlain += enqueue(plain, queue.NewJob{})
					tKeyed += enqueue(keyed, job)
				} else {
					tKeyed += enqueue(keyed, job)
					tPlain += enqueue(plain, queue.NewJob{})
				}
			}
			b.ReportMetric(float64(tPlain.Nanoseconds())/float64(i), "unkeyed-ns")
			b.ReportMetric(float64(tKeyed.Nanoseconds())/float64(i), "keyed-ns")
			b.ReportMetric(tKeyed.Seconds()/tPlain.Seconds(), "keyed/unkeyed")
		})
	}
}

func BenchmarkEnqueueMany100(b *testing.B) {
	c := benchClient(b, queue.Config{})
	ctx := context.Background()
	jobs := make([]queue.NewJob, 100)
	for i := range jobs {
		jobs[i] = queue.NewJob{Queue: "bench", Kind: "bench", Payload: benchPayload}
	}
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		if _, err := c.EnqueueMany(ctx, jobs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(jobs))/time.Since(start).Seconds(), "jobs/s")
}

// BenchmarkClaimComplete drains b.N pre-inserted jobs with a no-op handler:
// claim, savepoint, handler, mark succeeded, commit. Default config
// (MaxWorkers 10).
func BenchmarkClaimComplete(b *testing.B) {
	ctx := context.Background()
	handlers, all, done := countingHandlers(int64(b.N))
	c := benchClient(b, queue.Config{
		Queues:   map[string]queue.QueueConfig{"bench": {}},
		Handlers: handlers,
	})
	batch := make([]queue.NewJob, 0, 1000)
	for i := 0; i < b.N; i++ {
		batch = append(batch, queue.NewJob{Queue: "bench", Kind: "bench", Payload: benchPayload})
		if len(batch) == cap(batch) || i == b.N-1 {
			if _, err := c.EnqueueMany(ctx, batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	runUntilAll(ctx, b, c, all, done)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
	if got := done.Load(); got != int64(b.N) {
		b.Fatalf("%d handler runs for %d jobs", got, b.N)
	}
}

// BenchmarkDrainBuffers drains b.N pre-inserted jobs with a no-op handler
// (default config, MaxWorkers 10) and reports the shared buffers the
// database touched per job (hit + read, pg_stat_database): the server's
// work per job, which a shared machine's load does not move as it moves
// time. Run it with a fixed count: -benchtime 5000x.
func BenchmarkDrainBuffers(b *testing.B) {
	ctx := context.Background()
	const app = "pgwake_drain_buffers"
	pool := pgtest.NewPool(b, func(c *pgxpool.Config) {
		c.MaxConns = 20
		c.ConnConfig.RuntimeParams["application_name"] = app
	})
	schema := pgtest.SchemaOn(b, pool)
	if _, err := migrations.Up(ctx, pool, schema); err != nil {
		b.Fatal(err)
	}
	handlers, all, done := countingHandlers(int64(b.N))
	c, err := queue.New(pool, queue.Config{
		Schema:   schema,
		Queues:   map[string]queue.QueueConfig{"bench": {}},
		Handlers: handlers,
	})
	if err != nil {
		b.Fatal(err)
	}
	jobs := sqlident.Quote(schema, "jobs")
	if _, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, payload) SELECT 'bench', 'bench', '{"seq":1}' FROM generate_series(1, $1::int)`, b.N); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+jobs); err != nil {
		b.Fatal(err)
	}
	mon := pgtest.NewPool(b, nil)
	// blocks closes the pool's connections, waits until their backends
	// have exited (flushing their statistics) and returns the database's
	// shared buffer hits and reads.
	blocks := func() int64 {
		pool.Reset()
		deadline := time.Now().Add(30 * time.Second)
		for {
			var left int
			if err := mon.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE application_name = $1`, app).Scan(&left); err != nil {
				b.Fatal(err)
			}
			if left == 0 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d backends of the drain did not exit", left)
			}
			time.Sleep(10 * time.Millisecond)
		}
		var blks int64
		err := pgx.BeginFunc(ctx, mon, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_catalog.pg_stat_clear_snapshot()`); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT blks_hit + blks_read FROM pg_catalog.pg_stat_database WHERE datname = current_database()`).Scan(&blks)
		})
		if err != nil {
			b.Fatal(err)
		}
		return blks
	}
	before := blocks()
	b.ResetTimer()
	runUntilAll(ctx, b, c, all, done)
	b.ReportMetric(float64(blocks()-before)/float64(b.N), "buffers/job")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
}

// countingHandlers is a no-op handler for kind "bench" that closes all when
// the n-th job ran; done counts the runs.
func countingHandlers(n int64) (handlers map[string]queue.Handler, all chan struct{}, done *atomic.Int64) {
	all, done = make(chan struct{}), new(atomic.Int64)
	return map[string]queue.Handler{"bench": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
		if done.Add(1) == n {
			close(all)
		}
		return nil
	})}, all, done
}

// runUntilAll runs c until all is closed (at most 5 minutes), stops the
// benchmark timer, then stops c.
func runUntilAll(ctx context.Context, b *testing.B, c *queue.Client, all <-chan struct{}, done *atomic.Int64) {
	b.Helper()
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		b.Fatalf("only %d of %d jobs ran within 5 minutes", done.Load(), b.N)
	}
	b.StopTimer()
	cancel()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
}
