package queue_test

import (
	"context"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

// pauseSettle is how long BenchmarkPauseResume keeps its queue paused after
// the worker met the pause: handlers of a batch claimed before the pause
// start meanwhile, and count as claims after it.
const pauseSettle = 50 * time.Millisecond

// BenchmarkPauseResume pauses and resumes a queue with a backlog b.N times,
// through another client, while one worker (poll interval a minute, so it
// learns of both by notification) claims, with a 1 ms handler. It reports,
// in ms, p50 and p99 of:
//
//   - look: PauseQueue returned -> the worker's dispatcher found the queue
//     paused (it claims nothing more);
//
//   - last: PauseQueue returned -> the last handler start before the resume
//     (jobs of a batch claimed before the pause still start);
//
//   - resume: ResumeQueue returned -> the first handler start.
//
//     go test -run '^$' -bench PauseResume -benchtime 200x -count 5 ./queue/
func BenchmarkPauseResume(b *testing.B) {
	ctx := context.Background()
	schema := lateSchema(b)
	var last atomic.Int64 // unix ns of the latest handler start
	w, err := queue.New(pgtest.Pool(b), queue.Config{
		Schema:       schema,
		Queues:       map[string]queue.QueueConfig{"pb": {MaxWorkers: 2}},
		PollInterval: time.Minute,
		Handlers: map[string]queue.Handler{"work": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			last.Store(time.Now().UnixNano())
			time.Sleep(time.Millisecond) // so the backlog lasts
			return nil
		})},
	})
	if err != nil {
		b.Fatal(err)
	}
	admin, err := queue.New(pgtest.Pool(b), queue.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	// A backlog the cycles do not drain: a cycle claims for about 100 ms, at
	// most 2 jobs a ms.
	jobs := make([]queue.NewJob, 1000)
	for i := range jobs {
		jobs[i] = queue.NewJob{Queue: "pb", Kind: "work"}
	}
	for range 5 + b.N/10 {
		if _, err := admin.EnqueueMany(ctx, jobs); err != nil {
			b.Fatal(err)
		}
	}
	signals := queue.EnableTestSignals(w)
	defer runClient(b, w)()
	waitStart := func(after time.Time) time.Time {
		for deadline := time.Now().Add(30 * time.Second); ; {
			if at := time.Unix(0, last.Load()); at.After(after) {
				return at
			}
			if time.Now().After(deadline) {
				b.Fatal("no handler started within 30 s")
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	waitStart(time.Unix(0, 0))
	var looks, lasts, resumes []time.Duration
	b.ResetTimer()
	for range b.N {
		signals.ForgetPausedLooks() // looks of the last pause, after a wake-up
		if err := admin.PauseQueue(ctx, "pb"); err != nil {
			b.Fatal(err)
		}
		paused := time.Now()
		signals.WaitPausedLooks(b, "pb", 1)
		looks = append(looks, time.Since(paused))
		time.Sleep(pauseSettle)
		lasts = append(lasts, max(0, time.Unix(0, last.Load()).Sub(paused)))
		if err := admin.ResumeQueue(ctx, "pb"); err != nil {
			b.Fatal(err)
		}
		resumed := time.Now()
		resumes = append(resumes, waitStart(resumed).Sub(resumed))
		time.Sleep(pauseSettle) // claims go on a while
	}
	b.StopTimer()
	for _, m := range []struct {
		name string
		ds   []time.Duration
	}{{"look", looks}, {"last", lasts}, {"resume", resumes}} {
		sort.Slice(m.ds, func(i, j int) bool { return m.ds[i] < m.ds[j] })
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(ms(m.ds[len(m.ds)/2]), m.name+"-p50-ms")
		b.ReportMetric(ms(m.ds[len(m.ds)*99/100]), m.name+"-p99-ms")
	}
	b.ReportMetric(0, "ns/op")
}
