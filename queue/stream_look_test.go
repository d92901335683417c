package queue

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
)

// tripCounter is a pgx tracer that counts round trips (a batch or a query)
// and keeps the statements of the batches.
type tripCounter struct {
	mu    sync.Mutex
	trips int
	stmts []string
}

func (r *tripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trips++
	r.stmts = append(r.stmts, d.SQL)
	return ctx
}
func (r *tripCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *tripCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trips++
	return ctx
}
func (r *tripCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stmts = append(r.stmts, d.SQL)
}
func (r *tripCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// take returns the round trips and statements since the last take.
func (r *tripCounter) take() (int, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, s := r.trips, r.stmts
	r.trips, r.stmts = 0, nil
	return n, s
}

// A look of a loop marked busy by a stream that finds nothing costs one
// round trip: it keeps its claim transaction open instead of ending it with
// the look-up of the earliest delayed job, and the next look rolls it back
// and begins its own in its round trip (ROLLBACK AND CHAIN), with a new
// now(): a delayed job that fell due in between is claimed. A look outside
// a stream still asks for the earliest delayed job (two round trips): the
// loop sleeps on it.
func TestAnEmptyLookOfAStreamIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := &tripCounter{}
	pool := pgtest.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = rec })
	schema, jobs := flatSchema(t, pool)
	c, err := New(pool, Config{
		Schema:   schema,
		Queues:   map[string]QueueConfig{"q": {MaxWorkers: 2}},
		Handlers: map[string]Handler{"k": HandlerFunc(func(context.Context, pgx.Tx, *Job) error { return nil })},
	})
	require.NoError(t, err)
	l := c.loops["q"]
	var due time.Time
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+jobs+` (queue, kind, run_after)
		VALUES ('q', 'k', clock_timestamp() + interval '1500 milliseconds') RETURNING run_after`).Scan(&due))

	rec.take() // the schema's

	// Outside a stream: the claim, then the earliest delayed job.
	idle := &loopState{source: sourceBusy}
	b, next, err := l.claimNext(ctx, idle)
	require.NoError(t, err)
	require.Nil(t, b)
	require.False(t, next.IsZero(), "the delayed job's time")
	require.Nil(t, idle.stream.open)
	trips, stmts := rec.take()
	require.Equal(t, 2, trips, "%q", stmts)
	require.Contains(t, stmts, c.sql.next)

	s := &loopState{source: sourceBusy, waiter: waiterBusy, lingerTill: time.Now().Add(time.Hour)}
	t.Cleanup(s.stream.drop)
	look := func() *batch {
		t.Helper()
		s.rate = rateWindow{start: time.Now(), fast: true} // a stream runs
		b, next, err := l.claimNext(ctx, s)
		require.NoError(t, err)
		if b != nil {
			t.Cleanup(b.release)
		}
		require.True(t, next.IsZero())
		trips, stmts := rec.take()
		require.Equal(t, 1, trips, "%q", stmts)
		require.NotContains(t, stmts, c.sql.next)
		return b
	}
	for i := range 3 {
		require.Nil(t, look(), "look %d: nothing is due yet", i)
		require.NotNil(t, s.stream.open, "look %d keeps its transaction", i)
	}
	time.Sleep(time.Until(due) + 50*time.Millisecond)
	b = look()
	require.NotNil(t, b, "the delayed job, due since the transaction the look chained on began")
	require.Len(t, b.jobs, 1)
	require.Nil(t, s.stream.open)
	c.untrack(b)
	b.release()
	_, err = pool.Exec(ctx, `DELETE FROM `+jobs)
	require.NoError(t, err)
	rec.take() // the rollback's and the delete's

	// A look that ends the stream's transaction another way.
	require.Nil(t, look())
	require.NotNil(t, s.stream.open)
	pid := s.stream.open.conn.Conn().PgConn().PID()
	const xact = `SELECT state, xact_start FROM pg_catalog.pg_stat_activity WHERE pid = $1`
	var state string
	var began, after *time.Time
	require.NoError(t, pool.QueryRow(ctx, xact, pid).Scan(&state, &began))
	require.Equal(t, "idle in transaction", state)
	s.stream.drop()
	require.NoError(t, pool.QueryRow(ctx, xact, pid).Scan(&state, &after))
	require.NotEqual(t, "idle in transaction", state)
	require.True(t, after == nil || !after.Equal(*began), "the kept transaction is rolled back")
}
