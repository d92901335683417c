package notify_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/notify"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func recv(t *testing.T, ch <-chan notify.Event, what string) notify.Event {
	t.Helper()
	select {
	case ev := <-ch:
		return ev
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		return notify.Event{}
	}
}

func TestFanOutReconnectResyncAndCleanStop(t *testing.T) {
	pool := pgtest.Pool(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := context.Background()
	app := "pgwake_test_notify"
	reg := prometheus.NewRegistry()
	l, err := notify.New(notify.Config{
		ConnConfig: pool.Config().ConnConfig, ApplicationName: app, Registerer: reg,
		MinBackoff: 10 * time.Millisecond, PingInterval: 200 * time.Millisecond,
	})
	require.NoError(t, err)

	a := make(chan notify.Event, 100)
	b := make(chan notify.Event, 100)
	c := make(chan notify.Event, 100)
	unA, err := l.Subscribe("chan_one", func(e notify.Event) { a <- e })
	require.NoError(t, err)
	_, err = l.Subscribe("chan_one", func(e notify.Event) { b <- e })
	require.NoError(t, err)

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Run(rctx) }()

	require.True(t, recv(t, a, "first resync").Resync)
	require.True(t, recv(t, b, "first resync").Resync)

	// A channel subscribed while connected is LISTENed on at once.
	_, err = l.Subscribe("chan_two", func(e notify.Event) { c <- e })
	require.NoError(t, err)
	require.True(t, recv(t, c, "resync for new channel").Resync)

	_, err = pool.Exec(ctx, `SELECT pg_notify('chan_one', 'hello'), pg_notify('chan_two', 'world')`)
	require.NoError(t, err)
	require.Equal(t, notify.Event{Channel: "chan_one", Payload: "hello"}, recv(t, a, "hello on a"))
	require.Equal(t, notify.Event{Channel: "chan_one", Payload: "hello"}, recv(t, b, "hello on b"))
	require.Equal(t, notify.Event{Channel: "chan_two", Payload: "world"}, recv(t, c, "world on c"))

	// Idle pings keep going without disturbing anything.
	time.Sleep(500 * time.Millisecond)
	require.Empty(t, a)

	// Kill the backend: the listener reconnects and tells everyone to resync.
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n))
	require.Equal(t, 1, n)
	require.True(t, recv(t, a, "resync after kill").Resync)
	require.True(t, recv(t, b, "resync after kill").Resync)
	require.True(t, recv(t, c, "resync after kill").Resync)
	require.Equal(t, 1.0, testutil.ToFloat64(collector(t, reg, "pgwake_notify_reconnects_total")))

	// After unsubscribing, a no longer hears chan_one; b still does.
	unA()
	_, err = pool.Exec(ctx, `SELECT pg_notify('chan_one', 'again')`)
	require.NoError(t, err)
	require.Equal(t, "again", recv(t, b, "again on b").Payload)
	select {
	case ev := <-a:
		require.True(t, ev.Resync, "unsubscribed func got %v", ev)
	default:
	}

	cancel()
	require.NoError(t, <-done)
	require.False(t, l.Connected())
}

func collector(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: "copy"}, func() float64 {
				var s float64
				for _, m := range mf.GetMetric() {
					s += m.GetCounter().GetValue()
				}
				return s
			})
		}
	}
	t.Fatalf("metric %s not found", name)
	return nil
}

func TestBadInput(t *testing.T) {
	_, err := notify.New(notify.Config{})
	require.ErrorIs(t, err, notify.ErrNilConnConfig)
	cc, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	l, err := notify.New(notify.Config{ConnConfig: cc})
	require.NoError(t, err)
	for _, ch := range []string{"", `a"b`, "a;b", "A", "x\x00", string(make([]byte, 64))} {
		_, err := l.Subscribe(ch, func(notify.Event) {})
		require.Error(t, err, "%q", ch)
	}
	_, err = l.Subscribe("ok", nil)
	require.Error(t, err)
}

// A connection ended as soon as it is made (here by a loop that
// terminates the listener's backend, as a pooler or an operator's script
// might) backs off as a refused connect does. Before, each successful
// connect reset the backoff: the listener reconnected every MinBackoff.
func TestConnectionLostAtOnceBacksOff(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	app := "pgwake_test_notify_flap"
	reg := prometheus.NewRegistry()
	l, err := notify.New(notify.Config{
		ConnConfig: pool.Config().ConnConfig, ApplicationName: app, Registerer: reg,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: time.Second,
	})
	require.NoError(t, err)
	_, err = l.Subscribe("chan_flap", func(notify.Event) {})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	killerDone := make(chan struct{})
	go func() { // end every connection of the listener as it appears
		defer close(killerDone)
		for ctx.Err() == nil {
			_, _ = pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	time.Sleep(3 * time.Second)
	cancel()
	require.NoError(t, <-done)
	<-killerDone
	// Doubling from 10 ms (jittered to half at least) to the 1 s cap takes
	// about 8 reconnects in 3 s, and under 20 with the time each connect
	// takes; at every MinBackoff it was well over 50.
	n := testutil.ToFloat64(collector(t, reg, "pgwake_notify_reconnects_total"))
	require.Greater(t, n, 0.0, "the connection was ended at least once")
	require.Less(t, n, 20.0)
}
