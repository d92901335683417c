package pubsub_test

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events/pubsub"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
)

// statementCounter counts the statements its pool's connections send.
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Publish is one statement (one round trip), however many groups the topic
// has: the fan-out to the groups' queues happens in SQL, group by group,
// messages in order.
func TestPublishIsOneStatement(t *testing.T) {
	t.Parallel()
	_, schema := newSchema(t)
	counter := &statementCounter{}
	pool := pgtest.PoolOn(t, pgtest.URL(), func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = counter })
	ctx := context.Background()
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema})
	for _, g := range []string{"b", "a"} {
		s := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, ConsumerGroup: g})
		require.NoError(t, s.SubscribeInitialize("fan"))
	}
	// Warm the pool's connection so that the count is the publish's own.
	require.NoError(t, pool.Ping(ctx))

	before := counter.n.Load()
	require.NoError(t, pub.Publish("fan", message.NewMessage("1", nil), message.NewMessage("2", nil), message.NewMessage("3", nil)))
	require.EqualValues(t, 1, counter.n.Load()-before, "statements sent by Publish")

	qa, err := pubsub.QueueName("fan", "a")
	require.NoError(t, err)
	qb, err := pubsub.QueueName("fan", "b")
	require.NoError(t, err)
	rows, err := pool.Query(ctx, `SELECT queue, payload->>'uuid' FROM `+sqlident.Quote(schema, "jobs")+` ORDER BY id`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var v [2]string
		return v, r.Scan(&v[0], &v[1])
	})
	require.NoError(t, err)
	require.Equal(t, [][2]string{{qa, "1"}, {qa, "2"}, {qa, "3"}, {qb, "1"}, {qb, "2"}, {qb, "3"}}, got)

	// With no group registered: the default group's queue.
	before = counter.n.Load()
	require.NoError(t, pub.Publish("lonely", message.NewMessage("x", nil)))
	require.EqualValues(t, 1, counter.n.Load()-before)
	q, err := pubsub.QueueName("lonely", "")
	require.NoError(t, err)
	require.Equal(t, 1, countJobs(t, pool, schema, "queue = $1", q))
}

// watermill_publish (migration 0018 writes the jobs itself) leaves the rows,
// events and errors that enqueue_jobs leaves for the same fanned-out input:
// both run in one transaction (one now()), then every column that differs
// between two enqueues of the same job is compared.
func TestPublishFunctionMatchesEnqueueJobs(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	ctx := context.Background()
	subs := sqlident.Quote(schema, "watermill_subscriptions")
	_, err := pool.Exec(ctx, `INSERT INTO `+subs+` (topic, consumer_group, queue) VALUES ('t', 'b', 'q.b'), ('t', 'a', 'q.a')`)
	require.NoError(t, err)
	payloads := []string{`{"n":1}`, `{"n":2}`, `{"n":3}`}
	later := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	runAfters := []*time.Time{nil, &later, nil}
	publish := `SELECT ids, queues FROM ` + sqlident.Quote(schema, "watermill_publish") + `('t', 'k', 'q.def', $1, $2, 7, $3)`
	enqueue := `SELECT ids FROM ` + sqlident.Quote(schema, "enqueue_jobs") + `($1::text[], $2::jsonb[], $3::text[], $4::timestamptz[],
		NULL, NULL, $5::integer[], NULL, $6)`
	fanned := func(queues []string) (kinds, ps, qs []string, ras []*time.Time, limits []int32) {
		for _, q := range queues {
			for i, p := range payloads {
				kinds, ps, qs, ras, limits = append(kinds, "k"), append(ps, p), append(qs, q), append(ras, runAfters[i]), append(limits, 7)
			}
		}
		return
	}

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // ends the test's transaction
	var pubIDs, encIDs []int64
	var queues []string
	require.NoError(t, tx.QueryRow(ctx, publish, payloads, runAfters, 1<<20).Scan(&pubIDs, &queues))
	require.Equal(t, []string{"q.a", "q.b"}, queues, "groups in name order")
	require.True(t, slices.IsSorted(pubIDs), "ids in output order: %v", pubIDs)
	kinds, ps, qs, ras, limits := fanned(queues)
	require.NoError(t, tx.QueryRow(ctx, enqueue, kinds, ps, qs, ras, limits, 1<<20).Scan(&encIDs))
	require.Len(t, pubIDs, 6)
	rowsOf := func(ids []int64) []string {
		rows, err := tx.Query(ctx, `SELECT row(j.queue, j.kind, j.payload, j.priority, j.run_after, j.max_attempts, j.attempts, j.state,
			j.unique_key, j.unique_scope, j.unique_hold, j.metadata, j.created_at,
			(SELECT array_agg(row(e.type, e.queue, e.kind, e.attempt, e.data)::text ORDER BY e.id) FROM `+sqlident.Quote(schema, "events")+` e
			 WHERE e.job_id = j.id))::text
			FROM `+sqlident.Quote(schema, "jobs")+` j JOIN unnest($1::bigint[]) WITH ORDINALITY AS i(id, o) ON j.id = i.id ORDER BY i.o`, ids)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	require.Equal(t, rowsOf(encIDs), rowsOf(pubIDs))
	require.NoError(t, tx.Rollback(ctx))

	// The same error, with the same ordinal: the second group's third job.
	big := []string{`{"n":1}`, `{"n":2}`, `{"n":"` + strings.Repeat("x", 20) + `"}`}
	errOf := func(sql string, args ...any) *pgconn.PgError {
		_, err := pool.Exec(ctx, sql, args...)
		var pe *pgconn.PgError
		require.ErrorAs(t, err, &pe)
		return pe
	}
	payloads = big
	kinds, ps, qs, ras, limits = fanned(queues)
	pubErr := errOf(publish, big, runAfters, 20)
	encErr := errOf(enqueue, kinds, ps, qs, ras, limits, 20)
	require.Equal(t, encErr.Code, pubErr.Code)
	require.Equal(t, encErr.Message, pubErr.Message)
	require.Equal(t, encErr.Detail, pubErr.Detail)
	require.Zero(t, countJobs(t, pool, schema, "true"), "nothing written")
}
