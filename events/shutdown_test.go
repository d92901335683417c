package events_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgcluster"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

// gatedPublisher holds every Publish until gate is closed; entered is
// closed when the first one arrives.
type gatedPublisher struct {
	message.Publisher
	gate    chan struct{}
	entered chan struct{}
	once    sync.Once
}

func (g *gatedPublisher) Publish(topic string, msgs ...*message.Message) error {
	g.once.Do(func() { close(g.entered) })
	<-g.gate
	return g.Publisher.Publish(topic, msgs...)
}

// A fast shutdown of PostgreSQL waits for each walsender until its client
// has confirmed flushing all it was sent, and a stream confirms only what
// it published. A stream holding unpublished events whose slot check (the
// fence) found the server shutting down waited to check again, and held
// the shutdown with it until pg_ctl gave up (a CI run of 2026-12-03, in
// TestStreamSurvivesPostgresRestart). Now that check ends the session: the
// restart goes through, and the stream publishes every event after it.
// The publisher is let go while the server shuts down, so that its next
// batch meets the check. (A publisher stuck in one Publish call through
// the whole shutdown still holds it: nothing checks meanwhile.)
func TestStreamLetsAFastShutdownThrough(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cluster, err := pgcluster.Start(cctx, pgcluster.Options{}) // private: it is restarted
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	e := newEnvOn(t, pgtest.PoolOn(t, cluster.URL, func(c *pgxpool.Config) { c.MaxConns = 20 }))
	ps, col := channelSink(t)
	pub := &gatedPublisher{Publisher: ps, gate: make(chan struct{}), entered: make(chan struct{})}
	released := false
	release := func() {
		if !released {
			released = true
			close(pub.gate)
		}
	}
	t.Cleanup(release)
	_, stopStream := e.RunStream(e.Config(pub))
	c := e.QueueClient(1)
	_, err = c.Enqueue(ctx, queue.NewJob{Kind: "ok"})
	require.NoError(t, err)
	select {
	case <-pub.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the first event never reached the publisher")
	}
	// A second transaction the stream reads and holds, and time for the
	// fence's last check to go stale (it counts for 500 ms).
	_, err = c.Enqueue(ctx, queue.NewJob{Kind: "ok"})
	require.NoError(t, err)
	time.Sleep(700 * time.Millisecond)

	restarted := make(chan error, 1)
	go func() { restarted <- cluster.Restart(cctx, "fast") }()
	// Once the server refuses connections, let the publisher go: the
	// stream's next batch checks its slot, and the check meets the
	// shutdown.
	waitFor(t, 30*time.Second, "the server shutting down", func() bool {
		conn, err := pgx.Connect(ctx, cluster.URL)
		if err == nil {
			_ = conn.Close(ctx)
			return false
		}
		var pe *pgconn.PgError
		return errors.As(err, &pe) && pe.Code == "57P03"
	})
	release()
	select {
	case err := <-restarted:
		require.NoError(t, err, "the restart")
	case <-time.After(45 * time.Second):
		t.Fatal("the fast shutdown did not finish in 45 s: the stream holds it")
	}
	e.Pool.Reset()
	table := e.WaitDelivered(col, 60*time.Second)
	stopStream()
	require.NoError(t, ps.Close())
	<-col.Done
	checkDelivery(t, col.Snapshot(), table)
	require.Len(t, table, 2, "two enqueued events")
}
