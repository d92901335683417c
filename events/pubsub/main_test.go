package pubsub_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgwake/pgwake/events/pubsub"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
)

func TestMain(m *testing.M) {
	code := pgtest.Run(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// newSchema migrates a fresh schema on the shared pool.
func newSchema(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	_, err := migrations.Up(context.Background(), pool, schema)
	require.NoError(t, err)
	return pool, schema
}

func newPublisher(t *testing.T, pool *pgxpool.Pool, cfg pubsub.PublisherConfig) *pubsub.Publisher {
	t.Helper()
	p, err := pubsub.NewPublisher(pool, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

func newSubscriber(t *testing.T, pool *pgxpool.Pool, cfg pubsub.SubscriberConfig) *pubsub.Subscriber {
	t.Helper()
	s, err := pubsub.NewSubscriber(pool, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// receive returns the next message or fails the test after d.
func receive(t *testing.T, ch <-chan *message.Message, d time.Duration) *message.Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		require.True(t, ok, "message channel closed")
		return m
	case <-time.After(d):
		t.Fatalf("no message within %s", d)
		return nil
	}
}

// requireNothing asserts no message arrives within d (used only where the
// absence of a delivery is the behaviour under test).
func requireNothing(t *testing.T, ch <-chan *message.Message, d time.Duration) {
	t.Helper()
	select {
	case m, ok := <-ch:
		if ok {
			t.Fatalf("unexpected message %s", m.UUID)
		}
	case <-time.After(d):
	}
}

func countJobs(t *testing.T, pool *pgxpool.Pool, schema, where string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+sqlident.Quote(schema, "jobs")+` WHERE `+where, args...).Scan(&n))
	return n
}

// waitFor is pgtest.WaitFor.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	pgtest.WaitFor(t, d, what, cond)
}

// databaseURL is where the examples connect: the test database. In your
// service this would be your own DSN, e.g. os.Getenv("DATABASE_URL").
func databaseURL() string { return pgtest.URL() }
