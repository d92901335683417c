package queue_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// A handler that leaves a goroutine using its tx (or a nested transaction
// of it) after it returned: the transaction then belongs to the job's
// completion or, in held mode, to the batch's next job, and in leased mode a late first use would begin a
// transaction on a pool connection nobody ends. The late use gets
// ErrTxAfterHandler (a pgx.ErrTxClosed) at once; every job succeeds once,
// and the pool's connections all come back.
func TestTxUsedAfterItsHandlerReturned(t *testing.T) {
	t.Parallel()
	bothModes(t, func(t *testing.T, leased bool) {
		var schema string
		var mu sync.Mutex
		var lateErrs []error
		var wg sync.WaitGroup
		cfg := queue.Config{
			Queues: map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
			Handlers: map[string]queue.Handler{
				"x": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
					return effect(ctx, tx, schema, j)
				}),
				"leak": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
					returned := make(chan struct{})
					late := tx
					wg.Go(func() {
						<-returned
						time.Sleep(20 * time.Millisecond)
						_, err := late.Exec(context.Background(), `SELECT 1`)
						mu.Lock()
						lateErrs = append(lateErrs, err)
						mu.Unlock()
					})
					defer close(returned)
					if j.ID%2 == 0 {
						// Half of them used the tx while running, through a
						// nested transaction, which the goroutine uses late.
						sub, err := tx.Begin(ctx)
						if err != nil {
							return err
						}
						late = sub
						if err := effect(ctx, sub, schema, j); err != nil {
							return err
						}
						return sub.Commit(ctx)
					}
					return nil
				}),
			},
		}
		if leased {
			cfg.LeasedKinds = []string{"x", "leak"}
		}
		e := newEnvOwnPool(t, 6, cfg)
		schema = e.schema
		e.run()
		var jobs []queue.NewJob
		for i := range 24 {
			kind := "x"
			if i%3 == 0 {
				kind = "leak"
			}
			jobs = append(jobs, queue.NewJob{Kind: kind})
		}
		_, err := e.c.EnqueueMany(context.Background(), jobs)
		require.NoError(t, err)
		waitFor(t, 30*time.Second, "every job succeeded", func() bool {
			return e.count(`state = 'succeeded'`) == len(jobs)
		})
		wg.Wait()
		require.Equal(t, len(jobs), e.count(`attempts = 1`), "each at its first attempt")
		mu.Lock()
		require.Len(t, lateErrs, 8)
		for _, err := range lateErrs {
			require.ErrorIs(t, err, queue.ErrTxAfterHandler)
			require.True(t, errors.Is(err, pgx.ErrTxClosed))
		}
		mu.Unlock()
		waitFor(t, 10*time.Second, "the pool's connections back", func() bool {
			return e.pool.Stat().AcquiredConns() <= int32(len(cfg.Queues)+3)
		})
	})
}
