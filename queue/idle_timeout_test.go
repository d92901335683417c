package queue_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

// A server (or role) idle_in_transaction_session_timeout shorter than a
// handler's work outside the database would kill the claim transaction and
// run the job again, for ever. The claim lifts it for its own transaction to
// the job timeout plus a margin, so the job runs once.
func TestIdleInTransactionTimeoutDoesNotKillClaims(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "300ms"
		c.MaxConns = 8
	})
	schema := pgtest.Schema(t)
	// Migrated through a pool of its own: a migration's transaction paused
	// for 300 ms by a machine busy with the parallel tests would be killed.
	_, err := migrations.Up(context.Background(), pgtest.NewPool(t, nil), schema)
	require.NoError(t, err)
	var runs atomic.Int32
	e := newEnvOn(t, pool, schema, queue.Config{
		Queues:     map[string]queue.QueueConfig{"default": {MaxWorkers: 4}},
		JobTimeout: 10 * time.Second,
		Handlers: map[string]queue.Handler{"slow": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			runs.Add(1)
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
				return err
			}
			time.Sleep(time.Second) // work outside the database, idle in transaction
			_, err := tx.Exec(ctx, `SELECT 1`)
			return err
		})},
	})
	r, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "slow"})
	require.NoError(t, err)
	e.run()
	waitFor(t, 30*time.Second, "job done", func() bool { return e.count(`id = $1 AND state <> 'pending'`, r.ID) == 1 })
	require.Equal(t, 1, e.count(`id = $1 AND state = 'succeeded' AND attempts = 1`, r.ID))
	require.Equal(t, int32(1), runs.Load(), "ran once")
}
