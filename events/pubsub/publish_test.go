package pubsub_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
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
