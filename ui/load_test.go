package ui_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

// produce enqueues one job per transaction at rate per second for d.
func produce(t testing.TB, c *queue.Client, rate float64, d time.Duration) int {
	t.Helper()
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	end := time.After(d)
	n := 0
	for {
		select {
		case <-end:
			return n
		case <-tick.C:
			_, err := c.Enqueue(context.Background(), queue.NewJob{Queue: "load", Kind: "k", Payload: map[string]int64{"at": time.Now().UnixNano()}})
			require.NoError(t, err)
			n++
		}
	}
}

// The live feed's reads do not grow with the open pages: with 10 streams
// open and jobs flowing at 200/s through a worker, it reads the counters at
// most once per StatsMinInterval (plus the refreshes) and the event log at
// most once per 25 ms (notifications in a burst share a read).
func TestFeedLoadIsPerProcess(t *testing.T) {
	b := setup(t, ui.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 10 {
		stream(t, ctx, b.url+"/events", "")
	}
	worker, err := queue.New(pgtest.Pool(t), queue.Config{Schema: b.schema, Logger: zap.NewNop(),
		Queues:   map[string]queue.QueueConfig{"load": {MaxWorkers: 4}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil })}})
	require.NoError(t, err)
	pgtest.RunInBackground(t, "worker", worker.Run)
	before := b.h.Reads()
	start := time.Now()
	n := produce(t, b.client, 200, 5*time.Second)
	secs := time.Since(start).Seconds()
	after := b.h.Reads()
	statsPerSec := float64(after.QueueStats-before.QueueStats) / secs
	logPerSec := float64(after.EventLog-before.EventLog) / secs
	t.Logf("10 streams, %d jobs in %.1f s: %.1f QueueStats/s, %.1f event log reads/s", n, secs, statsPerSec, logPerSec)
	require.LessOrEqual(t, statsPerSec, 1/0.1+1, "at most one counter read per StatsMinInterval")
	require.Greater(t, after.EventLog, before.EventLog)
	require.LessOrEqual(t, logPerSec, 1/0.025+4+1, "at most one event log read per 25 ms, plus the gap checks")
}

// BenchmarkDashboardLatencyImpact: the queue's latency (from the enqueue
// call to handler start) at 200 jobs/s for 10 s in four configurations, run
// in an order that rotates with each iteration (so a slower later run, as
// the cluster's WAL and tables grow, does not fall on one configuration):
// no dashboard; only a watcher registered (the NOTIFYs, no reads); a
// dashboard feeding 10 open streams in this process (a Handler mounted in
// the worker's own service); and the same dashboard with its 10 streams in
// a process of their own (as `pgwake ui` runs beside the workers). It
// reports each p99 and its ratio to the run without a dashboard, the
// NOTIFYs per second of the events channel while the in-process dashboard
// ran, and the p99 and max time from an 'enqueued' event's insert (its
// "at", the database's clock, same machine) to its arrival on a stream.
//
// With -benchtime Nx it runs each configuration N times and reports, per
// configuration, the p99 of all its runs' jobs together and the median of
// the runs' p99 ratios to the run without a dashboard in the same iteration.
//
//	go test -run '^$' -bench BenchmarkDashboardLatencyImpact -benchtime 8x ./ui/
func BenchmarkDashboardLatencyImpact(b *testing.B) {
	var notifies float64
	var toStream []float64
	run := func(b *testing.B, mode string) []float64 {
		pool := pgtest.Pool(b)
		schema := pgtest.SchemaOn(b, pool)
		_, err := migrations.Up(context.Background(), pool, schema)
		require.NoError(b, err)
		client, err := queue.New(pool, queue.Config{Schema: schema})
		require.NoError(b, err)
		switch mode {
		case "watcher":
			require.NoError(b, client.WatchEvents(context.Background(), "bench"))
		case "dashboard":
			defer openDashboard(b, client, &toStream, &notifies)()
		case "process":
			defer dashboardProcess(b, schema)()
		}
		var mu sync.Mutex
		var lat []float64
		worker, err := queue.New(pool, queue.Config{Schema: schema, Logger: zap.NewNop(),
			Queues: map[string]queue.QueueConfig{"load": {MaxWorkers: 4}},
			Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(_ context.Context, _ pgx.Tx, j *queue.Job) error {
				var p struct {
					At int64 `json:"at"`
				}
				if err := json.Unmarshal(j.Payload, &p); err != nil {
					return err
				}
				mu.Lock()
				lat = append(lat, float64(time.Now().UnixNano()-p.At)/1e6)
				mu.Unlock()
				return nil
			})}})
		require.NoError(b, err)
		stop := pgtest.RunInBackground(b, "worker", worker.Run)
		produce(b, client, 200, 10*time.Second)
		stop()
		return lat
	}
	modes := []string{"none", "watcher", "dashboard", "process"}
	pooled := map[string][]float64{}
	ratios := map[string][]float64{}
	// A first run pays for the process's and the cluster's warm-up: not
	// counted.
	run(b, "none")
	iteration := 0
	for b.Loop() {
		p := map[string]float64{}
		for i := range modes {
			mode := modes[(i+iteration)%len(modes)]
			lat := run(b, mode)
			pooled[mode] = append(pooled[mode], lat...)
			p[mode] = p99(lat)
		}
		iteration++
		for _, mode := range modes[1:] {
			ratios[mode] = append(ratios[mode], p[mode]/p["none"])
		}
	}
	// Each run's p99 rests on its 20 slowest jobs and swings with the
	// machine; the pooled p99 (every run's jobs of a configuration together)
	// and the median of the runs' ratios are steadier.
	names := map[string]string{"none": "without", "watcher": "watcher", "dashboard": "with", "process": "process"}
	for _, mode := range modes {
		b.ReportMetric(p99(pooled[mode]), "p99_ms_"+names[mode])
	}
	for _, mode := range modes[1:] {
		b.ReportMetric(p99(pooled[mode])/p99(pooled["none"]), names[mode]+"_ratio_pooled")
		b.ReportMetric(median(ratios[mode]), names[mode]+"_ratio_median")
	}
	b.ReportMetric(notifies, "notifies/s")
	if len(toStream) > 0 {
		b.ReportMetric(p99(toStream), "stream_p99_ms")
		b.ReportMetric(slices.Max(toStream), "stream_max_ms")
	}
}

// median is the median of xs (which it sorts).
func median(xs []float64) float64 {
	slices.Sort(xs)
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[len(xs)/2]
}

// p99 is the 99th percentile of xs (which it sorts).
func p99(xs []float64) float64 {
	slices.Sort(xs)
	return xs[int(math.Ceil(0.99*float64(len(xs))))-1]
}

// openDashboard serves a dashboard for client's schema in this process
// with 10 open streams, and returns what stops it; then *toStream holds the
// first stream's enqueued-event delays (ms) and *notifies the NOTIFYs per
// second of the events channel meanwhile.
func openDashboard(tb testing.TB, client *queue.Client, toStream *[]float64, notifies *float64) func() {
	bb := setup(tb, ui.Config{Client: client})
	ctx, cancel := context.WithCancel(context.Background())
	var streams []<-chan sseEvent
	for range 10 {
		streams = append(streams, stream(tb, ctx, bb.url+"/events", ""))
	}
	done := make(chan []float64)
	go func() { done <- enqueuedDelays(streams[0]) }()
	notes := countNotifications(tb, client.Schema())
	start, before := time.Now(), notes.Load()
	return func() {
		*notifies = float64(notes.Load()-before) / time.Since(start).Seconds()
		cancel()
		*toStream = <-done
	}
}

// enqueuedDelays reads a stream until it closes and returns, for each
// enqueued event, the time from the event's insert to its arrival (ms).
func enqueuedDelays(events <-chan sseEvent) []float64 {
	var lat []float64
	for e := range events {
		var je struct {
			Type queue.EventType `json:"type"`
			At   time.Time       `json:"at"`
		}
		if e.event == "job" && json.Unmarshal([]byte(e.data), &je) == nil && je.Type == queue.EventEnqueued {
			lat = append(lat, float64(time.Since(je.At).Microseconds())/1000)
		}
	}
	return lat
}

// envDashboardSchema names the schema TestDashboardProcess serves.
const envDashboardSchema = "PGWAKE_UI_BENCH_SCHEMA"

// dashboardProcess runs this test binary again as TestDashboardProcess, a
// dashboard with 10 open streams on schema in a process of its own, waits
// until its streams are open, and returns what stops it.
func dashboardProcess(tb testing.TB, schema string) func() {
	cmd := exec.Command(os.Args[0], "-test.run", "^TestDashboardProcess$", "-test.count", "1")
	cmd.Env = append(os.Environ(), pgtest.EnvURL+"="+pgtest.URL(), envDashboardSchema+"="+schema)
	stdin, err := cmd.StdinPipe()
	require.NoError(tb, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(tb, err)
	cmd.Stderr = os.Stderr
	require.NoError(tb, cmd.Start())
	lines := bufio.NewScanner(stdout)
	for lines.Scan() && lines.Text() != dashboardReady {
	}
	return func() {
		_ = stdin.Close()
		for lines.Scan() {
			tb.Log(lines.Text())
		}
		require.NoError(tb, cmd.Wait(), "the dashboard process")
	}
}

// dashboardReady is what TestDashboardProcess prints once its streams are
// open.
const dashboardReady = "dashboard ready"

// TestDashboardProcess is BenchmarkDashboardLatencyImpact's dashboard in a
// process of its own: it serves a dashboard on the schema named by
// envDashboardSchema with 10 open streams until its standard input closes.
// Without that variable (every ordinary test run) it is skipped.
func TestDashboardProcess(t *testing.T) {
	schema := os.Getenv(envDashboardSchema)
	if schema == "" {
		t.Skip("run by BenchmarkDashboardLatencyImpact")
	}
	client, err := queue.New(pgtest.Pool(t), queue.Config{Schema: schema})
	require.NoError(t, err)
	var toStream []float64
	var notifies float64
	stop := openDashboard(t, client, &toStream, &notifies)
	fmt.Println(dashboardReady)
	_, _ = io.Copy(io.Discard, os.Stdin)
	stop()
	require.NotEmpty(t, toStream, "the streams saw the jobs")
	fmt.Printf("dashboard process: %d enqueued events streamed, p99 %.1f ms\n", len(toStream), p99(toStream))
}
