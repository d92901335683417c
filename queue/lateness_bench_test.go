package queue_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

// Lateness benchmarks: how long after its run_after a delayed or periodic
// job's handler starts (time.Now() at handler start minus Job.RunAfter; the
// database and the process share the machine's clock). Each run takes b.N
// jobs (give -benchtime Nx, N of 100 or more), lateSpacing apart or more,
// and reports the p50, p99 and largest lateness in ms, beside the p50 and
// p99 of a plain Go timer set for the same moments in the same process
// (timer-p50-ms, timer-p99-ms): what the machine and the Go runtime add.
// They measure time on a shared machine, so they are benchmarks, not tests:
// run them with a fixed count and read medians.
//
//	go test -run '^$' -bench 'Lateness' -benchtime 200x -count 5 ./queue/

// lateSpacing is the time between two jobs' run_after.
const lateSpacing = 50 * time.Millisecond

// lateWorker starts a client on schema that works queue "late" and sends
// each "late" handler's lateness on the returned channel; stop ends it.
func lateWorker(b *testing.B, schema string, n int) (late <-chan time.Duration, stop func()) {
	b.Helper()
	ch := make(chan time.Duration, n+64)
	c, err := queue.New(pgtest.Pool(b), queue.Config{
		Schema: schema,
		Queues: map[string]queue.QueueConfig{"late": {MaxWorkers: 2}},
		Handlers: map[string]queue.Handler{"late": queue.HandlerFunc(func(_ context.Context, _ pgx.Tx, j *queue.Job) error {
			ch <- time.Since(j.RunAfter)
			return nil
		})},
	})
	if err != nil {
		b.Fatal(err)
	}
	return ch, runClient(b, c)
}

// runClient runs c in the background until stop.
func runClient(b *testing.B, c *queue.Client) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	return func() {
		cancel()
		if err := <-errc; err != nil {
			b.Error(err)
		}
	}
}

// lateSchema is a migrated schema of its own.
func lateSchema(b *testing.B) string {
	b.Helper()
	pool := pgtest.Pool(b)
	schema := pgtest.SchemaOn(b, pool)
	if _, err := migrations.Up(context.Background(), pool, schema); err != nil {
		b.Fatal(err)
	}
	return schema
}

// controlTimers sleeps on a plain Go timer until each of n moments, spacing
// apart from first, and sends how late each woke: the machine's and the Go
// runtime's share of a job's lateness, in the same process at the same
// moments (reported as timer-p50-ms and timer-p99-ms).
func controlTimers(first time.Time, spacing time.Duration, n int) <-chan []time.Duration {
	out := make(chan []time.Duration, 1)
	go func() {
		ds := make([]time.Duration, 0, n)
		for i := range n {
			due := first.Add(time.Duration(i) * spacing)
			time.Sleep(time.Until(due))
			ds = append(ds, time.Since(due))
		}
		out <- ds
	}()
	return out
}

// collectLateness reads n latenesses from late and reports them, with the
// control timers' from ctl.
func collectLateness(b *testing.B, late <-chan time.Duration, n int, ctl <-chan []time.Duration) {
	b.Helper()
	got := make([]time.Duration, 0, n)
	for len(got) < n {
		select {
		case d := <-late:
			got = append(got, d)
		case <-time.After(30 * time.Second):
			b.Fatalf("%d of %d jobs ran", len(got), n)
		}
	}
	b.StopTimer()
	reportLateness(b, "", got)
	reportLateness(b, "timer-", <-ctl)
	b.ReportMetric(0, "ns/op")
}

// reportLateness reports the p50, p99 (and for jobs the largest) of ds in
// ms, named with prefix.
func reportLateness(b *testing.B, prefix string, ds []time.Duration) {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(ds[len(ds)/2]), prefix+"p50-ms")
	b.ReportMetric(ms(ds[len(ds)*99/100]), prefix+"p99-ms")
	if prefix == "" {
		b.ReportMetric(ms(ds[len(ds)-1]), "max-ms")
	}
}

// BenchmarkDelayedLateness: delayed jobs of queue "late", worked by one
// idle client, enqueued by another:
//   - ahead: due lateSpacing apart, each enqueued 1 s before it is due (as
//     a short-interval schedule enqueues its slots): the worker knows the
//     next one from its look after each claim;
//   - hinted: due 2*lateSpacing apart, each enqueued lateSpacing before it
//     is due, after the worker went idle (as a 1 s schedule's slots, each
//     enqueued as the previous one is due): only its NOTIFY announces it;
//   - upfront: due lateSpacing apart, all enqueued in one statement at the
//     start (as a Watermill Publish of delayed messages).
func BenchmarkDelayedLateness(b *testing.B) {
	b.Run("ahead", func(b *testing.B) { benchmarkDelayed(b, lateSpacing, time.Second, false) })
	b.Run("hinted", func(b *testing.B) { benchmarkDelayed(b, 2*lateSpacing, lateSpacing, false) })
	b.Run("upfront", func(b *testing.B) { benchmarkDelayed(b, lateSpacing, time.Second, true) })
}

func benchmarkDelayed(b *testing.B, spacing, ahead time.Duration, upfront bool) {
	ctx := context.Background()
	schema := lateSchema(b)
	n := b.N
	late, stop := lateWorker(b, schema, n)
	defer stop()
	prod, err := queue.New(pgtest.Pool(b), queue.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the worker starts and goes idle
	b.ResetTimer()
	first := time.Now().Add(ahead)
	job := func(i int) queue.NewJob {
		return queue.NewJob{Queue: "late", Kind: "late", RunAfter: first.Add(time.Duration(i) * spacing)}
	}
	if upfront {
		jobs := make([]queue.NewJob, n)
		for i := range jobs {
			jobs[i] = job(i)
		}
		if _, err := prod.EnqueueMany(ctx, jobs); err != nil {
			b.Fatal(err)
		}
	} else {
		go func() {
			for i := range n {
				j := job(i)
				time.Sleep(time.Until(j.RunAfter.Add(-ahead)))
				if _, err := prod.Enqueue(ctx, j); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	collectLateness(b, late, n, controlTimers(first, spacing, n))
}

// BenchmarkPeriodicLateness: a "@every 50ms" schedule run by one client,
// worked by another, idle between slots.
func BenchmarkPeriodicLateness(b *testing.B) {
	schema := lateSchema(b)
	n := b.N
	late, stop := lateWorker(b, schema, n)
	defer stop()
	sched, err := queue.New(pgtest.Pool(b), queue.Config{
		Schema:   schema,
		Periodic: []queue.PeriodicJob{{Spec: "@every " + lateSpacing.String(), Job: queue.NewJob{Kind: "late", Queue: "late"}}},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	defer runClient(b, sched)()
	// The first slot is at least a lead away; the control timers wake at
	// slots from the second on.
	first := time.Now().Truncate(lateSpacing).Add(2 * lateSpacing)
	collectLateness(b, late, n, controlTimers(first, lateSpacing, n))
}
