package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/promreg"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

// Two clients on one registry share its series (by queue label); a client of
// another schema cannot join, since queue depth is read per schema.
func TestClientsShareARegistry(t *testing.T) {
	t.Parallel()
	ok := queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil })
	e := newEnv(t, queue.Config{Queues: map[string]queue.QueueConfig{"a": {}}, Handlers: map[string]queue.Handler{"k": ok}})
	other := newEnvOn(t, e.pool, e.schema, queue.Config{
		Queues: map[string]queue.QueueConfig{"b": {}}, Handlers: map[string]queue.Handler{"k": ok}, Registerer: e.reg,
	})
	ctx := context.Background()
	for _, q := range []string{"a", "a", "b"} {
		_, err := e.c.Enqueue(ctx, queue.NewJob{Queue: q, Kind: "k"})
		require.NoError(t, err)
	}
	e.run()
	other.run()
	waitFor(t, 30*time.Second, "jobs done", func() bool { return e.count(`state = 'succeeded'`) == 3 })
	// Outcomes are counted after the completion has committed.
	waitFor(t, 5*time.Second, "outcomes counted", func() bool {
		return e.metric("pgwake_worker_jobs_total", map[string]string{"outcome": "succeeded"}) >= 3
	})
	require.Equal(t, 2.0, e.metric("pgwake_worker_jobs_total", map[string]string{"queue": "a", "outcome": "succeeded"}))
	require.Equal(t, 1.0, e.metric("pgwake_worker_jobs_total", map[string]string{"queue": "b", "outcome": "succeeded"}))
	require.Equal(t, 3.0, e.metric("pgwake_queue_enqueued_total", nil))

	schema := pgtest.Schema(t)
	_, err := migrations.Up(ctx, e.pool, schema)
	require.NoError(t, err)
	_, err = queue.New(e.pool, queue.Config{Schema: schema, Registerer: e.reg})
	require.ErrorContains(t, err, "already reports queue depth for schema")
	_, err = queue.New(e.pool, queue.Config{Schema: schema, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
}

// A client made again on its registry, the first one's pool closed (a
// reconnect, a test's new client), is scraped through its own pool: the
// shared depth collector queried the first pool and every scrape failed.
func TestRegistryOutlivesTheFirstClientsPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool1 := pgtest.NewPool(t, nil)
	schema := pgtest.SchemaOn(t, pool1)
	_, err := migrations.Up(ctx, pool1, schema)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	_, err = queue.New(pool1, queue.Config{Schema: schema, Registerer: reg})
	require.NoError(t, err)
	pool1.Close()
	c2, err := queue.New(pgtest.NewPool(t, nil), queue.Config{Schema: schema, Registerer: reg})
	require.NoError(t, err)
	_, err = c2.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	_, err = reg.Gather()
	require.NoError(t, err)
	n, err := promreg.Sum(reg, "pgwake_queue_depth", "state", "available")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}
