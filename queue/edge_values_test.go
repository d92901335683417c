package queue_test

import (
	"context"
	"encoding/json"
	"math"
	"strings"
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

// A job timeout of weeks (or none but huge) under a server
// idle_in_transaction_session_timeout: the claim's lifted timeout must be a
// value PostgreSQL accepts (at most INT_MAX ms, about 24.8 days) and must
// not wrap around for a timeout near math.MaxInt64.
func TestHugeJobTimeoutUnderServerIdleTimeout(t *testing.T) {
	for name, jt := range map[string]time.Duration{"30d": 30 * 24 * time.Hour, "maxint64": math.MaxInt64} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.NewPool(t, func(c *pgxpool.Config) {
				c.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "300ms"
				c.MaxConns = 8
			})
			schema := pgtest.Schema(t)
			_, err := migrations.Up(context.Background(), pgtest.NewPool(t, nil), schema)
			require.NoError(t, err)
			var runs atomic.Int32
			e := newEnvOn(t, pool, schema, queue.Config{
				Queues:     map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
				JobTimeout: jt,
				Handlers: map[string]queue.Handler{"slow": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
					runs.Add(1)
					if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
						return err
					}
					time.Sleep(time.Second) // idle in transaction
					_, err := tx.Exec(ctx, `SELECT 1`)
					return err
				})},
			})
			r, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "slow"})
			require.NoError(t, err)
			e.run()
			waitFor(t, 20*time.Second, "job done", func() bool { return e.count(`id = $1 AND state <> 'pending'`, r.ID) == 1 })
			require.Equal(t, 1, e.count(`id = $1 AND state = 'succeeded' AND attempts = 1`, r.ID))
			require.Equal(t, int32(1), runs.Load(), "ran once")
		})
	}
}

// Config.MaxAttempts beyond the jobs table's integer was accepted by New,
// then every enqueue that took the default failed with ErrInvalidMaxAttempts.
func TestMaxAttemptsBeyondInt32(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	_, err := queue.New(e.pool, queue.Config{Schema: e.schema, MaxAttempts: math.MaxInt32 + 1})
	require.ErrorIs(t, err, queue.ErrInvalidConfig)
	require.ErrorIs(t, err, queue.ErrInvalidMaxAttempts)
	c, err := queue.New(e.pool, queue.Config{Schema: e.schema, MaxAttempts: math.MaxInt32})
	require.NoError(t, err)
	_, err = c.Enqueue(context.Background(), queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	// A job's own value says which limit it broke.
	_, err = c.Enqueue(context.Background(), queue.NewJob{Kind: "k", MaxAttempts: math.MaxInt32 + 1})
	require.ErrorIs(t, err, queue.ErrInvalidMaxAttempts)
	require.ErrorContains(t, err, "the limit is 2147483647")
}

// read-api.md: "A bad filter returns a *queue.FilterError (with the field)
// before any SQL runs". PayloadContains that json.Valid accepts but jsonb
// refuses, and created bounds beyond PostgreSQL's (or pgx's) range, were
// SQL errors; a bound a million years back overflowed pgx's microseconds
// silently.
func TestReadFiltersJsonbAndTimeRange(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	e.enqueueIDs(queue.NewJob{Kind: "k", Payload: map[string]any{"a": 1}})
	for name, p := range map[string]queue.JobListParams{
		"nul":       {PayloadContains: json.RawMessage(`{"a":"\u0000"}`)},
		"badutf8":   {PayloadContains: json.RawMessage("{\"a\":\"\xff\"}")},
		"surrogate": {PayloadContains: json.RawMessage(`{"a":"\ud800"}`)},
		"bignum":    {PayloadContains: json.RawMessage(`{"a":1e1000000}`)},
		"year1e6":   {CreatedBefore: time.Date(1000000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"year-1e6":  {CreatedAfter: time.Date(-1000000, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		_, err := e.c.JobList(ctx, p)
		var fe *queue.FilterError
		require.ErrorAs(t, err, &fe, name)
	}
	for name, p := range map[string]queue.JobListParams{
		"match":    {PayloadContains: json.RawMessage(`{"a":1}`)},
		"year9999": {CreatedBefore: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)},
		"year1":    {CreatedAfter: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		page, err := e.c.JobList(ctx, p)
		require.NoError(t, err, name)
		require.Len(t, page.Jobs, 1, name)
	}
}

// A BatchTarget near math.MaxInt64 ("always full batches") made cutAfter,
// 2 x BatchTarget, wrap negative: every batch was cut after its first job,
// the rest released and claimed again, one claim per job.
func TestHugeBatchTargetStillBatches(t *testing.T) {
	for name, bt := range map[string]time.Duration{"1h": time.Hour, "maxint64": math.MaxInt64} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, queue.Config{
				Queues:      map[string]queue.QueueConfig{"default": {MaxWorkers: 1}},
				BatchTarget: bt,
				Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
					return nil
				})},
			})
			jobs := make([]queue.NewJob, 300)
			for i := range jobs {
				jobs[i] = queue.NewJob{Kind: "k"}
			}
			e.enqueueIDs(jobs...)
			e.run()
			waitFor(t, 30*time.Second, "all done", func() bool { return e.count(`state = 'succeeded'`) == len(jobs) })
			// Jobs claimed, counting those claimed again after a cut batch
			// released them: each once, give or take.
			claimed := e.metric("pgwake_worker_claims_total", nil)
			require.LessOrEqual(t, claimed, float64(2*len(jobs)), "jobs claimed for %d jobs", len(jobs))
		})
	}
}

// Metadata is bounded by MaxPayloadBytes as the payload is: 10 MB of it was
// stored (in the row and its enqueued event) though a payload over 1 MiB is
// refused.
func TestMetadataBoundedByThePayloadLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{MaxPayloadBytes: 1000})
	_, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "k", Metadata: map[string]string{"a": strings.Repeat("x", 1000)}})
	require.ErrorIs(t, err, queue.ErrInvalidMetadata)
	var je *queue.JobError
	require.ErrorAs(t, err, &je)
	require.Equal(t, "metadata", je.Field)
	require.Zero(t, e.count(`true`), "nothing written")
	_, err = e.c.Enqueue(context.Background(), queue.NewJob{Kind: "k", Metadata: map[string]string{"a": strings.Repeat("x", 900)}})
	require.NoError(t, err)
}
