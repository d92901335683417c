package ui_test

import (
	"context"
	"encoding/json"
	"maps"
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
func countNotifications(t testing.TB, schema string) *atomic.Int64 {
	t.Helper()
	n, stop := countNotificationsUntil(t, schema)
	t.Cleanup(stop)
	return n
}

// countNotificationsUntil is countNotifications until stop is called.
func countNotificationsUntil(t testing.TB, schema string) (*atomic.Int64, func()) {
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
	var once sync.Once
	return &n, func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			_ = conn.Close(context.Background())
		})
	}
}

// arrival is one job event as a stream delivered it, and when.
type arrival struct {
	jobID int64
	at    time.Time
}

// arrivals forwards a stream's job events of type typ, with the time each
// arrived.
func arrivals(ch <-chan sseEvent, typ queue.EventType) <-chan arrival {
	out := make(chan arrival, 100000)
	go func() {
		defer close(out)
		for e := range ch {
			var je struct {
				JobID int64           `json:"job_id"`
				Type  queue.EventType `json:"type"`
			}
			if e.event != "job" || json.Unmarshal([]byte(e.data), &je) != nil || je.Type != typ {
				continue
			}
			out <- arrival{jobID: je.JobID, at: time.Now()}
		}
	}()
	return out
}

// awaitJobs reads arrivals until every job of ids has come, and returns
// when each came. It fails the test after deadline.
func awaitJobs(t *testing.T, ch <-chan arrival, deadline time.Duration, why string, ids ...int64) map[int64]time.Time {
	t.Helper()
	need := map[int64]bool{}
	for _, id := range ids {
		need[id] = true
	}
	seen := map[int64]time.Time{}
	timeout := time.After(deadline)
	for len(need) > 0 {
		select {
		case a, ok := <-ch:
			require.True(t, ok, "stream ended")
			if need[a.jobID] {
				delete(need, a.jobID)
				seen[a.jobID] = a.at
			}
		case <-timeout:
			t.Fatalf("%s: %d of %d events never reached the stream", why, len(need), len(ids))
		}
	}
	return seen
}

// logLatency logs the commit-to-stream times (not asserted: the machine
// may be slow).
func logLatency(t *testing.T, what string, committed, seen map[int64]time.Time) {
	t.Helper()
	var lat []float64
	for id, at := range committed {
		lat = append(lat, float64(seen[id].Sub(at).Microseconds())/1000)
	}
	slices.Sort(lat)
	t.Logf("%s: commit to stream median %.1f ms, max %.1f ms", what, lat[len(lat)/2], lat[len(lat)-1])
}

// Transactions that commit one after another, faster than migration
// 0017's window, share notifications: it decides at most one per 25 ms.
// Every event still reaches an open stream with no periodic look
// (RefreshInterval an hour).
func TestNotificationsShareAWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{RefreshInterval: time.Hour})
	notes := countNotifications(t, b.schema)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := arrivals(stream(t, ctx, b.url+"/events", ""), queue.EventEnqueued)

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
	seen := awaitJobs(t, got, 30*time.Second, "a burst", ids...)
	require.Eventually(t, func() bool { return notes.Load() >= 1 }, 10*time.Second, time.Millisecond,
		"the first commit notifies")
	sent := notes.Load()
	t.Logf("%d transactions in %.0f ms: %d notifications", n, float64(elapsed.Microseconds())/1000, sent)
	logLatency(t, "burst", committed, seen)
	require.LessOrEqual(t, sent, int64(elapsed/notifyWindow)+1,
		"one commit after another: at most one notification per window")
}

// A transaction that committed without notifying (another had, less than
// 25 ms before) reaches an open stream although nothing commits after it:
// the feed reads again after its notified read. Each transaction here
// commits as soon as the previous one's event reached the stream, then
// waits for its own, with no periodic look (RefreshInterval an hour), so
// one whose event came only from a later transaction's notification would
// never come. The skipped ones and the commit-to-stream times are logged.
func TestSkippedNotificationStillLive(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{RefreshInterval: time.Hour})
	notes := countNotifications(t, b.schema)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := arrivals(stream(t, ctx, b.url+"/events", ""), queue.EventEnqueued)

	const n = 30
	committed, seen := map[int64]time.Time{}, map[int64]time.Time{}
	for range n {
		r, err := b.client.Enqueue(ctx, queue.NewJob{Queue: "pingpong", Kind: "k"})
		require.NoError(t, err)
		committed[r.ID] = time.Now()
		maps.Copy(seen, awaitJobs(t, got, 30*time.Second, "the last transaction committed", r.ID))
	}
	require.Eventually(t, func() bool { return notes.Load() >= 1 }, 10*time.Second, time.Millisecond,
		"the first commit notifies")
	t.Logf("%d transactions, each after the previous one's event came: %d notified, %d did not",
		n, notes.Load(), n-notes.Load())
	logLatency(t, "one at a time", committed, seen)
}

// The decision is taken at commit, not when the event is written: a
// transaction that writes its event just after another's notification and
// commits later than the window notifies.
func TestLateCommitNotifies(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{RefreshInterval: time.Hour})
	notes := countNotifications(t, b.schema)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := arrivals(stream(t, ctx, b.url+"/events", ""), queue.EventEnqueued)

	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	first, err := b.client.Enqueue(ctx, queue.NewJob{Queue: "late", Kind: "k"})
	require.NoError(t, err)
	late, err := b.client.EnqueueTx(ctx, tx, queue.NewJob{Queue: "late", Kind: "k"})
	require.NoError(t, err)
	// Still open after the feed's trailing read (its event written within
	// the window of the first's notification, most likely: a decision taken
	// then would skip, and the event would wait for another commit).
	_, err = tx.Exec(ctx, "SELECT pg_sleep(0.1)")
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	awaitJobs(t, got, 30*time.Second, "a late commit", first.ID, late.ID)
	require.Eventually(t, func() bool { return notes.Load() == 2 }, 10*time.Second, time.Millisecond,
		"both commits notified")
}
