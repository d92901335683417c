package notify_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/notify"
)

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) { c.writes.Add(1); return c.Conn.Write(b) }

// A PingInterval of a nanosecond pinged the server without pause (6,354
// round trips in 2 s of idling), and a nanosecond PingTimeout and backoff
// reconnected without pause (79 reconnects and resyncs in 2 s). New
// refuses durations below their floors; at the floors an idle listener
// stays quiet.
func TestTinyPingIntervalDoesNotSpin(t *testing.T) {
	t.Parallel()
	cc0 := pgtest.Pool(t).Config().ConnConfig
	for _, bad := range []notify.Config{
		{ConnConfig: cc0, PingInterval: time.Nanosecond},
		{ConnConfig: cc0, PingTimeout: time.Nanosecond},
		{ConnConfig: cc0, MinBackoff: time.Nanosecond},
		{ConnConfig: cc0, MaxBackoff: time.Nanosecond},
	} {
		_, err := notify.New(bad)
		require.ErrorIs(t, err, notify.ErrInvalidConfig)
	}

	var writes atomic.Int64
	cc := cc0.Copy()
	dial := cc.DialFunc
	cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: &writes}, nil
	}
	l, err := notify.New(notify.Config{ConnConfig: cc, PingInterval: notify.MinPingInterval, PingTimeout: time.Second, // a 10 ms timeout could expire on a loaded machine and reconnect
		MinBackoff: notify.MinMinBackoff, MaxBackoff: notify.MinMinBackoff})
	require.NoError(t, err)
	var resyncs atomic.Int64
	_, err = l.Subscribe("tiny_ping", func(e notify.Event) { resyncs.Add(1) })
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	time.Sleep(2 * time.Second)
	cancel()
	require.NoError(t, <-done)
	// A ping every 10 ms at most: 200 in 2 s, plus the connection's start.
	require.Less(t, writes.Load(), int64(250), "writes to the server in 2s of idling")
	require.Less(t, resyncs.Load(), int64(5), "resyncs (one per connection)")
}
