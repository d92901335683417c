package notify_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/notify"
)

// A subscriber added to a channel another subscriber already listens on
// gets its Resync too, as Subscribe's doc says (a reader waits for it
// before reading its backlog); the first subscriber gets no second one.
// Before, only subscriptions whose channel was newly LISTENed got one.
func TestSecondSubscriberGetsItsResync(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	l, err := notify.New(notify.Config{ConnConfig: pool.Config().ConnConfig, MinBackoff: 10 * time.Millisecond})
	require.NoError(t, err)
	a := make(chan notify.Event, 10)
	b := make(chan notify.Event, 10)
	_, err = l.Subscribe("resync_second", func(e notify.Event) { a <- e })
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	recv := func(ch chan notify.Event, d time.Duration) (notify.Event, bool) {
		select {
		case e := <-ch:
			return e, true
		case <-time.After(d):
			return notify.Event{}, false
		}
	}
	ev, ok := recv(a, 10*time.Second)
	require.True(t, ok && ev.Resync, "the first subscriber's Resync")
	_, err = l.Subscribe("resync_second", func(e notify.Event) { b <- e })
	require.NoError(t, err)
	ev, ok = recv(b, 10*time.Second)
	require.True(t, ok && ev.Resync, "the second subscriber's Resync")
	_, ok = recv(a, 200*time.Millisecond)
	require.False(t, ok, "no second Resync for the first")
}
