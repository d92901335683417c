package events_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/queue"
)

// Run returns once its context is done even while the publisher's Publish
// blocks (a sink whose subscriber never acks; Watermill's Publish takes no
// context), within the stream's shutdown grace: before, it waited until the
// sink was closed, which deadlocked the natural order (stop the stream,
// then close the sink).
func TestRunReturnsWhilePublishBlocks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ps := events.NewGoChannel(nil)
	t.Cleanup(func() { _ = ps.Close() })
	sub, err := ps.Subscribe(ctx, "pgwake.events")
	require.NoError(t, err)
	var got atomic.Int64
	go func() {
		for range sub {
			got.Add(1) // never acked
		}
	}()
	s, err := events.New(e.Pool, e.Config(ps))
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx) }()
	waitFor(t, 60*time.Second, "streaming", func() bool { return s.Sessions() > 0 })
	_, err = e.QueueClient(1).Enqueue(ctx, queue.NewJob{Kind: "ok"})
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "a message out", func() bool { return got.Load() > 0 })
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return within 15 s of its stop while Publish blocked")
	}
}

// A stream with TemporarySlot named like an existing persistent slot fails
// at once with a permanent ErrSlot: before, it retried the creation for
// ever. (A temporary slot of its own previous session is still retried.)
func TestTemporarySlotNameTaken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ps := events.NewGoChannel(nil)
	t.Cleanup(func() { _ = ps.Close() })
	_, stop := e.RunStream(e.Config(ps))
	stop() // the persistent slot stays, inactive
	cfg := e.Config(ps)
	cfg.TemporarySlot = true
	s, err := events.New(e.Pool, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = s.Run(ctx)
	require.True(t, events.IsPermanent(err), "%v", err)
	require.ErrorIs(t, err, events.ErrSlot)
	require.NoError(t, ctx.Err(), "failed at once, not at the deadline")
}
