package queue

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
)

// The claim cursor is kept only after a full batch of a backlog: a partial
// batch took every due job there was, so a claim from its cursor would find
// nothing and fall back to the head of the index, a second claim statement.
func TestClaimCursorOnlyAfterAFullBacklogBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema, jobs := flatSchema(t, pool)
	c, err := New(pool, Config{
		Schema:   schema,
		MaxBatch: 8,
		Queues:   map[string]QueueConfig{"q": {MaxWorkers: 4}},
		Handlers: map[string]Handler{"k": HandlerFunc(func(context.Context, pgx.Tx, *Job) error { return nil })},
	})
	require.NoError(t, err)
	l := c.loops["q"]
	l.observe("k", time.Microsecond) // a fast kind: claims take MaxBatch jobs
	require.Equal(t, 8, l.batchSize())
	insert := func(n int) {
		t.Helper()
		_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind) SELECT 'q', 'k' FROM generate_series(1, $1::int)`, n)
		require.NoError(t, err)
	}
	claim := func(s *loopState) int {
		t.Helper()
		b, _, err := l.claimNext(ctx, s)
		require.NoError(t, err)
		require.NotNil(t, b)
		defer c.untrack(b)
		defer b.release() // rolls back: the jobs stay pending
		return len(b.jobs)
	}

	insert(3)
	s := &loopState{source: sourceBusy}
	require.Equal(t, 3, claim(s))
	require.Nil(t, s.cursor, "after a partial batch")

	insert(10)
	s = &loopState{source: sourceBusy}
	require.Equal(t, 8, claim(s))
	require.NotNil(t, s.cursor, "after a full batch")
	var lastID int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM `+jobs+` ORDER BY id OFFSET 7 LIMIT 1`).Scan(&lastID))
	require.Equal(t, lastID, s.cursor.id)

	// A first look (not a backlog) takes one job and keeps no cursor.
	s = &loopState{source: sourceNotify}
	require.Equal(t, 1, claim(s))
	require.Nil(t, s.cursor, "after a claim of one")
}
