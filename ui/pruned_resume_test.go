package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

// A page that resumes after an event id when events after it were pruned
// since (`pgwake events prune`) is told to reload: its counters and lists
// would otherwise miss what those events said. A page whose resume point
// is above everything pruned replays as usual.
func TestResumeAcrossPrunedEventsReloads(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	pool := pgtest.Pool(t)
	enqueue := func() int64 {
		t.Helper()
		r, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k"})
		require.NoError(t, err)
		return r.ID
	}
	lastEvent := func() int64 {
		t.Helper()
		id, err := b.client.LastEventID(ctx)
		require.NoError(t, err)
		return id
	}
	enqueue() // kept: its job is pending
	before := lastEvent()
	gone := enqueue()
	// The job is deleted (as jobs retention does): its events may go.
	_, err := pool.Exec(ctx, fmt.Sprintf(`DELETE FROM %q.jobs WHERE id = $1`, b.schema), gone)
	require.NoError(t, err)
	n, err := events.DeleteBefore(ctx, pool, b.schema, time.Now().Add(time.Second), 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the gone job's enqueued event is pruned")
	pruned, err := b.client.EventsPrunedThrough(ctx)
	require.NoError(t, err)
	require.Greater(t, pruned, before)
	require.Equal(t, before+1, pruned, "the gone job's event was pruned")
	after := pruned // a page that saw the pruned event
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A live job, seen by the feed (its event reaches a stream opened
	// before it) above both resume points.
	ch0 := stream(t, sctx, b.url+"/events", "")
	end, _ := untilMark(t, ch0, 20*time.Second)
	require.Equal(t, "mark", end)
	live := enqueue()
	awaitJobEvent(t, ch0, live)

	end, ids := untilMark(t, stream(t, sctx, b.url+"/events", fmt.Sprint(after)), 20*time.Second)
	require.Equal(t, "mark", end, "above the pruned event: replayed")
	require.Equal(t, []int64{live}, ids)

	end, _ = untilMark(t, stream(t, sctx, b.url+"/events", fmt.Sprint(before)), 20*time.Second)
	require.Equal(t, "reload", end, "below the pruned event: told to reload, not replayed with a gap")
}

// When how far events were pruned cannot be read (a role granted before
// migration 0025 without its line, here the table renamed away), a page
// still resumes, as before 0025, instead of failing every reconnect.
func TestResumeWithoutThePrunedMark(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch0 := stream(t, sctx, b.url+"/events", "")
	_, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	afterFirst, err := b.client.LastEventID(ctx)
	require.NoError(t, err)
	second, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	awaitJobEvent(t, ch0, second.ID)
	_, err = pgtest.Pool(t).Exec(ctx, fmt.Sprintf(`ALTER TABLE %q.events_pruned RENAME TO gone`, b.schema))
	require.NoError(t, err)
	_, err = b.client.EventsPrunedThrough(ctx)
	require.Error(t, err)
	end, ids := untilMark(t, stream(t, sctx, b.url+"/events", fmt.Sprint(afterFirst)), 20*time.Second)
	require.Equal(t, "mark", end, "not told to reload")
	require.Equal(t, []int64{second.ID}, ids, "replayed after the first job's event")
}

// A dashboard that starts after a prune deleted the newest events (a deploy,
// or a second `pgwake ui` behind the same address) starts above them: a page
// that resumes below them, at the newest event left, is told to reload
// instead of resuming with a gap; it was not, its resume point being the
// feed's newest event. A page the new dashboard renders is not told to
// reload when the next event comes: it was, for as long as the feed waited
// for the pruned ids (gapTimeout), each reload rendering the same point.
func TestResumeAfterAStartOverPrunedNewestEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	client, schema := migratedClient(t, pool)
	_, err := client.Enqueue(ctx, queue.NewJob{Kind: "k"}) // kept: its job is pending
	require.NoError(t, err)
	kept, err := client.LastEventID(ctx)
	require.NoError(t, err)
	gone, err := client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, fmt.Sprintf(`DELETE FROM %q.jobs WHERE id = $1`, schema), gone.ID)
	require.NoError(t, err)
	n, err := events.DeleteBefore(ctx, pool, schema, time.Now().Add(time.Second), 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	pruned, err := client.EventsPrunedThrough(ctx)
	require.NoError(t, err)
	require.Greater(t, pruned, kept, "the newest event was pruned")

	b := setup(t, ui.Config{Client: client})
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A resume at the feed's newest event sends neither mark nor reload.
	end := func(ch <-chan sseEvent) string {
		t.Helper()
		e, _ := untilMark(t, ch, 10*time.Second)
		return e
	}
	require.Equal(t, "reload", end(stream(t, sctx, b.url+"/events", fmt.Sprint(kept))),
		"a page of before the start that saw the kept event, not the pruned one")

	resp, err := http.Get(b.url + "/")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, resp.Body.Close())
	require.NoError(t, err)
	m := regexp.MustCompile(`data-after="(-?\d+)"`).FindSubmatch(body)
	require.NotNil(t, m, "the page's resume point")
	ch0 := stream(t, sctx, b.url+"/events", "")
	require.Equal(t, "mark", end(ch0))
	live, err := client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	awaitJobEvent(t, ch0, live.ID)
	require.Equal(t, "mark", end(stream(t, sctx, b.url+"/events?after="+string(m[1]), "")),
		"a page the dashboard rendered resumes")
}

// untilMark reads ch up to its first mark or reload and returns it with the
// job ids of the job events before it; "" when neither comes within wait.
func untilMark(t *testing.T, ch <-chan sseEvent, wait time.Duration) (string, []int64) {
	t.Helper()
	var ids []int64
	deadline := time.After(wait)
	for {
		select {
		case e, ok := <-ch:
			require.True(t, ok, "the stream ended")
			switch e.event {
			case "mark", "reload":
				return e.event, ids
			case "job":
				var je struct {
					JobID int64 `json:"job_id"`
				}
				require.NoError(t, json.Unmarshal([]byte(e.data), &je))
				ids = append(ids, je.JobID)
			}
		case <-deadline:
			return "", ids
		}
	}
}

// awaitJobEvent reads ch until job id's event comes (20 s at most).
func awaitJobEvent(t *testing.T, ch <-chan sseEvent, id int64) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case e, ok := <-ch:
			require.True(t, ok, "the stream ended")
			if e.event == "job" && strings.Contains(e.data, fmt.Sprintf(`"job_id":%d,`, id)) {
				return
			}
		case <-deadline:
			t.Fatalf("job %d's event did not reach the stream", id)
		}
	}
}
