package ui_test

import (
	"context"
	"encoding/json"
	"math"
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
// call to handler start) at 200 jobs/s for 10 s with no dashboard, then with
// only a watcher registered (the NOTIFYs, no reads), then with a dashboard
// feeding 10 open streams; it reports the p99s and their ratios to the first,
// the NOTIFYs per second of the events channel while the dashboard ran, and
// the p99 and max time from an 'enqueued' event's insert (its "at", the
// database's clock, same machine) to its arrival on a stream.
//
//	go test -run '^$' -bench BenchmarkDashboardLatencyImpact -benchtime 1x -count 3 ./ui/
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
		if mode == "watcher" {
			require.NoError(b, client.WatchEvents(context.Background(), "bench"))
		}
		if mode == "dashboard" {
			bb := setup(b, ui.Config{Client: client})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var streams []<-chan sseEvent
			for range 10 {
				streams = append(streams, stream(b, ctx, bb.url+"/events", ""))
			}
			done := make(chan []float64)
			go func() {
				var lat []float64
				for e := range streams[0] {
					var je struct {
						Type queue.EventType `json:"type"`
						At   time.Time       `json:"at"`
					}
					if e.event == "job" && json.Unmarshal([]byte(e.data), &je) == nil && je.Type == queue.EventEnqueued {
						lat = append(lat, float64(time.Since(je.At).Microseconds())/1000)
					}
				}
				done <- lat
			}()
			defer func() { cancel(); toStream = <-done }()
			notes := countNotifications(b, schema)
			defer func(start time.Time, before int64) {
				notifies = float64(notes.Load()-before) / time.Since(start).Seconds()
			}(time.Now(), notes.Load())
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
		slices.Sort(lat)
		return lat[int(math.Ceil(0.99*float64(len(lat))))-1]
	}
	for b.Loop() {
		without := run(b, "none")
		watcher := run(b, "watcher")
		with := run(b, "dashboard")
		b.ReportMetric(without, "p99_ms_without")
		b.ReportMetric(watcher, "p99_ms_watcher")
		b.ReportMetric(with, "p99_ms_with")
		b.ReportMetric(watcher/without, "watcher_ratio")
		b.ReportMetric(with/without, "p99_ratio")
		b.ReportMetric(notifies, "notifies/s")
		if len(toStream) > 0 {
			slices.Sort(toStream)
			b.ReportMetric(toStream[int(math.Ceil(0.99*float64(len(toStream))))-1], "stream_p99_ms")
			b.ReportMetric(toStream[len(toStream)-1], "stream_max_ms")
		}
	}
}
