package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

// claimPlans are the custom and generic plans a connection built for the
// held claims (the statements that walk the priorities and lock rows, and
// claimFirst).
const claimPlans = `SELECT coalesce(sum(custom_plans), 0)::int, coalesce(sum(generic_plans), 0)::int
FROM pg_catalog.pg_prepared_statements WHERE statement LIKE '%WITH RECURSIVE%FOR UPDATE OF j SKIP LOCKED%'
	OR statement LIKE '%j.priority = (SELECT h.priority%FOR UPDATE OF j SKIP LOCKED%'`

// The held claims run their generic plan from their first call on a
// connection (no custom plan: PostgreSQL would plan the first five calls
// afresh on every connection), and the handler sees the session's
// plan_cache_mode again, here force_custom_plan.
func TestClaimsUseTheGenericPlan(t *testing.T) {
	t.Parallel()
	type seen struct {
		mode            string
		custom, generic int
	}
	got := make(chan seen, 20)
	pool := pgtest.NewPool(t, func(c *pgxpool.Config) {
		c.MaxConns = 8
		c.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	})
	e := newEnvWithPool(t, pool, queue.Config{
		Queues:       map[string]queue.QueueConfig{"gp": {MaxWorkers: 2}},
		PollInterval: time.Minute,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			var s seen
			if err := tx.QueryRow(ctx, `SELECT pg_catalog.current_setting('plan_cache_mode')`).Scan(&s.mode); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, claimPlans).Scan(&s.custom, &s.generic); err != nil {
				return err
			}
			got <- s
			return nil
		})},
	})
	e.run()
	ctx := context.Background()
	for range 12 {
		_, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", Queue: "gp"})
		require.NoError(t, err)
		select {
		case s := <-got:
			require.Equal(t, "force_custom_plan", s.mode, "the handler runs with the session's plan_cache_mode")
			require.Zero(t, s.custom, "claims planned afresh on the handler's connection")
			require.Positive(t, s.generic)
		case <-time.After(20 * time.Second):
			t.Fatal("job not run")
		}
	}
}

// Run prepares the claims and the attempt record on the pool's idle
// connections before the workers start: a connection's first claim and
// first attempt record wait for no statement description.
func TestRunPreparesTheClaimStatements(t *testing.T) {
	t.Parallel()
	e := newEnvOwnPool(t, 8, queue.Config{
		Queues:       map[string]queue.QueueConfig{"prep": {MaxWorkers: 2}},
		PollInterval: time.Minute,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			return nil
		})},
	})
	signals := queue.EnableTestSignals(e.c)
	// The warm-up's own bound (500 ms) is for production; a machine busy
	// with the parallel tests may need longer to prepare every connection.
	queue.SetWarmPoolTimeout(e.c, 30*time.Second)
	e.run()
	signals.WaitAsleep(t, "prep", 0) // the loop runs: Run's start is over
	ctx := context.Background()
	conns := e.pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	require.GreaterOrEqual(t, len(conns), 2)
	for _, c := range conns {
		var custom, generic, records int
		require.NoError(t, c.QueryRow(ctx, claimPlans).Scan(&custom, &generic))
		require.NoError(t, c.QueryRow(ctx, `SELECT count(*)::int FROM pg_catalog.pg_prepared_statements
			WHERE statement LIKE '%INSERT INTO '||$1||' (job_id%'`, e.table("attempts")).Scan(&records))
		require.Zero(t, custom)
		require.GreaterOrEqual(t, generic, 2, "claimOne and the batch claim, planned")
		require.Equal(t, 1, records, "the attempt record's statement, prepared")
	}
}

// A wake-up claims the job that woke it also when the most urgent pending
// priority holds only jobs scheduled ahead: the wake-up's claim (claimFirst,
// that priority only) finds nothing and the walk of the priorities, in the
// same transaction, finds the job. With a one-hour poll, only the wake-up
// can run it within the test's bound.
func TestWakeUpClaimsPastFutureJobsOfAMoreUrgentPriority(t *testing.T) {
	t.Parallel()
	ran := make(chan int64, 4)
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"wf": {MaxWorkers: 2}},
		PollInterval: time.Hour,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			ran <- j.ID
			return nil
		})},
	})
	ctx := context.Background()
	_, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", Queue: "wf", Priority: -5, Delay: time.Hour})
	require.NoError(t, err)
	signals := queue.EnableTestSignals(e.c)
	e.run()
	signals.WaitAsleep(t, "wf", 0)
	for round := range 3 {
		res, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", Queue: "wf", Priority: 3})
		require.NoError(t, err)
		select {
		case got := <-ran:
			require.Equal(t, res.ID, got, "round %d", round)
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the job did not run on its wake-up", round)
		}
		signals.WaitAsleep(t, "wf", round+1)
	}
}
