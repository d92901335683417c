package ui_test

import (
	"context"
	"os"
	"runtime/metrics"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

// envLoadSchema makes TestDashboardProcess run a worker and a producer of
// blockRate jobs per second on that schema, until its standard input
// closes: BenchmarkDashboardCost's load, kept out of the measured process.
const envLoadSchema = "PGWAKE_UI_BENCH_LOAD"

// procStats is what a process spent so far: CPU time (getrusage: user and
// system, all threads) and what runtime/metrics counts.
type procStats struct {
	CPU      time.Duration
	GCCPU    float64 // seconds, the runtime's estimate
	GCs      uint64
	Allocs   uint64 // heap objects
	Bytes    uint64 // heap bytes
	Created  uint64 // goroutines created
	Runnable uint64 // sampled runnable-to-running transitions (/sched/latencies)
}

var procMetrics = []string{"/cpu/classes/gc/total:cpu-seconds", "/gc/cycles/total:gc-cycles",
	"/gc/heap/allocs:objects", "/gc/heap/allocs:bytes", "/sched/goroutines-created:goroutines", "/sched/latencies:seconds"}

func readProcStats() procStats {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	s := make([]metrics.Sample, len(procMetrics))
	for i, n := range procMetrics {
		s[i].Name = n
	}
	metrics.Read(s)
	var runnable uint64
	if s[5].Value.Kind() == metrics.KindFloat64Histogram {
		for _, c := range s[5].Value.Float64Histogram().Counts {
			runnable += c
		}
	}
	return procStats{CPU: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), GCCPU: s[0].Value.Float64(),
		GCs: s[1].Value.Uint64(), Allocs: s[2].Value.Uint64(), Bytes: s[3].Value.Uint64(),
		Created: s[4].Value.Uint64(), Runnable: runnable}
}

func (a procStats) plus(b procStats) procStats {
	return procStats{CPU: a.CPU + b.CPU, GCCPU: a.GCCPU + b.GCCPU, GCs: a.GCs + b.GCs, Allocs: a.Allocs + b.Allocs,
		Bytes: a.Bytes + b.Bytes, Created: a.Created + b.Created, Runnable: a.Runnable + b.Runnable}
}

func (a procStats) minus(b procStats) procStats {
	return procStats{CPU: a.CPU - b.CPU, GCCPU: a.GCCPU - b.GCCPU, GCs: a.GCs - b.GCs, Allocs: a.Allocs - b.Allocs,
		Bytes: a.Bytes - b.Bytes, Created: a.Created - b.Created, Runnable: a.Runnable - b.Runnable}
}

// BenchmarkDashboardCost is what the live dashboard itself costs its
// process at blockRate jobs per second with 10 streams open: the process
// holds the dashboard alone (its feed, its HTTP server, its pool and its
// LISTEN connection); the worker and the producer run in one other process
// and the 10 streams' readers in another. Each iteration is one second of
// load; it reports per second the process's CPU time (getrusage, all
// threads: cpu-ms/s), the GC's share of it (runtime estimate, gc-cpu-ms/s),
// GC cycles, heap allocations, goroutines created, and the dashboard's
// statements; and the heap allocations per event of the log it delivered.
// Run it with -cpuprofile or -memprofile to see where the time goes.
//
//	go test -run '^$' -bench BenchmarkDashboardCost -benchtime 10x ./ui/
func BenchmarkDashboardCost(b *testing.B) {
	counter := newStmtCounter(true)
	pool := pgtest.NewPool(b, func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter })
	ctx := context.Background()
	client, schema := migratedClient(b, pool)
	d := setup(b, ui.Config{Client: client})
	defer d.stop()
	streams := startHelper(b, envStreamsURL+"="+d.url)
	defer streams.stop(b, nil)
	load := startHelper(b, envLoadSchema+"="+schema)
	defer load.stop(b, nil)
	time.Sleep(2 * time.Second) // warm-up: the pool's connections, the first reads

	ev0, err := client.LastEventID(ctx)
	require.NoError(b, err)
	st0, p0, start := counter.snapshot(), readProcStats(), time.Now()
	for b.Loop() {
		time.Sleep(time.Second)
	}
	secs := time.Since(start).Seconds()
	p, st := readProcStats().minus(p0), counter.snapshot().minus(st0)
	ev1, err := client.LastEventID(ctx)
	require.NoError(b, err)
	events := float64(ev1 - ev0)
	b.ReportMetric(float64(p.CPU.Microseconds())/1000/secs, "cpu-ms/s")
	b.ReportMetric(p.GCCPU*1000/secs, "gc-cpu-ms/s")
	b.ReportMetric(float64(p.GCs)/secs, "gc/s")
	b.ReportMetric(float64(p.Allocs)/secs, "allocs/s")
	b.ReportMetric(float64(p.Bytes)/1024/secs, "KiB/s")
	b.ReportMetric(float64(p.Allocs)/max(events, 1), "allocs/event")
	b.ReportMetric(float64(p.Created)/secs, "goroutines/s")
	b.ReportMetric(events/secs, "events/s")
	b.ReportMetric(float64(st.N)/secs, "stmts/s")
	b.ReportMetric(float64(st.Dur.Microseconds())/1000/secs, "stmt-ms/s")
	for _, q := range st.top(6) {
		b.Logf("%6.1f/s %6.1f ms/s  %s", float64(st.BySQL[q])/secs, float64(st.DurSQL[q].Microseconds())/1000/secs, q)
	}
}

// runLoad runs a worker and a producer of blockRate jobs per second on
// schema (through pool) until stop is closed (TestDashboardProcess with
// envLoadSchema). It returns the first error.
func runLoad(t *testing.T, pool *pgxpool.Pool, schema string, stop <-chan struct{}) error {
	client, err := queue.New(pool, queue.Config{Schema: schema})
	if err != nil {
		return err
	}
	worker, err := queue.New(pool, queue.Config{Schema: schema, Logger: zap.NewNop(),
		Queues:   map[string]queue.QueueConfig{"load": {MaxWorkers: 4}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil })}})
	if err != nil {
		return err
	}
	stopWorker := pgtest.RunInBackground(t, "worker", worker.Run)
	defer stopWorker()
	begin := time.Now()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return nil
		default:
		}
		time.Sleep(time.Until(begin.Add(time.Duration(float64(i) * float64(time.Second) / blockRate))))
		_, err := client.Enqueue(context.Background(), queue.NewJob{Queue: "load", Kind: "k", Payload: map[string]int64{"at": time.Now().UnixNano()}})
		if err != nil {
			return err
		}
	}
}

func loadSchema() string { return os.Getenv(envLoadSchema) }
