package queue_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/queue"
)

// A handler that drops its connection's prepared statements (DEALLOCATE
// ALL, as some migration tools and ORMs do) leaves pgwake's statement cache
// describing statements the server no longer has. The job still succeeds
// once, and the jobs that come after it on the same connections run too.
// Both modes, the statement sent through Exec (pgwake resynchronizes at
// once) or through Query, QueryRow or SendBatch (when the handler returns).
func TestHandlerDeallocatingStatements(t *testing.T) {
	t.Parallel()
	deallocate := map[string]func(ctx context.Context, tx pgx.Tx) error{
		"exec": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "DEALLOCATE ALL")
			return err
		},
		"query": func(ctx context.Context, tx pgx.Tx) error {
			rows, err := tx.Query(ctx, "DEALLOCATE ALL")
			if err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		},
		"queryrow": func(ctx context.Context, tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, "DEALLOCATE ALL").Scan(); !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			return nil
		},
		"batch": func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue("DEALLOCATE ALL")
			return tx.SendBatch(ctx, b).Close()
		},
	}
	bothModes(t, func(t *testing.T, leased bool) {
		for _, via := range []string{"exec", "query", "queryrow", "batch"} {
			t.Run(via, func(t *testing.T) {
				t.Parallel()
				testHandlerDeallocating(t, leased, deallocate[via])
			})
		}
	})
}

func testHandlerDeallocating(t *testing.T, leased bool, deallocate func(ctx context.Context, tx pgx.Tx) error) {
	var schema string
	var mu sync.Mutex
	runs := map[int64]int{}
	cfg := queue.Config{
		Queues:  map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		Backoff: fastBackoff,
		Handlers: map[string]queue.Handler{"x": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			mu.Lock()
			runs[j.ID]++
			mu.Unlock()
			if err := effect(ctx, tx, schema, j); err != nil {
				return err
			}
			if j.Attempt == 1 {
				return deallocate(ctx, tx)
			}
			return nil
		})},
	}
	if leased {
		cfg.LeasedKinds = []string{"x"}
	}
	e := newEnvOwnPool(t, 6, cfg)
	schema = e.schema
	e.run()
	// Rounds, so that each round's jobs meet the connections the last
	// round's handlers deallocated.
	var ids []int64
	for range 5 {
		jobs := make([]queue.NewJob, 8)
		for i := range jobs {
			jobs[i] = queue.NewJob{Kind: "x", MaxAttempts: 3}
		}
		ids = append(ids, e.enqueueIDs(jobs...)...)
		waitFor(t, 30*time.Second, "round done", func() bool {
			return e.count(`state = 'succeeded'`) == len(ids)
		})
	}
	require.Equal(t, len(ids), e.count(`attempts = 1`), "every job succeeded at its first attempt")
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		require.Equal(t, 1, runs[id], "job %d runs", id)
	}
	checkEventsMatchJobs(t, e.pool, e.schema)
}

// A handler that drops the prepared statements inside a function, where
// pgwake cannot see it coming, fails no other job: the jobs of its batch
// succeed once each and the queue goes on. The job itself succeeds (when
// pgwake's statements were not yet prepared on that connection) or its
// transaction is lost and, run alone again, it fails with an error that
// names the cause. The connection may still hold statements pgx believes
// prepared: each fails once, in pgwake or in the application, before pgx
// prepares it again (docs/semantics.md), so the test reads through a pool
// of its own.
func TestHandlerDeallocatingInsideAFunction(t *testing.T) {
	t.Parallel()
	var schema string
	e := newEnvOwnPool(t, 6, queue.Config{
		Queues:  map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		Backoff: fastBackoff,
		Handlers: map[string]queue.Handler{
			"x": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				return effect(ctx, tx, schema, j)
			}),
			"drop": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				if err := effect(ctx, tx, schema, j); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `SELECT `+sqlident.Quote(schema, "drop_statements")+`()`)
				return err
			}),
		},
	})
	schema = e.schema
	q := pgtest.Pool(t)
	count := func(sql string, args ...any) int {
		var n int
		require.NoError(t, q.QueryRow(context.Background(), sql, args...).Scan(&n))
		return n
	}
	_, err := q.Exec(context.Background(), `CREATE FUNCTION `+e.table("drop_statements")+`() RETURNS void LANGUAGE plpgsql AS $$
BEGIN EXECUTE 'DEALLOC' || 'ATE ALL'; END $$`)
	require.NoError(t, err)
	e.run()
	var xs []int64
	round := func(kinds ...string) []int64 {
		jobs := make([]queue.NewJob, len(kinds))
		for i, k := range kinds {
			jobs[i] = queue.NewJob{Kind: k, MaxAttempts: 2}
		}
		ids := e.enqueueIDs(jobs...)
		for i, id := range ids {
			if kinds[i] == "x" {
				xs = append(xs, id)
			}
		}
		waitFor(t, 30*time.Second, "round done", func() bool {
			return count(`SELECT count(*) FROM `+e.table("jobs")+` WHERE id = ANY($1) AND state IN ('succeeded', 'failed')`, ids) == len(ids)
		})
		return ids
	}
	// Warm: the connections have run the claim and outcome statements.
	for range 3 {
		round("x", "x", "x", "x", "x", "x", "x", "x")
	}
	var drops []int64
	for range 3 {
		ids := round("x", "x", "x", "drop", "x", "x", "x", "x")
		drops = append(drops, ids[3])
	}
	for range 5 {
		round("x", "x", "x", "x", "x", "x", "x", "x")
	}
	require.Equal(t, len(xs), count(`SELECT count(*) FROM `+e.table("jobs")+` WHERE id = ANY($1) AND state = 'succeeded'`, xs), "every other job succeeded")
	require.Equal(t, len(xs), count(`SELECT count(DISTINCT job_id) FROM `+e.table("effects")+` WHERE job_id = ANY($1)`, xs))
	require.Equal(t, len(xs), count(`SELECT count(*) FROM `+e.table("effects")+` WHERE job_id = ANY($1)`, xs), "each committed once")
	for _, id := range drops {
		var state, lastErr string
		require.NoError(t, q.QueryRow(context.Background(), `SELECT state, coalesce(last_error, '') FROM `+e.table("jobs")+` WHERE id = $1`, id).Scan(&state, &lastErr))
		require.Contains(t, []string{"succeeded", "failed"}, state)
		if state == "failed" {
			require.Contains(t, lastErr, "DEALLOCATE", "job %d", id)
		}
		t.Logf("job %d (DEALLOCATE in a function): %s %q", id, state, lastErr)
	}
	checkEventsMatchJobs(t, q, e.schema)
}
