package events_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/internal/pgtest"
)

// A second relay on a slot that streams to another stands by (Standby,
// one log line, no reconnect storm) and takes over when the first stops:
// together they deliver every event, none lost.
func TestSecondRelayStandsByAndTakesOver(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ps1, first := channelSink(t)
	t.Cleanup(func() { _ = ps1.Close() })
	_, stop1 := e.RunStream(e.Config(ps1))
	ps2, second := channelSink(t)
	t.Cleanup(func() { _ = ps2.Close() })
	cfg2 := e.Config(ps2)
	cfg2.MaxBackoff = 300 * time.Millisecond
	s2, err := events.New(e.Pool, cfg2)
	require.NoError(t, err)
	stop2 := pgtest.RunInBackground(t, "second relay", s2.Run)
	defer stop2()
	waitFor(t, 30*time.Second, "the second relay standing by", s2.Standby)

	enqueue := func(n int) {
		for range n {
			_, err := e.Pool.Exec(ctx, `SELECT `+e.Table("enqueue")+`('k')`)
			require.NoError(t, err)
		}
	}
	enqueue(10)
	waitFor(t, 30*time.Second, "the first relay's deliveries", func() bool { return len(first.Snapshot()) >= 10 })
	time.Sleep(3 * cfg2.MaxBackoff) // a few more tries of the standby
	require.True(t, s2.Standby())
	require.Zero(t, s2.Sessions(), "the standby never streamed")
	require.Empty(t, second.Snapshot(), "the standby published nothing")

	stop1()
	enqueue(10)
	waitFor(t, 30*time.Second, "the second relay taking over", func() bool { return s2.Sessions() > 0 })
	require.False(t, s2.Standby())
	table := e.TableEvents()
	require.Len(t, table, 20)
	waitFor(t, 30*time.Second, "every event delivered by one relay or the other", func() bool {
		seen := map[int64]bool{}
		for _, r := range append(first.Snapshot(), second.Snapshot()...) {
			seen[r.Ev.ID] = true
		}
		return len(seen) == len(table)
	})
	checkDelivery(t, append(first.Snapshot(), second.Snapshot()...), table)
}

// A Topic function that panics on an event skips that event (logged,
// pgwake_events_skipped_total{reason="topic"}) and the stream goes on: it
// crashed the process, and again at every restart.
func TestTopicFunctionThatPanics(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ps, got := channelSink(t)
	t.Cleanup(func() { _ = ps.Close() })
	cfg := e.Config(ps)
	cfg.Topic = func(ev events.Event) string {
		if ev.Kind == "bad" {
			panic("topic func bug")
		}
		return "pgwake.events"
	}
	_, stop := e.RunStream(cfg)
	defer stop()
	for _, k := range []string{"ok", "bad", "ok"} {
		_, err := e.Pool.Exec(ctx, `SELECT `+e.Table("enqueue")+`($1)`, k)
		require.NoError(t, err)
	}
	waitFor(t, 30*time.Second, "the two good events", func() bool { return len(got.Snapshot()) >= 2 })
	for _, r := range got.Snapshot() {
		require.Equal(t, "ok", r.Ev.Kind)
	}
}

// The slot dropped by hand under a running stream (pgwake events drop-slot
// --terminate) stops the stream with a permanent ErrSlot naming the gap:
// it made a new slot at the current WAL position, the events committed in
// between never streamed, with nothing but an info line.
func TestSlotDroppedUnderTheStream(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ps, got := channelSink(t)
	t.Cleanup(func() { _ = ps.Close() })
	cfg := e.Config(ps)
	cfg.MinBackoff, cfg.MaxBackoff = 200*time.Millisecond, 500*time.Millisecond
	s, err := events.New(e.Pool, cfg)
	require.NoError(t, err)
	done := make(chan error, 1)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { done <- s.Run(rctx) }()
	waitFor(t, 30*time.Second, "streaming", func() bool { return s.Sessions() > 0 })
	_, err = e.Pool.Exec(ctx, `SELECT `+e.Table("enqueue")+`('k')`)
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the first event", func() bool { return len(got.Snapshot()) == 1 })
	require.NoError(t, events.DropSlot(ctx, e.Pool, e.Slot, true))
	select {
	case err := <-done:
		require.ErrorIs(t, err, events.ErrSlot)
		require.True(t, events.IsPermanent(err))
		require.Contains(t, err.Error(), "was dropped while this stream used it")
	case <-time.After(30 * time.Second):
		t.Fatal("the stream went on after its slot was dropped")
	}
}

// A publication made by hand that filters the events table's rows or
// columns is refused with a permanent ErrPublication at the start: with a
// row filter, the events it left out were never streamed while the slot
// moved past them; with a column list, Run failed at the first event as if
// the schema were not migrated.
func TestFilteredPublicationIsRefused(t *testing.T) {
	for name, spec := range map[string]string{"rows": ` WHERE (job_id % 2 = 0)`, "columns": ` (id, job_id, type)`} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			_, err := e.Pool.Exec(ctx, `CREATE PUBLICATION `+e.Pub+` FOR TABLE `+e.Table("events")+spec+` WITH (publish = 'insert')`)
			require.NoError(t, err)
			ps, _ := channelSink(t)
			t.Cleanup(func() { _ = ps.Close() })
			s, err := events.New(e.Pool, e.Config(ps))
			require.NoError(t, err)
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			err = s.Run(rctx)
			require.ErrorIs(t, err, events.ErrPublication)
			require.True(t, events.IsPermanent(err))
			require.Contains(t, err.Error(), "filters the rows or columns")
		})
	}
}
