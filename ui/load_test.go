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
	"strings"
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
// dashboard served in this process (a Handler mounted in the worker's own
// service) with 10 streams open from another process (the browser tabs);
// and a dashboard in a process of its own with its 10 streams (as `pgwake
// ui` runs beside the workers). It
// reports each p99 and its ratio to the run without a dashboard, the
// NOTIFYs per second of the events channel while the in-process dashboard
// ran, and the p99 and max time from an 'enqueued' event's insert (its
// "at", the database's clock, same machine) to its arrival on a stream of
// that dashboard (the last run).
//
// With -benchtime Nx it runs each configuration N times and reports, per
// configuration, the p99 of all its runs' jobs together and the median of
// the runs' p99 ratios to the run without a dashboard in the same iteration.
//
//	go test -run '^$' -bench BenchmarkDashboardLatencyImpact -benchtime 8x ./ui/
func BenchmarkDashboardLatencyImpact(b *testing.B) {
	var notifies float64
	var toStream []float64 // the in-process dashboard's first stream's delays
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
			url := setup(b, ui.Config{Client: client}).url
			notes := countNotifications(b, schema)
			defer func(start time.Time, before int64) {
				notifies = float64(notes.Load()-before) / time.Since(start).Seconds()
			}(time.Now(), notes.Load())
			defer helperProcess(b, envStreamsURL+"="+url, &toStream)()
		case "process":
			defer helperProcess(b, envDashboardSchema+"="+schema, nil)()
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

// openStreams opens 10 streams on a dashboard's url, as 10 browser tabs,
// and returns what closes them; then *toStream holds the first stream's
// enqueued-event delays (ms).
func openStreams(tb testing.TB, url string, toStream *[]float64) func() {
	ctx, cancel := context.WithCancel(context.Background())
	var streams []<-chan sseEvent
	for range 10 {
		streams = append(streams, stream(tb, ctx, url+"/events", ""))
	}
	done := make(chan []float64)
	go func() { done <- enqueuedDelays(streams[0]) }()
	return func() {
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

// What TestDashboardProcess serves: a dashboard on a schema, or only the
// streams (the browser tabs) of a dashboard at a URL.
const (
	envDashboardSchema = "PGWAKE_UI_BENCH_SCHEMA"
	envStreamsURL      = "PGWAKE_UI_BENCH_STREAMS"
)

// helperProcess runs this test binary again as TestDashboardProcess with
// env (envDashboardSchema or envStreamsURL), waits until its streams are
// open, and returns what stops it; then *toStream (unless nil) holds the
// first stream's enqueued-event delays (ms).
func helperProcess(tb testing.TB, env string, toStream *[]float64) func() {
	cmd := exec.Command(os.Args[0], "-test.run", "^TestDashboardProcess$", "-test.count", "1")
	cmd.Env = append(os.Environ(), pgtest.EnvURL+"="+pgtest.URL(), env)
	stdin, err := cmd.StdinPipe()
	require.NoError(tb, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(tb, err)
	cmd.Stderr = os.Stderr
	require.NoError(tb, cmd.Start())
	lines := bufio.NewScanner(stdout)
	for lines.Scan() && lines.Text() != streamsReady {
	}
	return func() {
		_ = stdin.Close()
		for lines.Scan() {
			if d, ok := strings.CutPrefix(lines.Text(), delayLine); ok && toStream != nil {
				require.NoError(tb, json.Unmarshal([]byte(d), toStream))
			}
		}
		require.NoError(tb, cmd.Wait(), "the dashboard process")
	}
}

// TestDashboardProcess prints streamsReady once its streams are open, and
// delayLine followed by its first stream's delays (JSON) at the end.
const (
	streamsReady = "streams open"
	delayLine    = "delays: "
)

// TestDashboardProcess is BenchmarkDashboardLatencyImpact's other process:
// with envStreamsURL it opens 10 streams on that dashboard (the browser
// tabs); with envDashboardSchema it also serves the dashboard, on that
// schema. It runs until its standard input closes, and reports the first
// stream's delays. Without either variable (every ordinary test run) it is
// skipped.
func TestDashboardProcess(t *testing.T) {
	url, schema := os.Getenv(envStreamsURL), os.Getenv(envDashboardSchema)
	if url == "" && schema == "" {
		t.Skip("run by BenchmarkDashboardLatencyImpact")
	}
	if schema != "" {
		client, err := queue.New(pgtest.Pool(t), queue.Config{Schema: schema})
		require.NoError(t, err)
		url = setup(t, ui.Config{Client: client}).url
	}
	var toStream []float64
	stop := openStreams(t, url, &toStream)
	fmt.Println(streamsReady)
	_, _ = io.Copy(io.Discard, os.Stdin)
	stop()
	require.NotEmpty(t, toStream, "the streams saw the jobs")
	out, err := json.Marshal(toStream)
	require.NoError(t, err)
	fmt.Println(delayLine + string(out))
}
