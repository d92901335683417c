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
// it published. A stream holding unpublished events held the shutdown
// until pg_ctl gave up (a CI run of 2026-12-03, in
// TestStreamSurvivesPostgresRestart): the slot check (the fence) its
// publisher makes before a batch found the server shutting down and
// waited to check again. Now that check ends the session ("during": the
// publisher is let go while the server shuts down, so that its next batch
// meets the check); and a publisher that publishes nothing for a second
// while it holds transactions has the reader ask the server whether it is
// shutting down ("after": the publisher is held until the restart is
// over, as by a broker that does not answer). Either way the session ends,
// the restart goes through, and every event arrives after it.
func TestStreamLetsAFastShutdownThrough(t *testing.T) {
	t.Parallel()
	for _, when := range []string{"during", "after"} {
		t.Run(when, func(t *testing.T) {
			t.Parallel()
			fastShutdownWithEventsHeld(t, when == "during")
		})
	}
}

func fastShutdownWithEventsHeld(t *testing.T, releaseDuring bool) {
	ctx := context.Background()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cluster, err := pgcluster.Start(cctx, pgcluster.Options{}) // private: it is restarted
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	e := newEnvOn(t, pgtest.PoolOn(t, cluster.URL, func(c *pgxpool.Config) { c.MaxConns = 20 }))
	ps, col := channelSink(t)
	pub := &gatedPublisher{Publisher: ps, gate: make(chan struct{}), entered: make(chan struct{})}
	release := sync.OnceFunc(func() { close(pub.gate) })
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
	if releaseDuring {
		release()
	}
	select {
	case err := <-restarted:
		require.NoError(t, err, "the restart")
	case <-time.After(45 * time.Second):
		t.Fatal("the fast shutdown did not finish in 45 s: the stream holds it")
	}
	release()
	e.Pool.Reset()
	table := e.WaitDelivered(col, 60*time.Second)
	stopStream()
	require.NoError(t, ps.Close())
	<-col.Done
	checkDelivery(t, col.Snapshot(), table)
	require.Len(t, table, 2, "two enqueued events")
}
