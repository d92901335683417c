package ui_test

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

// notifyWindow is migration 0017's: at most one NOTIFY of the events
// channel is decided per window (less a millisecond: the stamps are whole
// milliseconds).
const notifyWindow = 24 * time.Millisecond

// countNotifications LISTENs on the schema's events channel on a
// connection of its own and counts what arrives, until the test ends.
func countNotifications(t *testing.T, schema string) *atomic.Int64 {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, pgtest.URL())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{queue.EventsChannel(schema)}.Sanitize())
	require.NoError(t, err)
	var n atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if _, err := conn.WaitForNotification(ctx); err != nil {
				return
			}
			n.Add(1)
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		_ = conn.Close(context.Background())
	})
	return &n
}

// arrivals reads a stream's job events and records when each job's event
// of type typ arrived.
func arrivals(ch <-chan sseEvent, typ queue.EventType) (got <-chan map[int64]time.Time, want func(ids ...int64)) {
	out := make(chan map[int64]time.Time, 1)
	wantCh := make(chan int64, 1000)
	go func() {
		seen := map[int64]time.Time{}
		need := map[int64]bool{}
		for {
			select {
			case id := <-wantCh:
				need[id] = true
				continue
			case e, ok := <-ch:
				if !ok {
					return
				}
				if e.event != "job" {
					continue
				}
				var je struct {
					JobID int64           `json:"job_id"`
					Type  queue.EventType `json:"type"`
				}
				if json.Unmarshal([]byte(e.data), &je) != nil || je.Type != typ {
					continue
				}
				seen[je.JobID] = time.Now()
			}
			done := len(need) > 0
			for id := range need {
				if _, ok := seen[id]; !ok {
					done = false
				}
			}
			if done {
				out <- seen
				return
			}
		}
	}()
	return out, func(ids ...int64) {
		for _, id := range ids {
			wantCh <- id
		}
	}
}

// Transactions that commit close together share one notification
// (migration 0017 decides at most one per 25 ms, at commit), yet every
// event reaches an open stream with no periodic look (RefreshInterval an
// hour): the feed's trailing read picks up the transactions that committed
// without notifying. The commit-to-stream times are logged, not asserted.
func TestNotificationsShareAWindowYetEveryEventIsLive(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{RefreshInterval: time.Hour})
	notes := countNotifications(t, b.schema)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got, want := arrivals(stream(t, ctx, b.url+"/events", ""), queue.EventEnqueued)

	const n = 40
	committed := map[int64]time.Time{}
	var ids []int64
	start := time.Now()
	for range n {
		r, err := b.client.Enqueue(ctx, queue.NewJob{Queue: "burst", Kind: "k"})
		require.NoError(t, err)
		committed[r.ID] = time.Now()
		ids = append(ids, r.ID)
	}
	elapsed := time.Since(start)
	want(ids...)
	var seen map[int64]time.Time
	select {
	case seen = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("not every event reached the stream: a transaction that did not notify was never read")
	}
	require.Eventually(t, func() bool { return notes.Load() >= 1 }, 10*time.Second, time.Millisecond,
		"the first commit notifies")
	sent := notes.Load()
	var lat []float64
	for id, at := range committed {
		lat = append(lat, float64(seen[id].Sub(at).Microseconds())/1000)
	}
	slices.Sort(lat)
	t.Logf("%d transactions in %.0f ms: %d notifications; commit to stream median %.1f ms, max %.1f ms",
		n, float64(elapsed.Microseconds())/1000, sent, lat[len(lat)/2], lat[len(lat)-1])
	require.LessOrEqual(t, sent, int64(elapsed/notifyWindow)+1,
		"one commit after another: at most one notification per window")
}

// The decision is taken at commit, not when the event is written: a
// transaction that writes its event just after another's notification and
// commits later than the window notifies, so a watcher sees it at once.
func TestLateCommitNotifies(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{RefreshInterval: time.Hour})
	notes := countNotifications(t, b.schema)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got, want := arrivals(stream(t, ctx, b.url+"/events", ""), queue.EventEnqueued)

	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	first, err := b.client.Enqueue(ctx, queue.NewJob{Queue: "late", Kind: "k"})
	require.NoError(t, err)
	late, err := b.client.EnqueueTx(ctx, tx, queue.NewJob{Queue: "late", Kind: "k"})
	require.NoError(t, err)
	// Still open two windows later (written within one, most likely: a
	// decision taken when the event was written would have skipped it).
	_, err = tx.Exec(ctx, "SELECT pg_sleep(0.05)")
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	want(first.ID, late.ID)
	select {
	case <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("the late transaction's event did not reach the stream")
	}
	require.Eventually(t, func() bool { return notes.Load() == 2 }, 10*time.Second, time.Millisecond,
		"the late commit notified")
}
