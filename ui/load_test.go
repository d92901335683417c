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
//	go test -run '^$' -bench BenchmarkDashboardLatencyImpact -benchtime 1x -count 4 ./ui/
func BenchmarkDashboardLatencyImpact(b *testing.B) {
	var notifies float64
	var toStream []float64
	run := func(b *testing.B, mode string) float64 {
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
		return p99(lat)
	}
	modes := []string{"none", "watcher", "dashboard", "process"}
	iteration := 0
	for b.Loop() {
		p := map[string]float64{}
		for i := range modes {
			mode := modes[(i+iteration)%len(modes)]
			p[mode] = run(b, mode)
		}
		iteration++
		b.ReportMetric(p["none"], "p99_ms_without")
		b.ReportMetric(p["watcher"], "p99_ms_watcher")
		b.ReportMetric(p["dashboard"], "p99_ms_with")
		b.ReportMetric(p["process"], "p99_ms_process")
		b.ReportMetric(p["watcher"]/p["none"], "watcher_ratio")
		b.ReportMetric(p["dashboard"]/p["none"], "p99_ratio")
		b.ReportMetric(p["process"]/p["none"], "process_ratio")
		b.ReportMetric(notifies, "notifies/s")
		if len(toStream) > 0 {
			b.ReportMetric(p99(toStream), "stream_p99_ms")
			b.ReportMetric(slices.Max(toStream), "stream_max_ms")
		}
	}
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
