package pubsub_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events/pubsub"
)

// With Leased, the claim commits before the message is handed out: while
// it is out, the job is running (seen from another connection) under a
// lease, the subscription holds no transaction; an Ack commits what the
// handler wrote through TxFromContext, a Nack redelivers. Without it, the
// claim is not visible until Ack.
func TestLeasedSubscriber(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.writes (uuid text)`)
	require.NoError(t, err)
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema})

	_, err = pubsub.NewSubscriber(pool, pubsub.SubscriberConfig{Leased: true, LeaseDuration: time.Millisecond})
	require.ErrorIs(t, err, pubsub.ErrInvalidConfig)

	// Sessions idle in a transaction that holds a lock on this test's jobs
	// table: a held-mode claim while its message is out. (Not by the last
	// statement's text: the claim's round trip ends with a settings
	// statement that names no table.)
	idleInTx := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT a.pid) FROM pg_stat_activity a
			JOIN pg_locks l ON l.pid = a.pid AND l.relation = to_regclass($1)
			WHERE a.state LIKE 'idle in transaction%' AND a.pid <> pg_backend_pid()`, schema+".jobs").Scan(&n))
		return n
	}

	leased := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, Leased: true, NackBackoff: -1})
	ch, err := leased.Subscribe(ctx, "long")
	require.NoError(t, err)
	require.NoError(t, pub.Publish("long", message.NewMessage("l1", nil)))

	m := receive(t, ch, wait)
	require.Equal(t, 1, countJobs(t, pool, schema, "state = 'running' AND lease_expires_at > now() AND leased_by IS NOT NULL"),
		"the claim committed before the message was handed out")
	require.Zero(t, idleInTx(), "no transaction held while the message is out")
	m.Nack()
	m = receive(t, ch, wait)
	require.Equal(t, "l1", m.UUID)
	require.Equal(t, "2", m.Metadata.Get(pubsub.AttemptKey))
	tx, ok := pubsub.TxFromContext(m.Context())
	require.True(t, ok)
	_, err = tx.Exec(m.Context(), `INSERT INTO `+schema+`.writes VALUES ($1)`, m.UUID)
	require.NoError(t, err)
	require.True(t, m.Ack())
	waitFor(t, wait, "job succeeded", func() bool { return countJobs(t, pool, schema, "state = 'succeeded'") == 1 })
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.writes`).Scan(&n))
	require.Equal(t, 1, n, "the handler's write committed with the Ack")

	// Held mode, for contrast: the message is out while its job still reads
	// pending from outside (the claim is uncommitted).
	held := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema})
	hch, err := held.Subscribe(ctx, "short")
	require.NoError(t, err)
	require.NoError(t, pub.Publish("short", message.NewMessage("h1", nil)))
	hm := receive(t, hch, wait)
	require.Equal(t, 1, countJobs(t, pool, schema, "payload->>'uuid' = 'h1' AND state = 'pending'"))
	require.Equal(t, 1, idleInTx(), "the claim transaction is held while the message is out")
	hm.Ack()
}
