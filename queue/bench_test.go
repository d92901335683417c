package queue_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgwake/pgwake/internal/pgtest"
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
	var done atomic.Int64
	all := make(chan struct{})
	n := int64(b.N)
	c := benchClient(b, queue.Config{
		Queues: map[string]queue.QueueConfig{"bench": {}},
		Handlers: map[string]queue.Handler{"bench": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			if done.Add(1) == n {
				close(all)
			}
			return nil
		})},
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
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		b.Fatalf("only %d of %d jobs ran within 5 minutes", done.Load(), b.N)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
	cancel()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	if got := done.Load(); got != n {
		b.Fatalf("%d handler runs for %d jobs", got, n)
	}
}
