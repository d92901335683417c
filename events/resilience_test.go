package events_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/internal/pgtest"
)

// interruptions runs the queue and a producer while interrupt breaks the
// stream's connection rounds times, then checks that every event arrived.
func interruptions(t *testing.T, e *env, rounds int, interrupt func(round int)) {
	ctx := context.Background()
	ps := events.NewGoChannel(nil)
	sub, err := ps.Subscribe(ctx, "pgwake.events")
	require.NoError(t, err)
	col := collect(t, sub)
	s, stopStream := e.RunStream(e.Config(ps))
	c := e.QueueClient(4)
	stopQueue := e.RunQueue(c)
	stopProducer := e.Produce(c)

	for round := 0; round < rounds; round++ {
		// Let some events flow in this session first.
		before := len(col.Snapshot())
		waitFor(t, 60*time.Second, "events flowing", func() bool { return len(col.Snapshot()) > before+50 })
		sessions := s.Sessions()
		interrupt(round)
		waitFor(t, 60*time.Second, "stream reconnected", func() bool { return s.Sessions() > sessions })
	}
	batches := stopProducer()
	require.Positive(t, batches)
	waitFor(t, 90*time.Second, "jobs finished", func() bool { return e.PendingJobs() == 0 })
	stopQueue()
	table := e.WaitDelivered(col, 60*time.Second)
	stopStream()
	require.NoError(t, ps.Close())
	<-col.Done
	got := col.Snapshot()
	checkDelivery(t, got, table)
	t.Logf("%d events in the table, %d deliveries over %d sessions", len(table), len(got), s.Sessions())
	mismatches, err := events.Verify(ctx, e.Pool, e.Schema)
	require.NoError(t, err)
	require.Empty(t, mismatches)
}

func TestStreamSurvivesTerminatedWalsender(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	interruptions(t, e, 3, func(int) {
		var n int
		require.NoError(t, e.Pool.QueryRow(context.Background(),
			`SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, e.Slot).Scan(&n))
		require.Equal(t, 1, n, "the walsender was running")
	})
}

// Not parallel: restarting the test binary's cluster breaks every
// connection. Parallel tests run only after the sequential ones.
func TestStreamSurvivesPostgresRestart(t *testing.T) {
	cluster := pgtest.Cluster()
	if cluster == nil {
		t.Skipf("$%s points at an external server this test cannot restart", pgtest.EnvURL)
	}
	e := newEnv(t)
	modes := []string{"fast", "immediate"}
	interruptions(t, e, len(modes), func(round int) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		require.NoError(t, cluster.Restart(ctx, modes[round]))
		e.Pool.Reset() // drop the dead connections at once
	})
}
