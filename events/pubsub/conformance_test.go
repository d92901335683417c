package pubsub_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events/pubsub"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/migrations"
)

// conformance hands each test of Watermill's suite its own fresh schema: the
// constructors are called several times per test (with the same *testing.T)
// and must share it.
type conformance struct {
	pool    *pgxpool.Pool
	mu      sync.Mutex
	schemas map[string]string // test name -> schema
}

func (c *conformance) schema(t *testing.T) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.schemas[t.Name()]; ok {
		return s
	}
	s := pgtest.SchemaOn(t, c.pool)
	_, err := migrations.Up(context.Background(), c.pool, s)
	require.NoError(t, err)
	c.schemas[t.Name()] = s
	return s
}

func (c *conformance) pubSub(t *testing.T, group string) (message.Publisher, message.Subscriber) {
	schema := c.schema(t)
	pub, err := pubsub.NewPublisher(c.pool, pubsub.PublisherConfig{Schema: schema})
	require.NoError(t, err)
	sub, err := pubsub.NewSubscriber(c.pool, pubsub.SubscriberConfig{
		Schema:        schema,
		ConsumerGroup: group,
		NackBackoff:   10 * time.Millisecond,
		CloseTimeout:  100 * time.Millisecond,
	})
	require.NoError(t, err)
	// The suite does not close every pair it makes; Close is idempotent.
	t.Cleanup(func() {
		_ = pub.Close()
		_ = sub.Close()
	})
	return pub, sub
}

// TestWatermillConformance runs Watermill's Pub/Sub suite against PostgreSQL.
// It is not parallel: its reconnect test restarts the database.
func TestWatermillConformance(t *testing.T) {
	c := &conformance{schemas: map[string]string{}}
	// TestReconnect publishes from 100 goroutines at once: leave the
	// subscriber connections beyond those.
	c.pool = pgtest.NewPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 120 })

	features := tests.Features{
		ConsumerGroups:      true,
		ExactlyOnceDelivery: false, // at-least-once: a lost commit redelivers
		// Order holds for one subscriber without Nacks only: a Nacked message
		// is retried after newer ones, and subscribers of a group compete.
		GuaranteedOrder:                     false,
		GuaranteedOrderWithSingleSubscriber: false,
		Persistent:                          true,
		// A new consumer group gets messages published after it registered,
		// not the topic's history.
		NewSubscriberReceivesOldMessages: false,
		// Keeps message counts at the suite's short values (100 instead of
		// 5,000-10,000 per test); the reconnect test always uses 10,000.
		ForceShort: true,
	}
	// No RestartServiceCommand: the suite's TestReconnect is skipped. It
	// appends each published message to a slice in a goroutine of its own
	// and compares that slice, unsynchronised, with the messages received
	// once all have arrived (pubsub/tests/test_pubsub.go, v1.5.1): when
	// delivery beats that goroutine to the last append, it fails
	// (a data race under -race; "received: 10000, sent: 9999" without it,
	// in a .ci/run of 2026-12-02). TestReconnectLosesNothing runs the same
	// scenario with the publishers waited for.
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) { return c.pubSub(t, "") },
		c.pubSub,
	)
}

// TestOrderWithDefaultConfig runs the suite's order tests, which
// TestWatermillConformance skips (GuaranteedOrder is not declared: a Nack
// reorders, and a group's subscribers compete), against one subscriber
// with the default SubscriberConfig (MaxBatch included): without Nacks, one
// subscriber receives a topic's messages in publish order, one at a time.
func TestOrderWithDefaultConfig(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	c := &conformance{pool: pool, schemas: map[string]string{}}
	constructor := func(t *testing.T) (message.Publisher, message.Subscriber) {
		schema := c.schema(t)
		pub, err := pubsub.NewPublisher(pool, pubsub.PublisherConfig{Schema: schema})
		require.NoError(t, err)
		sub, err := pubsub.NewSubscriber(pool, pubsub.SubscriberConfig{Schema: schema})
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = pub.Close()
			_ = sub.Close()
		})
		return pub, sub
	}
	features := tests.Features{
		ConsumerGroups:                      true,
		GuaranteedOrder:                     true,
		GuaranteedOrderWithSingleSubscriber: true,
		Persistent:                          true,
	}
	for name, fn := range map[string]func(*testing.T, tests.TestContext, tests.PubSubConstructor){
		"PublishSubscribeInOrder": tests.TestPublishSubscribeInOrder,
		"NoAck":                   tests.TestNoAck,
	} {
		t.Run(name, func(t *testing.T) {
			fn(t, tests.TestContext{TestID: tests.NewTestID(), Features: features}, constructor)
		})
	}
}
