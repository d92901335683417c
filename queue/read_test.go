package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

// readFixture enqueues jobs over two queues and two kinds and marks some
// failed with errors, one succeeded; it returns their ids in enqueue order.
func readFixture(t *testing.T, e *env) []int64 {
	t.Helper()
	ctx := context.Background()
	var ids []int64
	for i := range 12 {
		q, k := "qa", "ka"
		if i%2 == 1 {
			q = "qb"
		}
		if i%3 == 0 {
			k = "kb"
		}
		r, err := e.c.Enqueue(ctx, queue.NewJob{Queue: q, Kind: k, Payload: map[string]int{"i": i}})
		require.NoError(t, err)
		ids = append(ids, r.ID)
	}
	_, err := e.pool.Exec(ctx, `UPDATE `+e.table("jobs")+` SET state = 'failed', finished_at = now(),
		last_error = CASE WHEN id = $1 THEN 'Connection REFUSED by 100%_host' ELSE 'timeout' END WHERE id = ANY($2)`,
		ids[2], []int64{ids[2], ids[5], ids[7]})
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE `+e.table("jobs")+` SET state = 'succeeded', finished_at = now() WHERE id = $1`, ids[4])
	require.NoError(t, err)
	return ids
}

func listIDs(t *testing.T, c *queue.Client, p queue.JobListParams) []int64 {
	t.Helper()
	page, err := c.JobList(context.Background(), p)
	require.NoError(t, err)
	out := []int64{}
	for _, j := range page.Jobs {
		require.Empty(t, j.Payload, "list carries no payload")
		out = append(out, j.ID)
	}
	return out
}

func TestJobListFilters(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ids := readFixture(t, e)
	rev := func(idx ...int) []int64 {
		out := []int64{}
		for i := len(idx) - 1; i >= 0; i-- {
			out = append(out, ids[idx[i]])
		}
		return out
	}
	all := make([]int, 12)
	for i := range all {
		all[i] = i
	}
	require.Equal(t, rev(all...), listIDs(t, e.c, queue.JobListParams{}), "newest first")
	require.Equal(t, rev(2, 5, 7), listIDs(t, e.c, queue.JobListParams{State: queue.StateFailed}))
	require.Equal(t, rev(4), listIDs(t, e.c, queue.JobListParams{State: queue.StateSucceeded}))
	require.Equal(t, rev(1, 3, 5, 7, 9, 11), listIDs(t, e.c, queue.JobListParams{Queue: "qb"}))
	require.Equal(t, rev(0, 3, 6, 9), listIDs(t, e.c, queue.JobListParams{Kind: "kb"}))
	require.Equal(t, rev(3, 9), listIDs(t, e.c, queue.JobListParams{Kind: "kb", Queue: "qb"}))
	require.Equal(t, rev(5, 7), listIDs(t, e.c, queue.JobListParams{Queue: "qb", State: queue.StateFailed}))
	// Text in the error: case ignored, % and _ are plain characters.
	require.Equal(t, rev(2), listIDs(t, e.c, queue.JobListParams{ErrorContains: "connection refused"}))
	require.Equal(t, rev(2), listIDs(t, e.c, queue.JobListParams{ErrorContains: "100%_h"}))
	require.Equal(t, []int64{}, listIDs(t, e.c, queue.JobListParams{ErrorContains: "100%%"}))
	require.Equal(t, rev(5, 7), listIDs(t, e.c, queue.JobListParams{ErrorContains: "TIMEOUT"}))
	require.Equal(t, []int64{}, listIDs(t, e.c, queue.JobListParams{Queue: "nope"}))

	// Time range: created_at of the first six vs the rest.
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `UPDATE `+e.table("jobs")+` SET created_at = '2020-01-01T00:00:00Z' WHERE id = ANY($1)`, ids[:6])
	require.NoError(t, err)
	mid := time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC)
	require.Equal(t, rev(0, 1, 2, 3, 4, 5), listIDs(t, e.c, queue.JobListParams{CreatedBefore: mid}))
	require.Equal(t, rev(6, 7, 8, 9, 10, 11), listIDs(t, e.c, queue.JobListParams{CreatedAfter: mid}))
	require.Equal(t, rev(0, 1, 2, 3, 4, 5), listIDs(t, e.c, queue.JobListParams{
		CreatedAfter: time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), CreatedBefore: mid}), "after is inclusive")
	require.Equal(t, rev(2, 5), listIDs(t, e.c, queue.JobListParams{CreatedBefore: mid, State: queue.StateFailed}))
}

// Pages of a listing are disjoint, cover every job that existed when the
// first page was read, in order, while other jobs are enqueued between
// pages; the last page has no cursor.
func TestJobListPaginationStableUnderConcurrentInserts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	var want []int64
	for i := range 25 {
		r, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", Payload: map[string]int{"i": i}})
		require.NoError(t, err)
		want = append([]int64{r.ID}, want...)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k"}); err != nil {
				t.Errorf("enqueue: %v", err)
				return
			}
		}
	})
	var got []int64
	p := queue.JobListParams{Limit: 10, Before: want[0] + 1}
	pages := 0
	for {
		page, err := e.c.JobList(ctx, p)
		require.NoError(t, err)
		pages++
		for _, j := range page.Jobs {
			got = append(got, j.ID)
		}
		if page.Next == 0 {
			break
		}
		p.Before = page.Next
	}
	close(stop)
	wg.Wait()
	require.Equal(t, want, got)
	require.Equal(t, 3, pages)

	// From the newest while jobs are inserted: pages never repeat a job nor
	// skip one that existed when the first page was read.
	stop = make(chan struct{})
	inserting := make(chan struct{}) // closed after the first insert (or a failed one)
	wg.Go(func() {
		inserted := sync.OnceFunc(func() { close(inserting) })
		defer inserted()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k"}); err != nil {
				t.Errorf("enqueue: %v", err)
				return
			}
			inserted()
		}
	})
	// At least one insert lands while the pages are read (the pages alone
	// can be quicker than the goroutine's first insert).
	<-inserting
	got = nil
	p = queue.JobListParams{Limit: 7}
	for {
		page, err := e.c.JobList(ctx, p)
		require.NoError(t, err)
		for _, j := range page.Jobs {
			got = append(got, j.ID)
		}
		if page.Next == 0 {
			break
		}
		p.Before = page.Next
	}
	close(stop)
	wg.Wait()
	rows, err := e.pool.Query(ctx, `SELECT id FROM `+e.table("jobs")+` WHERE id <= $1 ORDER BY id DESC`, got[0])
	require.NoError(t, err)
	existed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, existed, got, "every job up to the first page's newest, once, newest first")

	// From the newest with concurrent inserts done: the first page starts
	// at the newest job, and following pages still end at the oldest.
	page, err := e.c.JobList(ctx, queue.JobListParams{Limit: 1000})
	require.NoError(t, err)
	require.Greater(t, page.Jobs[0].ID, want[0])
	require.Equal(t, want[len(want)-1], page.Jobs[len(page.Jobs)-1].ID)
}

// Bad filters are rejected with a *FilterError before any SQL: the client's
// pool is closed, so a statement would fail with another error.
func TestJobListRejectsBadFiltersBeforeSQL(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), pgtest.URL())
	require.NoError(t, err)
	pool.Close()
	c, err := queue.New(pool, queue.Config{})
	require.NoError(t, err)
	now := time.Now()
	for name, p := range map[string]queue.JobListParams{
		"State":           {State: "exploded"},
		"Limit":           {Limit: queue.MaxJobListLimit + 1},
		"Before":          {Before: -1},
		"CreatedBefore":   {CreatedAfter: now, CreatedBefore: now.Add(-time.Second)},
		"ErrorContains":   {ErrorContains: string(make([]byte, queue.MaxErrorFilterLen+1))},
		"Queue":           {Queue: "a\x00b"},
		"PayloadContains": {PayloadContains: json.RawMessage(`{"a":`)},
	} {
		_, err := c.JobList(context.Background(), p)
		var fe *queue.FilterError
		require.True(t, errors.As(err, &fe), "%s: %v", name, err)
		require.Equal(t, name, fe.Field)
	}
	_, err = c.JobList(context.Background(), queue.JobListParams{Limit: -3})
	var fe *queue.FilterError
	require.ErrorAs(t, err, &fe)
	_, err = c.QueueStats(context.Background(), queue.QueueStatsParams{ExactLimit: -2})
	require.ErrorAs(t, err, &fe)
	_, err = c.EventsAfter(context.Background(), 0, 0)
	require.ErrorAs(t, err, &fe)
}

// JobListTx sees the jobs its transaction enqueued before the commit;
// PayloadContains keeps jobs whose payload contains the JSON given, and
// WithPayload returns the payloads.
func TestJobListTxPayloadFilter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var ids []int64
	for _, to := range []string{"ann", "bob", "ann"} {
		r, err := e.c.EnqueueTx(ctx, tx, queue.NewJob{Kind: "mail", Payload: map[string]string{"to": to, "lang": "en"}})
		require.NoError(t, err)
		ids = append(ids, r.ID)
	}
	require.Empty(t, listIDs(t, e.c, queue.JobListParams{Kind: "mail"}), "outside the transaction: not yet")

	page, err := e.c.JobListTx(ctx, tx, queue.JobListParams{Kind: "mail", PayloadContains: json.RawMessage(`{"to": "ann"}`)})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 2)
	require.Equal(t, []int64{ids[2], ids[0]}, []int64{page.Jobs[0].ID, page.Jobs[1].ID}, "newest first")
	require.Empty(t, page.Jobs[0].Payload, "no payload unless asked")

	page, err = e.c.JobListTx(ctx, tx, queue.JobListParams{PayloadContains: json.RawMessage(`{"to": "bob"}`), WithPayload: true})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 1)
	require.Equal(t, ids[1], page.Jobs[0].ID)
	require.JSONEq(t, `{"to": "bob", "lang": "en"}`, string(page.Jobs[0].Payload))

	page, err = e.c.JobListTx(ctx, tx, queue.JobListParams{PayloadContains: json.RawMessage(`{"to": "cy"}`)})
	require.NoError(t, err)
	require.Empty(t, page.Jobs)
	_, err = e.c.JobListTx(ctx, nil, queue.JobListParams{})
	require.ErrorIs(t, err, queue.ErrInvalidConfig)
}

func TestJobGetEventsAndEventsAfter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	last0, err := e.c.LastEventID(ctx)
	require.NoError(t, err)
	require.Zero(t, last0)
	r, err := e.c.Enqueue(ctx, queue.NewJob{Queue: "g", Kind: "k", Payload: map[string]string{"x": "<script>"}})
	require.NoError(t, err)
	require.NoError(t, e.c.Cancel(ctx, r.ID))
	j, err := e.c.JobGet(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, queue.StateCancelled, j.State)
	require.Equal(t, "g", j.Queue)
	require.JSONEq(t, `{"x":"<script>"}`, string(j.Payload))
	_, err = e.c.JobGet(ctx, r.ID+1000)
	require.ErrorIs(t, err, queue.ErrNotFound)

	evs, err := e.c.JobEvents(ctx, r.ID)
	require.NoError(t, err)
	require.Len(t, evs, 2)
	require.Equal(t, queue.EventEnqueued, evs[0].Type)
	require.Equal(t, queue.EventCancelled, evs[1].Type)
	require.Equal(t, r.ID, evs[1].JobID)

	last, err := e.c.LastEventID(ctx)
	require.NoError(t, err)
	require.Equal(t, evs[1].ID, last)
	after, err := e.c.EventsAfter(ctx, evs[0].ID, 10)
	require.NoError(t, err)
	require.Equal(t, []int64{evs[1].ID}, []int64{after[0].ID})
	require.Len(t, after, 1)
	after, err = e.c.EventsAfter(ctx, 0, 1)
	require.NoError(t, err)
	require.Len(t, after, 1, "limit")
}

func TestQueueStatsCounts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	var jobs []queue.NewJob
	for range 7 {
		jobs = append(jobs, queue.NewJob{Queue: "sa", Kind: "k"})
	}
	for range 3 {
		jobs = append(jobs, queue.NewJob{Queue: "sa", Kind: "k", Priority: 5, Delay: time.Hour})
	}
	for range 4 {
		jobs = append(jobs, queue.NewJob{Queue: "sb", Kind: "k", Priority: -1})
	}
	res, err := e.c.EnqueueMany(ctx, jobs)
	require.NoError(t, err)
	// Two of sb failed, one succeeded just now, one succeeded long ago.
	_, err = e.pool.Exec(ctx, `UPDATE `+e.table("jobs")+` SET state = 'failed', finished_at = now() WHERE id = ANY($1)`,
		[]int64{res[10].ID, res[11].ID})
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE `+e.table("jobs")+` SET state = 'succeeded', finished_at = $2 WHERE id = $1`,
		res[12].ID, time.Now().Add(-time.Hour))
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE `+e.table("jobs")+` SET state = 'succeeded', finished_at = now() WHERE id = $1`, res[13].ID)
	require.NoError(t, err)
	// One of sa is running leased.
	_, err = e.pool.Exec(ctx, `UPDATE `+e.table("jobs")+` SET state = 'running', leased_by = 'x', lease_expires_at = now() + interval '1 hour' WHERE id = $1`, res[0].ID)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE `+e.table("jobs")+` SET run_after = now() - interval '30 seconds' WHERE id = $1`, res[1].ID)
	require.NoError(t, err)
	require.NoError(t, e.c.PauseQueue(ctx, "sc"))

	st, err := e.c.QueueStats(ctx, queue.QueueStatsParams{})
	require.NoError(t, err)
	require.Len(t, st, 3)
	require.Equal(t, "sa", st[0].Queue)
	require.Equal(t, int64(6), st[0].Pending)
	require.Equal(t, int64(3), st[0].Scheduled)
	require.Equal(t, int64(1), st[0].Running)
	require.InDelta(t, 30, st[0].OldestPendingAgeSec, 5)
	require.Empty(t, st[0].Estimated)
	require.Equal(t, queue.QueueStat{Queue: "sb", Failed: 2, SucceededLastMinute: 1}, st[1])
	require.Equal(t, queue.QueueStat{Queue: "sc", Paused: true}, st[2])

	// Above the exact limit, a counter is the planner's estimate, at least
	// the limit, and named as estimated.
	_, err = e.pool.Exec(ctx, `ANALYZE `+e.table("jobs"))
	require.NoError(t, err)
	st, err = e.c.QueueStats(ctx, queue.QueueStatsParams{ExactLimit: 2})
	require.NoError(t, err)
	require.Equal(t, []string{"pending", "scheduled"}, st[0].Estimated)
	require.GreaterOrEqual(t, st[0].Pending, int64(3))
	require.GreaterOrEqual(t, st[0].Scheduled, int64(3))
	require.Empty(t, st[1].Estimated)
	st, err = e.c.QueueStats(ctx, queue.QueueStatsParams{ExactLimit: -1})
	require.NoError(t, err)
	require.Equal(t, int64(6), st[0].Pending)
	require.Empty(t, st[0].Estimated)
}

// While a watcher is registered, a transaction that writes events sends one
// NOTIFY on EventsChannel (the first in 25 ms, migration 0017); without
// one, none.
func TestWatchEventsNotifies(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	conn, err := e.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `LISTEN `+queue.EventsChannel(e.schema))
	require.NoError(t, err)
	wait := func(d time.Duration) bool {
		wctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		_, err := conn.Conn().WaitForNotification(wctx)
		return err == nil
	}
	_, err = e.c.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	require.False(t, wait(300*time.Millisecond), "no watcher: no notification")
	require.NoError(t, e.c.WatchEvents(ctx, "t1"))
	_, err = e.c.EnqueueMany(ctx, []queue.NewJob{{Kind: "k"}, {Kind: "k"}})
	require.NoError(t, err)
	require.True(t, wait(10*time.Second), "watcher: notification")
	require.False(t, wait(300*time.Millisecond), "one per transaction")
	require.NoError(t, e.c.UnwatchEvents(ctx, "t1"))
	_, err = e.c.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	require.False(t, wait(300*time.Millisecond), "unwatched: no notification")
}

// JobGet and JobList report a job's unique scope and hold (the defaults
// spelled out, period for a UniquePeriod, none without a key), for a
// period its end (the one a duplicate is told, in each scope), and its
// metadata.
func TestJobInfoUniqueAndMetadata(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	res, err := e.c.EnqueueMany(ctx, []queue.NewJob{
		{Kind: "k"},
		{Kind: "k", UniqueKey: "a", Metadata: map[string]string{"tenant": "7"}},
		{Kind: "k", UniqueKey: "b", UniqueScope: queue.UniqueByQueue, UniqueHold: queue.UniqueHoldPending},
		{Kind: "k", UniqueKey: "c", UniquePeriod: time.Hour},
	})
	require.NoError(t, err)
	type want struct {
		scope queue.UniqueScope
		hold  queue.UniqueHold
		meta  map[string]string
	}
	wants := []want{
		{},
		{queue.UniqueByKind, queue.UniqueHoldActive, map[string]string{"tenant": "7"}},
		{queue.UniqueByQueue, queue.UniqueHoldPending, nil},
		{queue.UniqueByKind, queue.UniqueHoldPeriod, nil},
	}
	page, err := e.c.JobList(ctx, queue.JobListParams{})
	require.NoError(t, err)
	require.Len(t, page.Jobs, len(res))
	for i, r := range res {
		j, err := e.c.JobGet(ctx, r.ID)
		require.NoError(t, err)
		listed := page.Jobs[len(res)-1-i] // newest first
		require.Equal(t, r.ID, listed.ID)
		for _, got := range []queue.JobInfo{j, listed} {
			require.Equal(t, wants[i], want{got.UniqueScope, got.UniqueHold, got.Metadata}, "job %d", i)
			if i != 3 {
				require.Nil(t, got.HeldUntil, "job %d", i)
			}
		}
	}

	// The period's end is the one a duplicate is told.
	dup, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", UniqueKey: "c", UniquePeriod: time.Hour})
	require.NoError(t, err)
	require.True(t, dup.Duplicate)
	require.Equal(t, res[3].ID, dup.ID)
	j, err := e.c.JobGet(ctx, res[3].ID)
	require.NoError(t, err)
	require.NotNil(t, j.HeldUntil)
	require.True(t, dup.HeldUntil.Equal(*j.HeldUntil), "%s, %s", dup.HeldUntil, j.HeldUntil)
	page, err = e.c.JobList(ctx, queue.JobListParams{})
	require.NoError(t, err)
	require.Equal(t, res[3].ID, page.Jobs[0].ID)
	require.NotNil(t, page.Jobs[0].HeldUntil)
	require.True(t, dup.HeldUntil.Equal(*page.Jobs[0].HeldUntil))

	// In the queue scope too, and not a job of another kind with the same
	// key and period.
	byQueue, err := e.c.EnqueueMany(ctx, []queue.NewJob{
		{Kind: "k", UniqueKey: "d", UniqueScope: queue.UniqueByQueue, UniquePeriod: time.Hour},
		{Kind: "other", UniqueKey: "c", UniquePeriod: 2 * time.Hour},
	})
	require.NoError(t, err)
	dups, err := e.c.EnqueueMany(ctx, []queue.NewJob{
		{Kind: "k2", UniqueKey: "d", UniqueScope: queue.UniqueByQueue, UniquePeriod: time.Hour},
		{Kind: "other", UniqueKey: "c", UniquePeriod: 2 * time.Hour},
	})
	require.NoError(t, err)
	for i := range byQueue {
		require.True(t, dups[i].Duplicate)
		j, err := e.c.JobGet(ctx, byQueue[i].ID)
		require.NoError(t, err)
		require.NotNil(t, j.HeldUntil, "job %d", i)
		require.True(t, dups[i].HeldUntil.Equal(*j.HeldUntil), "job %d", i)
	}
	j, err = e.c.JobGet(ctx, res[3].ID)
	require.NoError(t, err)
	require.True(t, dup.HeldUntil.Equal(*j.HeldUntil), "kind k's key c keeps its own period")
}

// Keyset pages on a sequence: a job whose transaction took its id before a
// walk's first page and committed after the walk passed its place is not in
// that walk, even as it goes on; the next walk from the newest shows it.
func TestJobListLateCommitBelowCursor(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	var ids []int64 // a0, a, late (in tx), b
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	for i := range 4 {
		enqueue := e.c.Enqueue
		if i == 2 {
			enqueue = func(ctx context.Context, j queue.NewJob) (queue.EnqueueResult, error) {
				return e.c.EnqueueTx(ctx, tx, j)
			}
		}
		r, err := enqueue(ctx, queue.NewJob{Kind: "k"})
		require.NoError(t, err)
		ids = append(ids, r.ID)
	}
	var walk []int64
	p := queue.JobListParams{Limit: 1}
	for page := 0; page < 3; page++ { // b and a before the commit, a0 after
		if page == 2 {
			require.NoError(t, tx.Commit(ctx))
		}
		got, err := e.c.JobList(ctx, p)
		require.NoError(t, err)
		walk, p.Before = append(walk, got.Jobs[0].ID), got.Next
	}
	require.Equal(t, []int64{ids[3], ids[1], ids[0]}, walk, "the walk went past late's place before it committed")
	require.Equal(t, []int64{ids[3], ids[2], ids[1], ids[0]}, listIDs(t, e.c, queue.JobListParams{}), "the next walk from the newest")
}

// SkipSucceeded leaves the recent successes to a caller that counts them
// from the event log, as the dashboard does; EventsPerSecond seeds such a
// count: the events of one type per queue and whole second, from a time
// and up to an event id.
func TestQueueStatsSkipSucceededAndEventsPerSecond(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	res, err := e.c.EnqueueMany(ctx, []queue.NewJob{{Queue: "ra", Kind: "k"}, {Queue: "rb", Kind: "k"}, {Queue: "rb", Kind: "k"}})
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE `+e.table("jobs")+` SET state = 'succeeded', finished_at = now() WHERE id = $1`, res[0].ID)
	require.NoError(t, err)
	stats := func(p queue.QueueStatsParams) []queue.QueueStat {
		st, err := e.c.QueueStats(ctx, p)
		require.NoError(t, err)
		for i := range st {
			st[i].OldestPendingAgeSec = 0 // a few ms
		}
		return st
	}
	st := stats(queue.QueueStatsParams{})
	require.Equal(t, []queue.QueueStat{{Queue: "ra", SucceededLastMinute: 1}, {Queue: "rb", Pending: 2}}, st)
	st = stats(queue.QueueStatsParams{SkipSucceeded: true})
	require.Equal(t, []queue.QueueStat{{Queue: "rb", Pending: 2}}, st, "ra listed by its success alone")

	base := time.Now().Truncate(time.Second).Add(-10 * time.Second)
	ins := `INSERT INTO ` + e.table("events") + ` (job_id, type, queue, kind, attempt, at) VALUES ($1, $2, $3, 'k', 1, $4)`
	for _, ev := range []struct {
		job    int64
		typ, q string
		at     time.Time
	}{
		{res[0].ID, "succeeded", "ra", base.Add(200 * time.Millisecond)},
		{res[0].ID, "succeeded", "ra", base.Add(700 * time.Millisecond)},
		{res[1].ID, "succeeded", "rb", base.Add(1500 * time.Millisecond)},
		{res[1].ID, "failed", "rb", base.Add(500 * time.Millisecond)},
		{res[2].ID, "succeeded", "rb", base.Add(-30 * time.Second)}, // before since
	} {
		_, err = e.pool.Exec(ctx, ins, ev.job, ev.typ, ev.q, ev.at)
		require.NoError(t, err)
	}
	last, err := e.c.LastEventID(ctx)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, ins, res[2].ID, "succeeded", "rb", base) // after upToID
	require.NoError(t, err)

	got, err := e.c.EventsPerSecond(ctx, queue.EventSucceeded, base.Add(-5*time.Second), last)
	require.NoError(t, err)
	slices.SortFunc(got, func(a, b queue.EventsInSecond) int { return strings.Compare(a.Queue, b.Queue) })
	require.Equal(t, []queue.EventsInSecond{
		{Queue: "ra", Second: base.Unix(), Count: 2},
		{Queue: "rb", Second: base.Unix() + 1, Count: 1},
	}, got)
}

// Held attempts in flight are Running, not Pending: a due count of 6 below
// the exact limit of 10, with 5 jobs held, is exact (it was flagged an
// estimate and grew to 16: the held jobs were in the count the limit was
// checked on and in the estimate); and the oldest pending age is that of a
// job still waiting, not of one whose handler runs .
func TestQueueStatsLeaveOutHeldAttempts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	var ids []int64
	for range 11 {
		r, err := e.c.Enqueue(ctx, queue.NewJob{Queue: "h", Kind: "k", RunAfter: time.Now().Add(-time.Hour)})
		require.NoError(t, err)
		ids = append(ids, r.ID)
	}
	// Five of them are being run by a held claim (its attempt records), and
	// the six others were enqueued just now.
	_, err := e.pool.Exec(ctx, `INSERT INTO `+e.table("attempts")+` (job_id, queue, attempt, batch, client_id)
		SELECT id, 'h', 1, 5, 'x' FROM unnest($1::bigint[]) id`, ids[:5])
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE `+e.table("jobs")+` SET run_after = now() WHERE id = ANY($1)`, ids[5:])
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `ANALYZE `+e.table("jobs"))
	require.NoError(t, err)
	exact, err := e.c.QueueStats(ctx, queue.QueueStatsParams{ExactLimit: -1})
	require.NoError(t, err)
	require.Len(t, exact, 1)
	require.EqualValues(t, 6, exact[0].Pending)
	require.EqualValues(t, 5, exact[0].Running)
	require.Less(t, exact[0].OldestPendingAgeSec, 60.0, "the held jobs, due an hour ago, are not the oldest waiting")
	capped, err := e.c.QueueStats(ctx, queue.QueueStatsParams{ExactLimit: 10})
	require.NoError(t, err)
	require.Len(t, capped, 1)
	require.EqualValues(t, 6, capped[0].Pending)
	require.Empty(t, capped[0].Estimated, "every count is within the limit")
	over, err := e.c.QueueStats(ctx, queue.QueueStatsParams{ExactLimit: 3})
	require.NoError(t, err)
	require.Equal(t, []string{"pending"}, over[0].Estimated)
	require.GreaterOrEqual(t, over[0].Pending, int64(4), "above the limit")
	require.LessOrEqual(t, over[0].Pending, int64(8), "an estimate without the held jobs (11 rows, 5 held)")
}

// Created bounds finer than the microsecond created_at keeps: at or after,
// and before, a time half a microsecond after a job's creation.
func TestCreatedBoundsBelowAMicrosecond(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	r, err := e.c.Enqueue(ctx, queue.NewJob{Queue: "c", Kind: "k"})
	require.NoError(t, err)
	j, err := e.c.JobGet(ctx, r.ID)
	require.NoError(t, err)
	half := j.CreatedAt.Add(500 * time.Nanosecond)
	require.Equal(t, []int64{r.ID}, listIDs(t, e.c, queue.JobListParams{CreatedBefore: half}), "created before it")
	require.Empty(t, listIDs(t, e.c, queue.JobListParams{CreatedAfter: half}), "not created at or after it")
}
