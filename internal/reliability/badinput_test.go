package reliability

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// TestOversizedAndMalformedPayloads: payloads over the limit, not JSON, or
// JSON that PostgreSQL's jsonb cannot store are refused, and one bad job in
// a batch means nothing of the batch is written.
func TestOversizedAndMalformedPayloads(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	ctx := context.Background()
	c, err := queue.New(w.admin, queue.Config{Schema: w.schema})
	require.NoError(t, err)
	jobs := func() int { return w.count(`SELECT count(*) FROM ` + w.table("jobs")) }

	// Exactly at the limit (1 MiB) is fine; one byte more is not.
	at := json.RawMessage(`{"s":"` + strings.Repeat("a", 1<<20-8) + `"}`)
	require.Len(t, at, 1<<20)
	_, err = c.Enqueue(ctx, queue.NewJob{Kind: "k", Payload: at})
	require.NoError(t, err)
	over := json.RawMessage(`{"s":"` + strings.Repeat("a", 1<<20-7) + `"}`)
	_, err = c.Enqueue(ctx, queue.NewJob{Kind: "k", Payload: over})
	require.ErrorIs(t, err, queue.ErrPayloadTooLarge)
	_, err = c.Enqueue(ctx, queue.NewJob{Kind: "k", Payload: json.RawMessage(`[` + strings.Repeat(`"x",`, 300000) + `1]`)})
	require.ErrorIs(t, err, queue.ErrPayloadTooLarge)
	require.Equal(t, 1, jobs())

	for _, p := range []any{
		json.RawMessage(`{`), json.RawMessage(`{"a":1,}`), json.RawMessage(`NaN`), json.RawMessage(`'x'`),
		json.RawMessage("\xff"), json.RawMessage(`{"a":"\u0000"}`), json.RawMessage(`{"\u0000":1}`),
		json.RawMessage(`{"a":1} {"b":2}`), []byte(`{"a":`), "a Go string", make(chan int),
		json.RawMessage(`{"a":"` + "\xff\xfe" + `"}`), // invalid UTF-8 inside a string
	} {
		_, err := c.Enqueue(ctx, queue.NewJob{Kind: "k", Payload: p})
		require.ErrorIs(t, err, queue.ErrInvalidPayload, "payload %T %.40v", p, p)
	}
	// One bad job in a batch: the batch is refused whole, before any write.
	_, err = c.EnqueueMany(ctx, []queue.NewJob{{Kind: "k"}, {Kind: "k", Payload: json.RawMessage(`{`)}, {Kind: "k"}})
	var je *queue.JobError
	require.ErrorAs(t, err, &je)
	require.Equal(t, 1, je.Index)
	require.Equal(t, 1, jobs())

	// JSON that Go accepts but jsonb may not: the enqueue fails as a whole
	// (an error, never a partial write) or stores the value faithfully.
	for _, p := range []string{
		strings.Repeat("[", 100000) + strings.Repeat("]", 100000), // deeper than jsonb's stack allows
		`{"n":1e1000000}`, // beyond numeric's range
		`{"n":-0.0000000000000000000000000000000000000000001}`,
		`{"a":1,"a":2}`, // duplicate keys: jsonb keeps the last
	} {
		n := jobs()
		r, err := c.Enqueue(ctx, queue.NewJob{Kind: "k", Payload: json.RawMessage(p)})
		if err != nil {
			t.Logf("refused %.30q...: %v", p, oneLine(err))
			require.Equal(t, n, jobs(), "a refused enqueue wrote something")
			continue
		}
		var stored string
		require.NoError(t, w.admin.QueryRow(ctx, `SELECT payload::text FROM `+w.table("jobs")+` WHERE id = $1`, r.ID).Scan(&stored))
		require.True(t, json.Valid([]byte(stored)))
		t.Logf("stored %.30q... as %.40q", p, stored)
	}
}

func oneLine(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return s
}

// TestMegabyteHandlerError: a handler error (or panic value) of megabytes,
// with NUL bytes and invalid UTF-8, is stored truncated to MaxErrorBytes as
// valid text, in the job and in its failed event.
func TestMegabyteHandlerError(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	ctx := context.Background()
	huge := strings.Repeat("boom\x00\xff é ", 1<<20/8) // ~1.4 MB
	pool := w.pool(appWorker, 6)
	c, err := queue.New(pool, queue.Config{
		Schema:       w.schema,
		Queues:       map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		PollInterval: 100 * time.Millisecond,
		Handlers: map[string]queue.Handler{
			"err":   queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return errors.New(huge) }),
			"panic": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { panic(huge) }),
		},
	})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	for _, k := range []string{"err", "panic"} {
		_, err := c.Enqueue(ctx, queue.NewJob{Kind: k, MaxAttempts: 1})
		require.NoError(t, err)
	}
	deadline := time.Now().Add(time.Minute)
	for w.count(`SELECT count(*) FROM `+w.table("jobs")+` WHERE state = 'failed'`) < 2 {
		require.True(t, time.Now().Before(deadline), "jobs did not fail")
		time.Sleep(20 * time.Millisecond)
	}
	rows, err := w.admin.Query(ctx, `SELECT j.kind, j.last_error, e.data->>'error' FROM `+w.table("jobs")+` j
		JOIN `+w.table("events")+` e ON e.job_id = j.id AND e.type = 'failed'`)
	require.NoError(t, err)
	n := 0
	for rows.Next() {
		var kind, lastErr, evErr string
		require.NoError(t, rows.Scan(&kind, &lastErr, &evErr))
		for _, s := range []string{lastErr, evErr} {
			require.LessOrEqual(t, len(s), 4096, "%s: stored error not truncated", kind)
			require.True(t, utf8.ValidString(s))
			require.NotContains(t, s, "\x00")
			require.True(t, strings.HasSuffix(s, "[truncated]"), "%s: %q", kind, s[len(s)-40:])
		}
		n++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 2, n)
}

// TestSchedulesAtTheEdges: run_after in the far past runs at once, in the
// far future waits, outside years 1..9999 or with a negative delay is
// refused; a job scheduled centuries ahead does not make the worker spin.
func TestSchedulesAtTheEdges(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	ctx := context.Background()
	ran := make(chan string, 10)
	pool := w.pool(appWorker, 6)
	c, err := queue.New(pool, queue.Config{
		Schema:       w.schema,
		Queues:       map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		PollInterval: time.Second,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(_ context.Context, _ pgx.Tx, j *queue.Job) error {
			ran <- j.UniqueKey
			return nil
		})},
	})
	require.NoError(t, err)

	for _, bad := range []queue.NewJob{
		{Kind: "k", Delay: -time.Nanosecond},
		{Kind: "k", Delay: -24 * time.Hour},
		{Kind: "k", RunAfter: time.Date(0, 12, 31, 0, 0, 0, 0, time.UTC)},
		{Kind: "k", RunAfter: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Kind: "k", RunAfter: time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		_, err := c.Enqueue(ctx, bad)
		require.ErrorIs(t, err, queue.ErrInvalidSchedule, "%+v", bad)
	}
	require.Zero(t, w.count(`SELECT count(*) FROM `+w.table("jobs")))

	east := time.FixedZone("UTC+14", 14*3600)
	for _, j := range []queue.NewJob{
		{Kind: "k", UniqueKey: "future-9999", RunAfter: time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)},
		{Kind: "k", UniqueKey: "future-500y", RunAfter: time.Now().AddDate(500, 0, 0)},
		{Kind: "k", UniqueKey: "past-0001", RunAfter: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Kind: "k", UniqueKey: "past-1970", RunAfter: time.Unix(0, 0).In(east)},
	} {
		_, err := c.Enqueue(ctx, j)
		require.NoError(t, err, "%+v", j)
	}
	var stored time.Time
	require.NoError(t, w.admin.QueryRow(ctx, `SELECT run_after FROM `+w.table("jobs")+` WHERE unique_key = 'past-1970'`).Scan(&stored))
	require.True(t, stored.Equal(time.Unix(0, 0)), "run_after in another zone stored as %s", stored)

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	got := map[string]bool{}
	for range 2 {
		select {
		case k := <-ran:
			got[k] = true
		case <-time.After(time.Minute):
			t.Fatal("past jobs did not run")
		}
	}
	require.Equal(t, map[string]bool{"past-0001": true, "past-1970": true}, got)

	// Idle now, with jobs due in centuries: the worker must sleep, not spin.
	// Each look at the queue acquires a connection from the worker's pool.
	time.Sleep(500 * time.Millisecond)
	a0 := pool.Stat().AcquireCount()
	time.Sleep(2 * time.Second)
	looks := pool.Stat().AcquireCount() - a0
	t.Logf("connection acquisitions in 2s of idling with far-future jobs: %d", looks)
	require.Less(t, looks, int64(40), "the worker spins on a job due centuries from now")
	require.Equal(t, 2, w.count(`SELECT count(*) FROM `+w.table("jobs")+` WHERE state = 'pending'`))

	// The longest delay a time.Duration holds (~292 years) is accepted.
	_, err = c.Enqueue(ctx, queue.NewJob{Kind: "k", UniqueKey: "future-292y", Delay: time.Duration(1<<63 - 1)})
	require.NoError(t, err)
	require.Equal(t, 3, w.count(`SELECT count(*) FROM `+w.table("jobs")+` WHERE state = 'pending'`))
}
